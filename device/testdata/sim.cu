/*
 * sim.cu — kernels whose threads cooperate, for the host target's simulator
 * (abi/plover_kernel.h; device/sim_test.go checks every result against Go).
 * One portable source: g++ -x c++ -std=c++17 builds the host bundle, and
 *
 *   nvcc -ccbin g++-11 -x cu -shared -Xcompiler -fPIC -O3 -Iabi \
 *     -gencode arch=compute_80,code=sm_80 \
 *     -gencode arch=compute_90,code=[sm_90,compute_90] \
 *     -o sim.so device/testdata/sim.cu
 *
 * the CUDA one. Entries read only lengths, grid and block (on CUDA the
 * buffers are device memory); some decode a launch shape from grid and block.
 */
#include <limits.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "plover_kernel.h"

PLOVER_BUNDLE(PLOVER_TARGET);

/* ---- Block reduction: __shared__ and __syncthreads in a loop. ---------- */

/* part[blockIdx.x] = the sum (mod 2^32) of in[i] over the block's
 * grid-stride elements, by a tree over shared memory that works for any
 * blockDim.x. */
__global__ void reduce_sum(const unsigned *in, size_t n, unsigned *part) {
  __shared__ unsigned sh[1024];
  unsigned t = threadIdx.x;
  unsigned sum = 0;
  for (size_t i = (size_t)blockIdx.x * blockDim.x + t; i < n; i += (size_t)gridDim.x * blockDim.x)
    sum += in[i];
  sh[t] = sum;
  __syncthreads();
  for (unsigned step = 1; step < blockDim.x; step *= 2) {
    if (t % (2 * step) == 0 && t + step < blockDim.x) sh[t] += sh[t + step];
    __syncthreads();
  }
  if (t == 0) part[blockIdx.x] = sh[0];
}

/* out[0] = the total, out[1..grid] = the blocks' partial sums. */
PLOVER_ENTRY(sim_reduce) {
  if (s->input.len % 4 != 0 || s->out.len < 4 * ((size_t)grid + 1)) {
    plover_fail(s, "sim_reduce: input must be uint32s and out hold grid+1 of them");
    return;
  }
  unsigned *out = (unsigned *)s->out.dat;
  PLOVER_LAUNCH(reduce_sum, grid, block, s, (const unsigned *)s->input.dat, s->input.len / 4, out + 1);
  PLOVER_LAUNCH(reduce_sum, 1, block, s, out + 1, (size_t)grid, out);
}

/* Threads leave as soon as they are done: threads past the input at once,
 * the others after their last step of the reduction, while the rest go on
 * to the next barrier. CUDA leaves a barrier that some threads of the block
 * return without reaching undefined, so the host target reports it (with a
 * block of 1 there is nothing to report); mirrored, the threads that
 * return come before those that wait in each round. */
__global__ void early_exit(const unsigned *in, size_t n, unsigned *out, int mirror) {
  __shared__ unsigned sh[1024];
  unsigned m = n < blockDim.x ? (unsigned)n : blockDim.x;
  if (threadIdx.x >= m) return;
  /* mirrored, thread 0 is one of the first to leave and m-1 the last */
  unsigned t = mirror ? m - 1 - threadIdx.x : threadIdx.x;
  sh[t] = in[t];
  __syncthreads();
  for (unsigned step = 1; step < m; step *= 2) {
    if (t % (2 * step) != 0) return;
    if (t + step < m) sh[t] += sh[t + step];
    __syncthreads();
  }
  out[0] = sh[0];
}

/* out[0] = the sum of the first min(n, block) inputs; grid 2: mirrored. */
PLOVER_ENTRY(sim_early_exit) {
  if (s->input.len % 4 != 0 || s->input.len == 0 || s->out.len < 4) {
    plover_fail(s, "sim_early_exit: input must be uint32s and out hold one");
    return;
  }
  PLOVER_LAUNCH(early_exit, 1, block, s, (const unsigned *)s->input.dat, s->input.len / 4, (unsigned *)s->out.dat,
                grid == 2);
}

/* ---- __syncthreads_count / _and / _or. ------------------------------- */

/* Every thread writes what the three barriers returned to it. */
__global__ void votes(const unsigned *in, size_t n, unsigned *out) {
  size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  int pred = i < n && (in[i] & 1);
  int c = __syncthreads_count(pred);
  int a = __syncthreads_and(pred);
  int o = __syncthreads_or(pred);
  out[i] = (unsigned)c | (a ? 1u << 12 : 0) | (o ? 1u << 13 : 0);
}

PLOVER_ENTRY(sim_votes) {
  if (s->input.len % 4 != 0 || s->out.len < 4 * (size_t)grid * block) {
    plover_fail(s, "sim_votes: input must be uint32s and out hold grid*block of them");
    return;
  }
  PLOVER_LAUNCH(votes, grid, block, s, (const unsigned *)s->input.dat, s->input.len / 4, (unsigned *)s->out.dat);
}

/* ---- Tiled matrix multiply: dim3 grid and block, tiles in __shared__. -- */

template <int T>
__global__ void matmul_tiled(const float *A, const float *B, float *C, int M, int K, int N) {
  __shared__ float As[T][T];
  __shared__ float Bs[T][T];
  int tx = threadIdx.x, ty = threadIdx.y;
  int row = blockIdx.y * T + ty, col = blockIdx.x * T + tx;
  float acc = 0;
  for (int k0 = 0; k0 < K; k0 += T) {
    As[ty][tx] = row < M && k0 + tx < K ? A[row * K + k0 + tx] : 0.0f;
    Bs[ty][tx] = k0 + ty < K && col < N ? B[(k0 + ty) * N + col] : 0.0f;
    __syncthreads();
    for (int k = 0; k < T; k++) acc += As[ty][k] * Bs[k][tx];
    __syncthreads();
  }
  if (row < M && col < N) C[row * N + col] = acc;
}

template <int T>
static void launch_matmul(plover_state_t *s, const float *A, const float *B, float *C, int M, int K, int N) {
  dim3 blk(T, T);
  dim3 grd((N + T - 1) / T, (M + T - 1) / T);
  PLOVER_LAUNCH(matmul_tiled<T>, grd, blk, s, A, B, C, M, K, N);
}

/* grid = M | K << 10 | N << 20; block = the tile side (8, 16 or 32).
 * input = A (M x K) then B (K x N), float32 row-major; out = C (M x N). */
PLOVER_ENTRY(sim_matmul) {
  int M = grid & 1023, K = (grid >> 10) & 1023, N = (grid >> 20) & 1023;
  if (s->input.len != 4 * ((size_t)M * K + (size_t)K * N) || s->out.len < 4 * (size_t)M * N) {
    plover_fail(s, "sim_matmul: input must be A and B, out hold C");
    return;
  }
  const float *A = (const float *)s->input.dat, *B = A + (size_t)M * K;
  float *C = (float *)s->out.dat;
  switch (block) {
    case 8: launch_matmul<8>(s, A, B, C, M, K, N); break;
    case 16: launch_matmul<16>(s, A, B, C, M, K, N); break;
    case 32: launch_matmul<32>(s, A, B, C, M, K, N); break;
    default: plover_fail(s, "sim_matmul: block (the tile side) must be 8, 16 or 32");
  }
}

/* ---- Atomics, checking what they return. ------------------------------ */

/* Word offsets in out (sim_test.go has the same). */
#define AT_HIST 0     /* [256] atomicAdd(int) histogram of the input bytes */
#define AT_CLAIM 256  /* [256] atomicCAS(0 -> i+1): the first claimant of each byte value */
#define AT_COUNT 512  /* atomicAdd(unsigned) ticket counter */
#define AT_IMAX 513   /* atomicMax(int) of v-128 */
#define AT_IMIN 514   /* atomicMin(int) of v-128 */
#define AT_UMAX 515   /* atomicMax(unsigned) of v*100000+i */
#define AT_FMAX 516   /* float max by an atomicCAS loop, of v*0.5-17.25 */
#define AT_FSUM 517   /* atomicAdd(float) of v */
#define AT_DSUM 518   /* [2] atomicAdd(double) of v*0.25 */
#define AT_USUM 520   /* [2] atomicAdd(unsigned long long) of v<<33 */
#define AT_HEAD 522   /* atomicExch(unsigned): a list of i+1 through NEXT */
#define AT_DOWN 523   /* atomicSub(int) of v */
#define AT_WRAP 524   /* atomicInc(unsigned, 9) once per element */
#define AT_XOR 525    /* atomicXor of v*0x01010101 */
#define AT_OR 526     /* atomicOr of 1 << v%32 */
#define AT_AND 527    /* atomicAnd of ~(1 << v%31), from all ones */
#define AT_WINNERS 528 /* atomicAdd by each thread whose atomicCAS claimed */
#define AT_SLOTS 532  /* [n] slots[ticket] = i; then [n] next[i] = atomicExch's return */

__device__ float float_max(float *addr, float v) {
  int *a = (int *)addr;
  int old = *a;
  while (v > __int_as_float(old)) {
    int prev = atomicCAS(a, old, __float_as_int(v));
    if (prev == old) break;
    old = prev;
  }
  return __int_as_float(old);
}

__global__ void atomics_init(unsigned *w, size_t words) {
  for (size_t i = threadIdx.x; i < words; i += blockDim.x) w[i] = 0;
  __syncthreads();
  if (threadIdx.x == 0) {
    w[AT_IMAX] = (unsigned)INT_MIN;
    w[AT_IMIN] = (unsigned)INT_MAX;
    w[AT_FMAX] = __float_as_uint(-INFINITY);
    w[AT_AND] = 0xffffffffu;
  }
}

__global__ void atomics(const unsigned char *in, size_t n, unsigned *w) {
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    unsigned v = in[i];
    atomicAdd((int *)&w[AT_HIST + v], 1);
    if (atomicCAS(&w[AT_CLAIM + v], 0u, (unsigned)i + 1) == 0) atomicAdd(&w[AT_WINNERS], 1u);
    unsigned ticket = atomicAdd(&w[AT_COUNT], 1u);
    w[AT_SLOTS + ticket] = (unsigned)i;
    atomicMax((int *)&w[AT_IMAX], (int)v - 128);
    atomicMin((int *)&w[AT_IMIN], (int)v - 128);
    atomicMax(&w[AT_UMAX], v * 100000u + (unsigned)i);
    float_max((float *)&w[AT_FMAX], (float)v * 0.5f - 17.25f);
    atomicAdd((float *)&w[AT_FSUM], (float)v);
    atomicAdd((double *)&w[AT_DSUM], v * 0.25);
    atomicAdd((unsigned long long *)&w[AT_USUM], (unsigned long long)v << 33);
    w[AT_SLOTS + n + i] = atomicExch(&w[AT_HEAD], (unsigned)i + 1);
    atomicSub((int *)&w[AT_DOWN], (int)v);
    atomicInc(&w[AT_WRAP], 9u);
    atomicXor(&w[AT_XOR], v * 0x01010101u);
    atomicOr(&w[AT_OR], 1u << (v % 32));
    atomicAnd(&w[AT_AND], ~(1u << (v % 31)));
  }
}

PLOVER_ENTRY(sim_atomics) {
  size_t n = s->input.len, words = AT_SLOTS + 2 * n;
  if (s->out.len < 4 * words) {
    plover_fail(s, "sim_atomics: out must hold 532 + 2n words");
    return;
  }
  unsigned *w = (unsigned *)s->out.dat;
  PLOVER_LAUNCH(atomics_init, 1, block, s, w, words);
  PLOVER_LAUNCH(atomics, grid, block, s, (const unsigned char *)s->input.dat, n, w);
}

/* ---- Dynamic shared memory, two kernels with two types. ---------------- */

/* Reverses each block's chunk of in through shared memory. */
__global__ void dyn_reverse(const int *in, int *out, size_t n) {
  PLOVER_DYNAMIC_SHARED(int, sh);
  size_t base = (size_t)blockIdx.x * blockDim.x;
  unsigned t = threadIdx.x;
  unsigned chunk = n - base < blockDim.x ? (unsigned)(n - base) : blockDim.x;
  if (t < chunk) sh[t] = in[base + t];
  __syncthreads();
  if (t < chunk) out[base + t] = sh[chunk - 1 - t];
}

/* sums[b] = the sum of in[i]*0.5 over block b's chunk, in order, by thread 0. */
__global__ void dyn_sums(const int *in, double *sums, size_t n) {
  PLOVER_DYNAMIC_SHARED(double, dsh);
  size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  dsh[threadIdx.x] = i < n ? in[i] * 0.5 : 0.0;
  __syncthreads();
  if (threadIdx.x == 0) {
    double sum = 0;
    for (unsigned t = 0; t < blockDim.x; t++) sum += dsh[t];
    sums[blockIdx.x] = sum;
  }
}

/* One element per thread (grid = ceil(n/block)); out = sums (double[grid])
 * then the reversed chunks (int[n]). */
PLOVER_ENTRY(sim_dynshared) {
  (void)grid;
  size_t n = s->input.len / 4;
  if (n == 0 || block <= 0) return;
  size_t nb = (n + block - 1) / block;
  if (s->input.len % 4 != 0 || s->out.len < 8 * nb + 4 * n) {
    plover_fail(s, "sim_dynshared: input must be int32s, out hold the sums and the ints");
    return;
  }
  double *sums = (double *)s->out.dat;
  int *rev = (int *)(s->out.dat + 8 * nb);
  PLOVER_LAUNCH_SHARED(dyn_reverse, (unsigned)nb, block, block * sizeof(int), s, (const int *)s->input.dat, rev, n);
  PLOVER_LAUNCH_SHARED(dyn_sums, (unsigned)nb, block, block * sizeof(double), s, (const int *)s->input.dat, sums, n);
}

/* 64 KiB of dynamic shared memory: more than a GPU grants by default. */
PLOVER_ENTRY(sim_dyn_too_big) {
  (void)grid;
  PLOVER_LAUNCH_SHARED(dyn_reverse, 1, block, 64 * 1024, s, (const int *)s->input.dat, (int *)s->out.dat, (size_t)0);
}

/* Writes n bytes of dynamic shared memory, however much the launch asked
 * for: past its end when n is more. */
__global__ void dyn_fill(size_t n) {
  PLOVER_DYNAMIC_SHARED(unsigned char, sh);
  if (threadIdx.x == 0)
    for (size_t i = 0; i < n; i++) sh[i] = (unsigned char)i;
}

/* A launch with 16 KiB of dynamic shared memory, then one with 64 bytes
 * that writes 4 KiB of it: an overrun (on a GPU an illegal access). */
PLOVER_ENTRY(sim_dyn_overrun) {
  (void)grid;
  PLOVER_LAUNCH_SHARED(dyn_fill, 1, block, 16 * 1024, s, (size_t)16 * 1024);
  PLOVER_LAUNCH_SHARED(dyn_fill, 1, block, 64, s, (size_t)4096);
}

/* ---- 3D launches. ------------------------------------------------------ */

/* Each thread writes a record of 9 words at its linear index in the grid:
 * threadIdx, blockIdx, blockDim and gridDim (packed), and with sync the
 * value its mirror thread in the block left in shared memory. */
__global__ void grid3d(unsigned *out, int sync) {
  __shared__ unsigned sh[1024];
  unsigned nthr = blockDim.x * blockDim.y * blockDim.z;
  unsigned lin = (threadIdx.z * blockDim.y + threadIdx.y) * blockDim.x + threadIdx.x;
  unsigned blk = (blockIdx.z * gridDim.y + blockIdx.y) * gridDim.x + blockIdx.x;
  unsigned *r = out + 9 * ((size_t)blk * nthr + lin);
  r[0] = threadIdx.x;
  r[1] = threadIdx.y;
  r[2] = threadIdx.z;
  r[3] = blockIdx.x;
  r[4] = blockIdx.y;
  r[5] = blockIdx.z;
  r[6] = blockDim.x | blockDim.y << 11 | blockDim.z << 22;
  r[7] = gridDim.x | gridDim.y << 8 | gridDim.z << 16;
  if (sync) {
    sh[lin] = blk * 1024 + lin;
    __syncthreads();
    r[8] = sh[nthr - 1 - lin];
  } else {
    r[8] = 0xffffffffu;
  }
}

/* grid = gx | gy << 8 | gz << 16, block = bx | by << 11 | bz << 22. */
static void launch_grid3d(plover_state_t *s, int grid, int block, int sync) {
  dim3 g(grid & 255, (grid >> 8) & 255, (grid >> 16) & 255);
  dim3 b(block & 2047, (block >> 11) & 2047, (block >> 22) & 127);
  if (s->out.len < 36 * (size_t)g.x * g.y * g.z * b.x * b.y * b.z) {
    plover_fail(s, "sim_grid3d: out must hold 9 words per thread");
    return;
  }
  PLOVER_LAUNCH(grid3d, g, b, s, (unsigned *)s->out.dat, sync);
}

PLOVER_ENTRY(sim_grid3d) { launch_grid3d(s, grid, block, 0); }
PLOVER_ENTRY(sim_grid3d_sync) { launch_grid3d(s, grid, block, 1); }

/* 32 x 32 x 2 = 2048 threads: an invalid configuration. */
PLOVER_ENTRY(sim_bad_launch) {
  (void)grid, (void)block;
  dim3 b(32, 32, 2);
  PLOVER_LAUNCH(grid3d, 1, b, s, (unsigned *)s->out.dat, 0);
}

/* ---- Barrier divergence: thread 0 skips the barrier the others reach. -- */

__global__ void diverge(unsigned *out) {
  if (threadIdx.x != 0) __syncthreads();
  out[blockIdx.x * blockDim.x + threadIdx.x] = 1;
}

PLOVER_ENTRY(sim_diverge) {
  if (s->out.len < 4 * (size_t)grid * block) {
    plover_fail(s, "sim_diverge: out must hold grid*block words");
    return;
  }
  PLOVER_LAUNCH(diverge, grid, block, s, (unsigned *)s->out.dat);
}

/* ---- Conditional barriers: shape 0 (grid 1), threads 32 and up skip the
 * barrier; shape 1 (grid 2), threads 16 and up reach another. One block. */

__global__ void cond_barrier(unsigned *out, int shape) {
  unsigned t = threadIdx.x;
  if (shape == 0) {
    if (t < 32) __syncthreads(); /* site: skipped */
  } else if (t < 16) {
    __syncthreads(); /* site: first */
  } else {
    __syncthreads(); /* site: second */
  }
  out[t] = 1;
}

PLOVER_ENTRY(sim_cond_barrier) {
  if (s->out.len < 4 * (size_t)block) {
    plover_fail(s, "sim_cond_barrier: out must hold block words");
    return;
  }
  PLOVER_LAUNCH(cond_barrier, 1, block, s, (unsigned *)s->out.dat, grid == 2);
}

/* ---- Stack depth: thread 1 recurses `grid` levels of 1 KiB. -----------
 * (Thread 0 runs on the launching thread's stack; thread 1, in a block that
 * reaches a barrier, on a fiber stack of PLOVER_FIBER_STACK_BYTES.) */

__device__ __noinline__ unsigned deep(unsigned depth, volatile unsigned char *parent) {
  volatile unsigned char buf[1024];
  for (int i = 0; i < 1024; i += 64) buf[i] = (unsigned char)depth;
  if (parent) parent[0] = parent[0] + 1;
  if (depth == 0) return buf[0];
  unsigned r = deep(depth - 1, buf);
  return r + buf[0];
}

__global__ void deep_kernel(unsigned depth, unsigned *out) {
  __syncthreads();
  unsigned r = threadIdx.x == 1 ? deep(depth, 0) : 0;
  if (threadIdx.x == 1) out[0] = r;
}

PLOVER_ENTRY(sim_deep) { PLOVER_LAUNCH(deep_kernel, 1, block, s, (unsigned)grid, (unsigned *)s->out.dat); }

/* ---- The fast path, for BenchmarkSim: one element per thread. ---------- */

__global__ void vec_nosync(const float *in, float *out, size_t n) {
  size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = in[i] * 2.0f + 1.0f;
}

__global__ void vec_sync(const float *in, float *out, size_t n) {
  size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = in[i] * 2.0f + 1.0f;
  __syncthreads();
}

/* Eight barriers: the cost of each one beyond the first. */
__global__ void vec_sync8(const float *in, float *out, size_t n) {
  size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  float v = i < n ? in[i] : 0.0f;
  for (int k = 0; k < 8; k++) {
    v = v * 2.0f + 1.0f;
    __syncthreads();
    v = (v - 1.0f) * 0.5f;
  }
  if (i < n) out[i] = v * 2.0f + 1.0f;
}

#define VEC_CHECK(name)                                                            \
  if (s->input.len % 4 != 0 || s->out.len < s->input.len) {                        \
    plover_fail(s, name ": input must be float32s and out as long");               \
    return;                                                                        \
  }

PLOVER_ENTRY(sim_vec_nosync) {
  VEC_CHECK("sim_vec_nosync");
  PLOVER_LAUNCH(vec_nosync, grid, block, s, (const float *)s->input.dat, (float *)s->out.dat, s->input.len / 4);
}

PLOVER_ENTRY(sim_vec_sync) {
  VEC_CHECK("sim_vec_sync");
  PLOVER_LAUNCH(vec_sync, grid, block, s, (const float *)s->input.dat, (float *)s->out.dat, s->input.len / 4);
}

PLOVER_ENTRY(sim_vec_sync8) {
  VEC_CHECK("sim_vec_sync8");
  PLOVER_LAUNCH(vec_sync8, grid, block, s, (const float *)s->input.dat, (float *)s->out.dat, s->input.len / 4);
}

/* The launch loop of the ABI 1 host target (all threads called serially),
 * as the benchmark's baseline. */
PLOVER_ENTRY(sim_vec_serial) {
  VEC_CHECK("sim_vec_serial");
  const float *in = (const float *)s->input.dat;
  float *out = (float *)s->out.dat;
  size_t n = s->input.len / 4;
#ifdef __CUDACC__
  PLOVER_LAUNCH(vec_nosync, grid, block, s, in, out, n);
#else
  gridDim = dim3(grid);
  blockDim = dim3(block);
  threadIdx.y = threadIdx.z = blockIdx.y = blockIdx.z = 0;
  for (blockIdx.x = 0; blockIdx.x < gridDim.x; blockIdx.x++)
    for (threadIdx.x = 0; threadIdx.x < blockDim.x; threadIdx.x++) vec_nosync(in, out, n);
#endif
}
