/*
 * fakebundle.c — the test kernels of ../kernels.cu for the fake driver:
 * same entry points, same results, with host functions launched through
 * fakecu_launch in place of CUDA kernels. Built with gcc against
 * libfakecuda.so; see cuda_test.go.
 */
#include <fcntl.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "plover.h"

PLOVER_BUNDLE("cuda");

typedef void (*fk_kernel)(void *args, int grid, int block);
int fakecu_launch(void *stream, int grid, int block, fk_kernel fn, const void *args, size_t argsz);
int fakecu_stream_sync(void *stream);
int fakecu_memset_default(void *dst, int v, size_t n);
void fakecu_fault(int code);

/* Entry point calls, so tests can see that graph replay makes none. */
PLOVER_EXPORT long long pl_entry_calls;

typedef struct {
  uint8_t *dst;
  const uint8_t *src;
  size_t n, m;
} args_t;

static void enter(void) { __atomic_add_fetch(&pl_entry_calls, 1, __ATOMIC_RELAXED); }

static void launch(plover_state_t *s, int grid, int block, fk_kernel k, args_t a) {
  int e = fakecu_launch(s->stream, grid, block, k, &a, sizeof a);
  if (e == 9) plover_fail(s, "cudaErrorInvalidConfiguration");
  else if (e != 0) plover_fail(s, "cudaErrorLaunchFailure");
}

static void k_load(void *p, int g, int b) {
  args_t *a = p;
  (void)g, (void)b;
  for (size_t i = 0; i < a->n; i++) a->dst[i] = i < a->m ? a->src[i] : 0;
}

static void k_add(void *p, int g, int b) {
  args_t *a = p;
  (void)g, (void)b;
  if (a->m == 0) return;
  for (size_t i = 0; i < a->n; i++) a->dst[i] = (uint8_t)(a->dst[i] + a->src[i % a->m]);
}

static void k_inc(void *p, int g, int b) {
  args_t *a = p;
  (void)g, (void)b;
  for (size_t i = 0; i < a->n; i++) a->dst[i]++;
}

static void k_store(void *p, int g, int b) {
  args_t *a = p;
  (void)g, (void)b;
  for (size_t i = 0; i < a->n; i++) a->dst[i] = a->m ? a->src[i % a->m] : 0;
}

static void k_count(void *p, int g, int b) {
  args_t *a = p;
  (void)g, (void)b;
  uint32_t c;
  __builtin_memcpy(&c, a->dst, 4);
  c++;
  __builtin_memcpy(a->dst, &c, 4);
}

static void k_copy(void *p, int g, int b) {
  args_t *a = p;
  (void)g, (void)b;
  __builtin_memcpy(a->dst, a->src, a->n < a->m ? a->n : a->m);
}

static void k_fault(void *p, int g, int b) {
  (void)p, (void)g, (void)b;
  fakecu_fault(700); /* CUDA_ERROR_ILLEGAL_ADDRESS */
}

PLOVER_ENTRY(pl_load) {
  enter();
  launch(s, grid, block, k_load, (args_t){s->tmp.dat, s->input.dat, s->tmp.len, s->input.len});
}

PLOVER_ENTRY(pl_add_const) {
  enter();
  launch(s, grid, block, k_add, (args_t){s->tmp.dat, s->constant.dat, s->tmp.len, s->constant.len});
}

PLOVER_ENTRY(pl_inc) {
  enter();
  launch(s, grid, block, k_inc, (args_t){s->tmp.dat, NULL, s->tmp.len, 0});
}

PLOVER_ENTRY(pl_store) {
  enter();
  launch(s, grid, block, k_store, (args_t){s->out.dat, s->tmp.dat, s->out.len, s->tmp.len});
}

PLOVER_ENTRY(pl_count) {
  enter();
  launch(s, grid, block, k_count, (args_t){s->tmp.dat, NULL, 4, 0});
}

PLOVER_ENTRY(pl_copy) {
  enter();
  launch(s, grid, block, k_copy, (args_t){s->out.dat, s->input.dat, s->out.len, s->input.len});
}

PLOVER_ENTRY(pl_fault) {
  enter();
  (void)grid, (void)block;
  launch(s, 1, 1, k_fault, (args_t){0});
}

/* Sleeps grid milliseconds in host code, then launches k_inc: a run in
 * flight in no kernel, which a fault of another run in the process's
 * context meets at its launch (worker's tenant tests). */
PLOVER_ENTRY(pl_nap) {
  enter();
  struct timespec ts = {grid / 1000, (long)(grid % 1000) * 1000000L};
  nanosleep(&ts, NULL);
  launch(s, 1, block, k_inc, (args_t){s->tmp.dat, NULL, s->tmp.len, 0});
}

/* Holds its run in host code, launching nothing, while the file
 * $FAKEBUNDLE_HOLD exists (it creates it first; at most grid ms): a run in
 * flight, past its own launches, that a test lets go by removing the file. */
PLOVER_ENTRY(pl_hold) {
  enter();
  (void)block;
  const char *f = getenv("FAKEBUNDLE_HOLD");
  if (f == NULL) return;
  int fd = open(f, O_CREAT | O_WRONLY | O_CLOEXEC, 0600);
  if (fd >= 0) close(fd);
  struct timespec ms = {0, 1000000L};
  for (int i = 0; i < grid && access(f, F_OK) == 0; i++) nanosleep(&ms, NULL);
}

/* Host-synchronises inside the entry point, which no capture allows. */
PLOVER_ENTRY(pl_hostile) {
  enter();
  if (fakecu_stream_sync(s->stream) != 0) plover_fail(s, "cudaErrorStreamCaptureUnsupported");
  launch(s, grid, block, k_inc, (args_t){s->tmp.dat, NULL, s->tmp.len, 0});
}

/* ABI 2: lowers out.len to grid bytes (host code only, so a graph replay
 * must reproduce it without calling this). */
PLOVER_ENTRY(pl_out_len) {
  enter();
  (void)block;
  s->out.len = (size_t)grid;
}

/* Halves out.len: applied twice (say, once by a failed capture and once by
 * the direct rerun) it would show. */
PLOVER_ENTRY(pl_out_half) {
  enter();
  (void)grid, (void)block;
  s->out.len /= 2;
}

/* ABI 2 hooks: counted, and each leaves a pointer pl_hooks checks. */
PLOVER_EXPORT long long pl_hook_calls[4]; /* load, instance init, fini, unload */
static int pl_program_tag, pl_instance_tag;

PLOVER_EXPORT void plover_load(plover_state_t *s) {
  __atomic_add_fetch(&pl_hook_calls[0], 1, __ATOMIC_RELAXED);
  if (s->input.len != 0 || s->out.len != 0) plover_fail(s, "plover_load: input and out must be empty");
  s->program = &pl_program_tag;
  /* The tests' way to ask for a device fault inside plover_load: a program
   * with 15 bytes of constants; with 16, the hook then stays 300 ms in host
   * code, having made the file $FAKEBUNDLE_HOLD names (if set) once it
   * faulted. */
  if (s->constant.len == 15 || s->constant.len == 16) launch(s, 1, 1, k_fault, (args_t){0});
  /* With 17 bytes, it rewrites them with cudaMemset's legacy default
   * stream (0x5a each), work that no instance stream waits for. */
  if (s->constant.len == 17 && fakecu_memset_default(s->constant.dat, 0x5a, 17) != 0)
    plover_fail(s, "plover_load: the default-stream memset was refused");
  if (s->constant.len == 16) {
    const char *f = getenv("FAKEBUNDLE_HOLD");
    int fd = f != NULL ? open(f, O_CREAT | O_WRONLY | O_CLOEXEC, 0600) : -1;
    if (fd >= 0) close(fd);
    struct timespec ms300 = {0, 300000000L};
    nanosleep(&ms300, NULL);
  }
}

PLOVER_EXPORT void plover_instance_init(plover_state_t *s) {
  __atomic_add_fetch(&pl_hook_calls[1], 1, __ATOMIC_RELAXED);
  if (s->stream == NULL) plover_fail(s, "plover_instance_init: no stream");
  /* The tests' way to ask for a device fault inside an instance hook: an
   * instance with 13 bytes of tmp. */
  if (s->tmp.len == 13) launch(s, 1, 1, k_fault, (args_t){0});
  s->instance = &pl_instance_tag;
}

PLOVER_EXPORT void plover_instance_fini(plover_state_t *s) {
  if (s->instance == &pl_instance_tag) __atomic_add_fetch(&pl_hook_calls[2], 1, __ATOMIC_RELAXED);
  /* And inside plover_instance_fini: an instance with 14 bytes of tmp. */
  if (s->tmp.len == 14) launch(s, 1, 1, k_fault, (args_t){0});
}

PLOVER_EXPORT void plover_unload(plover_state_t *s) {
  if (s->program == &pl_program_tag) __atomic_add_fetch(&pl_hook_calls[3], 1, __ATOMIC_RELAXED);
  /* And inside plover_unload: a program with 13 bytes of constants. */
  if (s->constant.len == 13) launch(s, 1, 1, k_fault, (args_t){0});
}

PLOVER_ENTRY(pl_hooks) {
  enter();
  (void)grid, (void)block;
  if (s->program != &pl_program_tag) plover_fail(s, "s->program is not what plover_load left");
  if (s->instance != &pl_instance_tag) plover_fail(s, "s->instance is not what plover_instance_init left");
}
