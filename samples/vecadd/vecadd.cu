// vecadd — PyPlover's first experiment: out = input + constant, float32.
// The constants file holds vector B (n floats); each request sends vector A.
// One source builds both targets (see abi/plover_kernel.h).
#include "plover_kernel.h"

PLOVER_BUNDLE(PLOVER_TARGET);

__global__ void add(const float *a, const float *b, float *c, size_t n) {
  size_t stride = (size_t)gridDim.x * blockDim.x;
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
    c[i] = a[i] + b[i];
}

// A malformed input is the client's fault (plover_reject: 422); an input
// the constants hold but out_bytes does not is the manifest's (plover_fail:
// 500).
PLOVER_ENTRY(vecadd) {
  size_t n = s->input.len / sizeof(float);
  if (s->input.len % sizeof(float) != 0) {
    plover_reject(s, "input length is not a multiple of 4 (float32)");
    return;
  }
  if (n * sizeof(float) > s->constant.len) {
    plover_reject(s, "input has more floats than the constants vector");
    return;
  }
  if (n * sizeof(float) > s->out.len) {
    plover_fail(s, "out_bytes is smaller than the input: raise it to the constants' size");
    return;
  }
  PLOVER_LAUNCH(add, grid, block, s, (const float *)s->input.dat,
                (const float *)s->constant.dat, (float *)s->out.dat, n);
  // The answer is the n floats written: no zeroed tail to send (and no
  // zero_out to pay for).
  s->out.len = n * sizeof(float);
}
