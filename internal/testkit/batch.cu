/*
 * batch.cu — a batching test bundle (ABI 2.1, PLOVER_BATCHED(16)). Each item
 * is 8 bytes: a uint32 value and a uint32 sleep in milliseconds; its output
 * is 8 bytes: value + 1 and the run's item count. The run sleeps for the
 * largest sleep among its items (to hold an instance busy), and fails with
 * plover_fail when any value is 0xDEAD, so a test can fail a whole batch,
 * and refuses its input with plover_reject when any value is 0xBAD.
 */
#include <string.h>
#include <time.h>
#ifdef RUN_MARK
#include <stdio.h>
#endif

#include "plover.h"

PLOVER_BUNDLE("host");
PLOVER_BATCHED(16);

PLOVER_ENTRY(bitem) {
  (void)grid;
  (void)block;
  uint32_t n = s->items;
  if (n < 1 || n > 16 || s->input.len != n * 8 || s->out.len != n * 8) {
    plover_fail(s, "batch: items and lengths disagree");
    return;
  }
#ifdef RUN_MARK
  /* -DRUN_MARK='"path"': every run creates that file, so that a test sees
   * whether a chain ran at all. */
  {
    FILE *f = fopen(RUN_MARK, "w");
    if (f) fclose(f);
  }
#endif
  const uint32_t *in = (const uint32_t *)s->input.dat;
  uint32_t *out = (uint32_t *)s->out.dat;
  uint32_t ms = 0;
  for (uint32_t i = 0; i < n; i++) {
    if (in[2 * i] == 0xDEAD) {
      plover_fail(s, "batch: an item asked to fail");
      return;
    }
    if (in[2 * i] == 0xBAD) {
      plover_reject(s, "batch: an item's input is refused");
      return;
    }
    if (in[2 * i + 1] > ms) ms = in[2 * i + 1];
  }
  if (ms) {
    struct timespec ts = {(time_t)(ms / 1000), (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0) {
    }
  }
  for (uint32_t i = 0; i < n; i++) {
    out[2 * i] = in[2 * i] + 1;
    out[2 * i + 1] = n;
  }
}

#ifdef SLOW_INIT_MS
#ifdef INIT_MARK
#include <stdio.h>
#endif
/* -DSLOW_INIT_MS=n: every instance takes n ms to create; with
 * -DINIT_MARK='"path"' it first creates that file, so that a test sees an
 * instance being made. */
PLOVER_EXPORT void plover_instance_init(plover_state_t *s) {
  (void)s;
#ifdef INIT_MARK
  FILE *f = fopen(INIT_MARK, "w");
  if (f) fclose(f);
#endif
  struct timespec ts = {SLOW_INIT_MS / 1000, (SLOW_INIT_MS % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) != 0) {
  }
}
#endif

/* Hostile: writes through a NULL pointer when any item's value is 0xC0DE. */
PLOVER_ENTRY(bcrash) {
  (void)grid;
  (void)block;
  const uint32_t *in = (const uint32_t *)s->input.dat;
  for (uint32_t i = 0; i < s->items; i++)
    if (in[2 * i] == 0xC0DE) *(volatile int *)0 = 1;
}

/* Lowers out.len, which a batched run must not do. */
PLOVER_ENTRY(bshrink) {
  (void)grid;
  (void)block;
  s->out.len -= 1;
}
