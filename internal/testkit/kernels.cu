// Test kernels for Plover's own tests; built with g++ for the host target.
#include <stdio.h>
#include <errno.h>
#include <string.h>
#include <time.h>

#include "plover_kernel.h"

PLOVER_BUNDLE(PLOVER_TARGET);

__global__ void copy_bytes(const uint8_t *in, uint8_t *out, size_t n) {
  size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = in[i];
}

// echo: out[0:len(input)] = input; the rest of out is zeroed.
PLOVER_ENTRY(echo) {
  memset(s->out.dat, 0, s->out.len);
  size_t n = s->input.len < s->out.len ? s->input.len : s->out.len;
  (void)grid;
  // A grid of 0 blocks is an invalid launch on a GPU (and so on the host).
  if (n) PLOVER_LAUNCH(copy_bytes, (int)((n + block - 1) / block), block, s, s->input.dat, s->out.dat, n);
}

// echo_exact: out = input, out.len lowered to the input's length: the
// response is exactly the request's body (no zeroing of the rest).
PLOVER_ENTRY(echo_exact) {
  size_t n = s->input.len < s->out.len ? s->input.len : s->out.len;
  s->out.len = n;
  if (n) PLOVER_LAUNCH(copy_bytes, (int)((n + block - 1) / block), block, s, s->input.dat, s->out.dat, n);
}

// add_one: each output byte += 1 (so echo then add_one twice gives input+2).
PLOVER_ENTRY(add_one) {
  (void)grid; (void)block;
  for (size_t i = 0; i < s->out.len; i++) s->out.dat[i] += 1;
}

// count: tmp[0..8] is a counter this request increments; out[0..8] = it.
// With zero_tmp every request sees 1; without, the count of requests the
// instance served.
PLOVER_ENTRY(count) {
  (void)grid; (void)block;
  uint64_t c;
  memcpy(&c, s->tmp.dat, sizeof c);
  c++;
  memcpy(s->tmp.dat, &c, sizeof c);
  memcpy(s->out.dat, &c, sizeof c);
}

// add_constants: out[i] = input[i] + constant[i] (bytes, wrapping).
PLOVER_ENTRY(add_constants) {
  (void)grid; (void)block;
  for (size_t i = 0; i < s->input.len && i < s->constant.len && i < s->out.len; i++)
    s->out.dat[i] = (uint8_t)(s->input.dat[i] + s->constant.dat[i]);
}

#ifdef plover_reject // the ABI 1 headers (abi1/) have no refusal
// refuse: refuses an empty input as the client's fault (plover_reject,
// ABI 2.2), with a message built on the stack; echoes otherwise.
PLOVER_ENTRY(refuse) {
  (void)grid; (void)block;
  if (s->input.len == 0) {
    char msg[64];
    snprintf(msg, sizeof msg, "input must not be empty (got %zu bytes)", s->input.len);
    plover_reject(s, msg);
    return;
  }
  size_t n = s->input.len < s->out.len ? s->input.len : s->out.len;
  memcpy(s->out.dat, s->input.dat, n);
}
#endif

// fail: reports an error through the ABI.
PLOVER_ENTRY(fail) {
  (void)grid; (void)block;
  plover_fail(s, "fail kernel was asked to fail");
}

// sleep_ms: sleeps `grid` milliseconds, to hold an instance busy. A signal
// (Go's runtime sends them to its threads) interrupts nanosleep: sleep the
// rest, or tests that count on the full time see a short run.
PLOVER_ENTRY(sleep_ms) {
  (void)block; (void)s;
  struct timespec ts = {grid / 1000, (long)(grid % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

// out_len: lowers s->out.len to grid bytes (ABI 2; an ABI 1 build's
// runtime returns all of out regardless).
PLOVER_ENTRY(out_len) {
  (void)block;
  s->out.len = (size_t)grid;
}

// A plain helper that is exported but is no kernel; harmless to call.
PLOVER_EXPORT int not_a_kernel_but_exported(void) { return 7; }
