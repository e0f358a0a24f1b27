// A bundle whose constructor takes SLOW_MS milliseconds (a cold load
// slower than a request's deadline), then echoes like kernels.cu.
#include <string.h>
#include <time.h>

#include "plover.h"

PLOVER_BUNDLE("host");

#ifndef SLOW_MS
#define SLOW_MS 1000
#endif

__attribute__((constructor)) static void slow_load(void) {
  struct timespec ts = {SLOW_MS / 1000, (SLOW_MS % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) != 0) {
  }
}

PLOVER_ENTRY(echo) {
  (void)grid; (void)block;
  size_t n = s->input.len < s->out.len ? s->input.len : s->out.len;
  memcpy(s->out.dat, s->input.dat, n);
  memset(s->out.dat + n, 0, s->out.len - n);
}
