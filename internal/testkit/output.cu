// Test kernels that print, for the tests of functions' output (kept by the
// server per function, shown by plover logs and plover run).
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "plover_kernel.h"

PLOVER_BUNDLE(PLOVER_TARGET);

__global__ void shout(int tag) {
  printf("kernel %d thread %d of %d\n", tag, (int)threadIdx.x, (int)blockDim.x);
}

static void echo_input(plover_state_t *s) {
  size_t n = s->input.len < s->out.len ? s->input.len : s->out.len;
  memcpy(s->out.dat, s->input.dat, n);
}

// say: "say: <input>" on stdout, "warn: <input>" on stderr (the input's
// first 200 bytes), then each of block threads of a kernel prints a line
// from the device; the input is echoed.
PLOVER_ENTRY(say) {
  (void)grid;
  int n = (int)(s->input.len < 200 ? s->input.len : 200);
  printf("say: %.*s\n", n, (const char *)s->input.dat);
  fprintf(stderr, "warn: %.*s\n", n, (const char *)s->input.dat);
  PLOVER_LAUNCH(shout, 1, block, s, 7);
  echo_input(s);
}

// refuse: refuses its input with the input's first 200 bytes as the
// message (a tenant's bytes in an error the server answers).
static char refusal[201];
PLOVER_ENTRY(refuse) {
  (void)grid, (void)block;
  size_t n = s->input.len < 200 ? s->input.len : 200;
  memcpy(refusal, s->input.dat, n);
  refusal[n] = 0;
  plover_reject(s, refusal);
}

// say_then_crash: a line on stdout, never flushed by the bundle, then
// SIGSEGV: line-buffered, the line reaches the server all the same.
PLOVER_ENTRY(say_then_crash) {
  (void)grid; (void)block; (void)s;
  printf("last words\n");
  raise(SIGSEGV);
}

// flood: grid lines on stdout, then one line of 10000 bytes, then
// "flood done".
PLOVER_ENTRY(flood) {
  (void)block;
  for (int i = 0; i < grid; i++) printf("flood line %d of a function that prints far too much\n", i);
  static char big[10001];
  memset(big, 'y', 10000);
  printf("%s\n", big);
  printf("flood done\n");
  echo_input(s);
}

// say_later: after grid ms, "later: <input>" on stdout (a request still
// printing when its function is deleted).
PLOVER_ENTRY(say_later) {
  (void)block;
  usleep((useconds_t)grid * 1000);
  int n = (int)(s->input.len < 200 ? s->input.len : 200);
  printf("later: %.*s\n", n, (const char *)s->input.dat);
  echo_input(s);
}

// say_then_spin: a line on stdout, then a loop that never ends.
PLOVER_ENTRY(say_then_spin) {
  (void)grid; (void)block; (void)s;
  printf("spinning\n");
  for (volatile int x = 0;; x++) {
  }
}

// long_line: grid MiB of 'z' on stdout with no newline between (one line,
// written 64 KiB at a time past stdio), then "\nlong line done\n".
PLOVER_ENTRY(long_line) {
  (void)block;
  static char chunk[65536];
  memset(chunk, 'z', sizeof chunk);
  fflush(stdout);
  for (int i = 0; i < grid * 16; i++) {
    for (size_t off = 0; off < sizeof chunk;) {
      ssize_t w = write(1, chunk + off, sizeof chunk - off);
      if (w <= 0) break;
      off += (size_t)w;
    }
  }
  static const char done[] = "\nlong line done\n";
  if (write(1, done, sizeof done - 1) < 0) {
  }
  echo_input(s);
}
