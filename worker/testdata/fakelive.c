/*
 * fakelive.c — a CUDA-target test bundle for the fake driver that reports
 * what its worker's driver holds (TestCUDATenantProgramsShareAContext):
 * the primary context it runs in and how many retain it, and the driver's
 * live device allocations and bytes. Built with gcc against libfakecuda.so.
 */
#include <stdint.h>
#include <string.h>

#include "plover.h"

PLOVER_BUNDLE("cuda");

extern long long fakecu_live[8];

/* The fake driver's context: its first fields (device/testdata/fakecuda). */
struct fake_ctx {
  int dev;
  int refs;
};
int cuDevicePrimaryCtxRetain(struct fake_ctx **c, int dev);
int cuDevicePrimaryCtxRelease_v2(int dev);

/* live: out = [context address][its retains besides this one]
 * [device allocations][device bytes], i64 each. */
PLOVER_ENTRY(live) {
  (void)grid, (void)block;
  long long v[4] = {0};
  struct fake_ctx *c;
  if (cuDevicePrimaryCtxRetain(&c, 0) == 0) {
    v[0] = (long long)(uintptr_t)c;
    v[1] = c->refs - 1;
    cuDevicePrimaryCtxRelease_v2(0);
  }
  v[2] = __atomic_load_n(&fakecu_live[0], __ATOMIC_RELAXED);
  v[3] = __atomic_load_n(&fakecu_live[7], __ATOMIC_RELAXED);
  memcpy(s->out.dat, v, sizeof v < s->out.len ? sizeof v : s->out.len);
}
