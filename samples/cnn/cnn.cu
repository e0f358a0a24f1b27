/*
 * cnn.cu — the MNIST CNN sample (PyPlover Table 1 / CUDA-CNN), one portable
 * source for both targets:
 *
 *   g++  -x c++ -O2 -shared -fPIC -Iabi samples/cnn/cnn.cu   -> host bundle
 *   nvcc -x cu  -shared -Xcompiler -fPIC -Iabi samples/cnn/cnn.cu -> cuda bundle
 *
 * Network: input 28x28 -> c1: 6 filters 5x5, stride 1, + bias, sigmoid
 * (6x24x24) -> s1: one 4x4 filter, stride 4, per channel, + one bias, sigmoid
 * (6x6x6) -> f: fully connected 216 -> 10, + bias, sigmoid -> out.
 * Layer names c1/s1/f follow CUDA-CNN. The Go reference in model/ mirrors
 * every fused loop here, summation order included, so scores agree to
 * within float32 rounding of the sigmoid (under 1e-6 in the tests).
 *
 * Two chains are exported (see README.md for the measurement):
 *   fused  cnn_c1, cnn_s1, cnn_f: one launch per layer, each thread sums one
 *          output and applies bias and sigmoid. Writes every tmp float it
 *          later reads, so it needs no zero_tmp. This is plover.json's chain.
 *   split  cnn_<layer>_preact, _bias, _sigmoid: CUDA-CNN's nine launches,
 *          pre-activations scattered with atomicAdd, so tmp must start at
 *          zero (zero_tmp: true).
 * All kernels use grid-stride loops, so any grid and block compute the same
 * outputs (the split chain's atomic sums may round in another order).
 *
 * Batching (ABI 2.1): built with -DCNN_BATCH=64 the fused chain handles up
 * to 64 digits per run (PLOVER_BATCHED(64), plover-batch.json): s->items
 * digits back to back in input, their scores back to back in out, tmp laid
 * out per digit. Each entry launches grid * items blocks, so one launch per
 * layer covers every digit. The split chain is not built then.
 */
#include "plover_kernel.h"

PLOVER_BUNDLE(PLOVER_TARGET); /* "cuda" under nvcc, "host" under g++ */

#ifdef CNN_BATCH
PLOVER_BATCHED(CNN_BATCH);
#define MAX_ITEMS CNN_BATCH
#define ITEMS(s) ((int)(s)->items)
#else
#define MAX_ITEMS 1
#define ITEMS(s) 1
#endif

/* Constants (weights.bin), offsets in floats; model/model.go has the same. */
#define W_C1 0     /* [6][5][5] */
#define B_C1 150   /* [6] */
#define W_S1 156   /* [4][4] */
#define B_S1 172   /* [1] */
#define W_F 173    /* [10][216] */
#define B_F 2333   /* [10] */
#define N_WEIGHTS 2343

/* tmp, offsets in floats; a batch has MAX_ITEMS of each layer. */
#define TMP_DIGIT 3672 /* fused chain, per digit: c1 then s1 */
#define T_C1 0                          /* [items][6][24][24] */
#define T_S1 (3456 * MAX_ITEMS)         /* [items][6][6][6] */
#define T_F 3672                        /* [10], split chain only (unbatched) */
#define TMP_FUSED (TMP_DIGIT * MAX_ITEMS)
#define TMP_SPLIT 3682

#define N_IN 784
#define N_C1 3456
#define N_S1 216
#define N_OUT 10

#define GRID_STRIDE(n, count)                                  \
  for (int n = (int)(blockIdx.x * blockDim.x + threadIdx.x); \
       n < (count); n += (int)(gridDim.x * blockDim.x))

__device__ float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

/* ---- fused: one thread per output ---- */

/* Digit d's values start at d * N_<layer> in every buffer. */
__global__ void c1_fused(const float *__restrict__ in,
                         const float *__restrict__ w, float *__restrict__ c1,
                         int items) {
  GRID_STRIDE(n, N_C1 * items) {
    int d = n / N_C1, k = n % N_C1;
    int m = k / 576, y = k / 24 % 24, x = k % 24;
    const float *img = in + d * N_IN;
    const float *f = w + W_C1 + m * 25;
    float acc = 0.0f;
    for (int i = 0; i < 5; i++)
      for (int j = 0; j < 5; j++) acc += f[i * 5 + j] * img[(y + i) * 28 + x + j];
    c1[n] = sigmoid(acc + w[B_C1 + m]);
  }
}

__global__ void s1_fused(const float *__restrict__ c1,
                         const float *__restrict__ w, float *__restrict__ s1,
                         int items) {
  GRID_STRIDE(n, N_S1 * items) {
    int d = n / N_S1, k = n % N_S1;
    int c = k / 36, y = k / 6 % 6, x = k % 6;
    const float *src = c1 + d * N_C1 + c * 576 + y * 4 * 24 + x * 4;
    float acc = 0.0f;
    for (int i = 0; i < 4; i++)
      for (int j = 0; j < 4; j++) acc += w[W_S1 + i * 4 + j] * src[i * 24 + j];
    s1[n] = sigmoid(acc + w[B_S1]);
  }
}

__global__ void f_fused(const float *__restrict__ s1,
                        const float *__restrict__ w, float *__restrict__ out,
                        int items) {
  GRID_STRIDE(n, N_OUT * items) {
    int d = n / N_OUT, o = n % N_OUT;
    const float *row = w + W_F + o * N_S1;
    const float *v = s1 + d * N_S1;
    float acc = 0.0f;
    for (int k = 0; k < N_S1; k++) acc += row[k] * v[k];
    out[n] = sigmoid(acc + w[B_F + o]);
  }
}

#ifndef CNN_BATCH
/* ---- split: CUDA-CNN's pre-activation / bias / activation launches ----
 * One grid-stride index per (output, term) pair, the filter tap fastest, so
 * the host target adds each output's terms in the fused kernels' order. */

__global__ void c1_preact(const float *__restrict__ in,
                          const float *__restrict__ w, float *c1) {
  GRID_STRIDE(n, N_C1 * 25) {
    int j = n % 5, i = n / 5 % 5, o = n / 25;
    int m = o / 576, y = o / 24 % 24, x = o % 24;
    atomicAdd(&c1[o], w[W_C1 + m * 25 + i * 5 + j] * in[(y + i) * 28 + x + j]);
  }
}

__global__ void s1_preact(const float *__restrict__ c1,
                          const float *__restrict__ w, float *s1) {
  GRID_STRIDE(n, N_S1 * 16) {
    int j = n % 4, i = n / 4 % 4, o = n / 16;
    int c = o / 36, y = o / 6 % 6, x = o % 6;
    atomicAdd(&s1[o], w[W_S1 + i * 4 + j] * c1[c * 576 + (y * 4 + i) * 24 + x * 4 + j]);
  }
}

__global__ void f_preact(const float *__restrict__ s1,
                         const float *__restrict__ w, float *f) {
  GRID_STRIDE(n, N_OUT * N_S1) {
    int k = n % N_S1, o = n / N_S1;
    atomicAdd(&f[o], w[W_F + n] * s1[k]);
  }
}

/* bias[i / per] is added to v[i]: per = outputs sharing one bias. */
__global__ void add_bias(float *v, int count, const float *__restrict__ bias,
                         int per) {
  GRID_STRIDE(n, count) v[n] += bias[n / per];
}

__global__ void apply_sigmoid(const float *src, float *dst, int count) {
  GRID_STRIDE(n, count) dst[n] = sigmoid(src[n]);
}

#endif /* CNN_BATCH */

/* ---- entry points ----
 * Lengths are checked on the host side of each entry, before launching, so
 * a wrong request size or manifest fails the request instead of reading past
 * a buffer on the device. Each entry checks only the buffers it touches. */

enum { USES_INPUT = 1, WRITES_OUT = 2 };

static int buffers_ok(plover_state_t *s, size_t tmp_floats, int flags) {
  if (ITEMS(s) < 1 || ITEMS(s) > MAX_ITEMS) {
    plover_fail(s, "cnn: s->items is out of range for this build");
    return 0;
  }
  if ((flags & USES_INPUT) && s->input.len != ITEMS(s) * N_IN * sizeof(float)) {
    plover_reject(s, "cnn: input must be 784 little-endian float32 (3136 bytes) per digit");
    return 0;
  }
  if (s->constant.len < N_WEIGHTS * sizeof(float)) {
    plover_fail(s, "cnn: constants must hold 2343 float32 (weights.bin)");
    return 0;
  }
  if (s->tmp.len < tmp_floats * sizeof(float)) {
    plover_fail(s, "cnn: tmp_bytes is too small for this chain");
    return 0;
  }
  if ((flags & WRITES_OUT) && s->out.len != ITEMS(s) * N_OUT * sizeof(float)) {
    plover_fail(s, "cnn: out_bytes must be 40 (10 float32 scores) per digit");
    return 0;
  }
  return 1;
}

#define IN(s) ((const float *)(s)->input.dat)
#define W(s) ((const float *)(s)->constant.dat)
#define TMP(s) ((float *)(s)->tmp.dat)
#define OUT(s) ((float *)(s)->out.dat)

PLOVER_ENTRY(cnn_c1) {
  if (!buffers_ok(s, T_C1 + N_C1 * MAX_ITEMS, USES_INPUT)) return;
  PLOVER_LAUNCH(c1_fused, grid * ITEMS(s), block, s, IN(s), W(s), TMP(s) + T_C1, ITEMS(s));
}

PLOVER_ENTRY(cnn_s1) {
  if (!buffers_ok(s, TMP_FUSED, 0)) return;
  PLOVER_LAUNCH(s1_fused, grid * ITEMS(s), block, s, TMP(s) + T_C1, W(s), TMP(s) + T_S1, ITEMS(s));
}

PLOVER_ENTRY(cnn_f) {
  if (!buffers_ok(s, TMP_FUSED, WRITES_OUT)) return;
  PLOVER_LAUNCH(f_fused, grid * ITEMS(s), block, s, TMP(s) + T_S1, W(s), OUT(s), ITEMS(s));
}

#ifndef CNN_BATCH
PLOVER_ENTRY(cnn_c1_preact) {
  if (!buffers_ok(s, TMP_SPLIT, USES_INPUT)) return;
  PLOVER_LAUNCH(c1_preact, grid, block, s, IN(s), W(s), TMP(s) + T_C1);
}

PLOVER_ENTRY(cnn_c1_bias) {
  if (!buffers_ok(s, TMP_SPLIT, 0)) return;
  PLOVER_LAUNCH(add_bias, grid, block, s, TMP(s) + T_C1, N_C1, W(s) + B_C1, 576);
}

PLOVER_ENTRY(cnn_c1_sigmoid) {
  if (!buffers_ok(s, TMP_SPLIT, 0)) return;
  PLOVER_LAUNCH(apply_sigmoid, grid, block, s, TMP(s) + T_C1, TMP(s) + T_C1, N_C1);
}

PLOVER_ENTRY(cnn_s1_preact) {
  if (!buffers_ok(s, TMP_SPLIT, 0)) return;
  PLOVER_LAUNCH(s1_preact, grid, block, s, TMP(s) + T_C1, W(s), TMP(s) + T_S1);
}

PLOVER_ENTRY(cnn_s1_bias) {
  if (!buffers_ok(s, TMP_SPLIT, 0)) return;
  PLOVER_LAUNCH(add_bias, grid, block, s, TMP(s) + T_S1, N_S1, W(s) + B_S1, N_S1);
}

PLOVER_ENTRY(cnn_s1_sigmoid) {
  if (!buffers_ok(s, TMP_SPLIT, 0)) return;
  PLOVER_LAUNCH(apply_sigmoid, grid, block, s, TMP(s) + T_S1, TMP(s) + T_S1, N_S1);
}

PLOVER_ENTRY(cnn_f_preact) {
  if (!buffers_ok(s, TMP_SPLIT, 0)) return;
  PLOVER_LAUNCH(f_preact, grid, block, s, TMP(s) + T_S1, W(s), TMP(s) + T_F);
}

PLOVER_ENTRY(cnn_f_bias) {
  if (!buffers_ok(s, TMP_SPLIT, 0)) return;
  PLOVER_LAUNCH(add_bias, grid, block, s, TMP(s) + T_F, N_OUT, W(s) + B_F, 1);
}

PLOVER_ENTRY(cnn_f_sigmoid) {
  if (!buffers_ok(s, TMP_SPLIT, WRITES_OUT)) return;
  PLOVER_LAUNCH(apply_sigmoid, grid, block, s, TMP(s) + T_F, OUT(s), N_OUT);
}
#endif /* CNN_BATCH */
