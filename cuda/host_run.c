#include "host_run.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

static int64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* 256-byte alignment matches cudaMalloc, so kernels that rely on it behave
 * the same on both targets. Zero-sized buffers still get a valid pointer. */
void *plover_host_alloc(size_t n) {
  void *p = NULL;
  if (posix_memalign(&p, 256, n ? n : 1) != 0) return NULL;
  memset(p, 0, n ? n : 1);
  return p;
}

const char *plover_host_run(plover_state_t *st, const void *in, size_t in_len,
                            void *out, size_t out_len, size_t tmp_len,
                            int zero, const plover_step_t *steps, int n,
                            void *last_error, plover_timing_t *t) {
  int64_t t0 = now_ns();
  if (in_len) memcpy(st->input.dat, in, in_len);
  st->input.len = in_len;
  st->tmp.len = tmp_len;
  st->out.len = out_len;
  if ((zero & PLOVER_ZERO_TMP) && tmp_len) memset(st->tmp.dat, 0, tmp_len);
  if ((zero & PLOVER_ZERO_OUT) && out_len) memset(st->out.dat, 0, out_len);
  int64_t t1 = now_ns();
  for (int i = 0; i < n; i++)
    ((plover_entry_fn)steps[i].fn)(st, steps[i].grid, steps[i].block);
  const char *err = NULL;
  if (last_error) err = ((plover_last_error_fn)last_error)();
  int64_t t2 = now_ns();
  if (!err && out_len) memcpy(out, st->out.dat, out_len);
  int64_t t3 = now_ns();
  t->copy_in_ns = t1 - t0;
  t->kernels_ns = t2 - t1;
  t->copy_out_ns = t3 - t2;
  return err;
}
