// spin — a compute-bound function of small bodies, the neighbour in the
// device-sharing benchmark (make bench-fair): each thread mixes its 32-bit
// word of the input SPIN_ROUNDS times (xorshift32) and writes the result.
// About 2 ms a request on one core of the host device; one source builds
// both targets (see abi/plover_kernel.h).
#include "plover_kernel.h"

#ifndef SPIN_ROUNDS
#define SPIN_ROUNDS 5000
#endif

PLOVER_BUNDLE(PLOVER_TARGET);

__global__ void mix(const uint32_t *in, uint32_t *out, size_t n) {
  size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  uint32_t x = in[i] | 1u;  // xorshift32 has no zero state
  for (int r = 0; r < SPIN_ROUNDS; r++) {
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
  }
  out[i] = x;
}

PLOVER_ENTRY(spin) {
  size_t n = s->input.len / sizeof(uint32_t);
  if (s->input.len % sizeof(uint32_t) != 0) {
    plover_reject(s, "input must be whole 32-bit words");  // the client's fault: 422
    return;
  }
  if (n * sizeof(uint32_t) > s->out.len) {
    plover_fail(s, "out_bytes is smaller than the input: raise it to max_input_bytes");
    return;
  }
  int blocks = (int)((n + (size_t)block - 1) / (size_t)block);
  PLOVER_LAUNCH(mix, blocks > grid ? blocks : grid, block, s, (const uint32_t *)s->input.dat,
                (uint32_t *)s->out.dat, n);
}
