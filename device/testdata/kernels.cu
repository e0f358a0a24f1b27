/*
 * kernels.cu — test kernels for the CUDA device (cuda_test.go). Build:
 *
 *   nvcc -x cu -shared -Xcompiler -fPIC -O3 -Iabi \
 *     -gencode arch=compute_80,code=sm_80 \
 *     -gencode arch=compute_90,code=[sm_90,compute_90] \
 *     -o testkernels.so device/testdata/kernels.cu
 *
 * fakecuda/fakebundle.c has the same entry points with the same results for
 * the fake driver. Every kernel uses a grid-stride loop, so any launch size
 * gives the same bytes.
 */
#include <stddef.h>
#include <stdint.h>

#include "plover_kernel.h"

PLOVER_BUNDLE("cuda");

/* Entry point calls, so tests can see that graph replay makes none. (The
 * block form: `extern "C" T x = 0;` draws a warning from the host compiler.) */
extern "C" {
__attribute__((visibility("default"))) long long pl_entry_calls = 0;
}

static void enter(void) { __atomic_add_fetch(&pl_entry_calls, 1, __ATOMIC_RELAXED); }

#define FOR_EACH(i, n)                                                     \
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < (n); \
       i += (size_t)gridDim.x * blockDim.x)

__global__ void k_load(uint8_t *tmp, size_t n, const uint8_t *in, size_t m) {
  FOR_EACH(i, n) tmp[i] = i < m ? in[i] : 0;
}

__global__ void k_add(uint8_t *tmp, size_t n, const uint8_t *c, size_t m) {
  if (m == 0) return;
  FOR_EACH(i, n) tmp[i] = (uint8_t)(tmp[i] + c[i % m]);
}

__global__ void k_inc(uint8_t *tmp, size_t n) {
  FOR_EACH(i, n) tmp[i]++;
}

__global__ void k_store(uint8_t *out, size_t n, const uint8_t *tmp, size_t m) {
  FOR_EACH(i, n) out[i] = m ? tmp[i % m] : 0;
}

/* One thread adds one: without zero_tmp the count survives between requests. */
__global__ void k_count(uint32_t *c) {
  if (blockIdx.x == 0 && threadIdx.x == 0) *c += 1;
}

__global__ void k_copy(uint8_t *out, const uint8_t *in, size_t n) {
  FOR_EACH(i, n) out[i] = in[i];
}

__global__ void k_fault(int *p) { *p = 1; }

PLOVER_ENTRY(pl_load) {
  enter();
  PLOVER_LAUNCH(k_load, grid, block, s, s->tmp.dat, s->tmp.len, s->input.dat, s->input.len);
}

PLOVER_ENTRY(pl_add_const) {
  enter();
  PLOVER_LAUNCH(k_add, grid, block, s, s->tmp.dat, s->tmp.len, s->constant.dat, s->constant.len);
}

PLOVER_ENTRY(pl_inc) {
  enter();
  PLOVER_LAUNCH(k_inc, grid, block, s, s->tmp.dat, s->tmp.len);
}

PLOVER_ENTRY(pl_store) {
  enter();
  PLOVER_LAUNCH(k_store, grid, block, s, s->out.dat, s->out.len, s->tmp.dat, s->tmp.len);
}

PLOVER_ENTRY(pl_count) {
  enter();
  PLOVER_LAUNCH(k_count, grid, block, s, (uint32_t *)s->tmp.dat);
}

PLOVER_ENTRY(pl_copy) {
  enter();
  size_t n = s->out.len < s->input.len ? s->out.len : s->input.len;
  PLOVER_LAUNCH(k_copy, grid, block, s, s->out.dat, s->input.dat, n);
}

/* A store through a null pointer: CUDA_ERROR_ILLEGAL_ADDRESS, sticky. */
PLOVER_ENTRY(pl_fault) {
  enter();
  (void)grid, (void)block;
  PLOVER_LAUNCH(k_fault, 1, 1, s, (int *)NULL);
}

/* Host-synchronises inside the entry point, which no stream capture allows:
 * exercises the fall back to direct launches. */
PLOVER_ENTRY(pl_hostile) {
  enter();
  cudaStreamSynchronize((cudaStream_t)s->stream);
  PLOVER_LAUNCH(k_inc, grid, block, s, s->tmp.dat, s->tmp.len);
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
/* load, instance init, fini, unload */
extern "C" {
__attribute__((visibility("default"))) long long pl_hook_calls[4] = {0, 0, 0, 0};
}
static int pl_program_tag, pl_instance_tag;

PLOVER_EXPORT void plover_load(plover_state_t *s) {
  __atomic_add_fetch(&pl_hook_calls[0], 1, __ATOMIC_RELAXED);
  if (s->input.len != 0 || s->out.len != 0) plover_fail(s, "plover_load: input and out must be empty");
  s->program = &pl_program_tag;
  /* With 17 bytes of constants it rewrites them (0x5a each) with cudaMemset,
   * on the legacy default stream, which no instance stream waits for: the
   * first request must see them written (testHookDefaultStream). */
  if (s->constant.len == 17 && cudaMemset(s->constant.dat, 0x5a, 17) != cudaSuccess)
    plover_fail(s, "plover_load: cudaMemset failed");
}

PLOVER_EXPORT void plover_instance_init(plover_state_t *s) {
  __atomic_add_fetch(&pl_hook_calls[1], 1, __ATOMIC_RELAXED);
  if (s->stream == NULL) plover_fail(s, "plover_instance_init: no stream");
  s->instance = &pl_instance_tag;
}

PLOVER_EXPORT void plover_instance_fini(plover_state_t *s) {
  if (s->instance == &pl_instance_tag) __atomic_add_fetch(&pl_hook_calls[2], 1, __ATOMIC_RELAXED);
}

PLOVER_EXPORT void plover_unload(plover_state_t *s) {
  if (s->program == &pl_program_tag) __atomic_add_fetch(&pl_hook_calls[3], 1, __ATOMIC_RELAXED);
}

PLOVER_ENTRY(pl_hooks) {
  enter();
  (void)grid, (void)block;
  if (s->program != &pl_program_tag) plover_fail(s, "s->program is not what plover_load left");
  if (s->instance != &pl_instance_tag) plover_fail(s, "s->instance is not what plover_instance_init left");
}
