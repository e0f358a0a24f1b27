// softmax — a classifier head: a dense layer, then a row-wise softmax.
//
//   request   M rows of K_IN float32 features, 1 <= M <= MAX_ROWS
//   constants W (K_IN x N_OUT, row-major) then b (N_OUT), float32
//   response  M rows of N_OUT probabilities, float32 (out.len is lowered to
//             the M rows sent)
//
// Two kernels whose threads cooperate: dense_tiled multiplies 16x16 tiles
// staged in __shared__ memory, softmax_rows reduces each row's max and sum
// through dynamic shared memory. One source builds both targets (see
// abi/plover_kernel.h); on the host target the barriers run the blocks as
// fibers, so both compute what they compute on a GPU.
#include <math.h>

#include "plover_kernel.h"

PLOVER_BUNDLE(PLOVER_TARGET);

#define K_IN 256
#define N_OUT 128
#define MAX_ROWS 64
#define TILE 16

static_assert(K_IN % TILE == 0 && N_OUT % TILE == 0, "the dense kernel assumes whole tiles along K and N");

// Y = X W + b for M rows. Block (TILE, TILE) computes a TILE x TILE tile of
// Y, walking K a tile at a time: each thread stages one element of X and
// one of W, the block waits, each thread accumulates its dot product over
// the tile, and the block waits again before the tiles are overwritten.
__global__ void dense_tiled(const float *X, const float *W, const float *b, float *Y, int M) {
  __shared__ float Xs[TILE][TILE];
  __shared__ float Ws[TILE][TILE];
  int tx = threadIdx.x, ty = threadIdx.y;
  int row = blockIdx.y * TILE + ty, col = blockIdx.x * TILE + tx;
  float acc = 0.0f;
  for (int k0 = 0; k0 < K_IN; k0 += TILE) {
    Xs[ty][tx] = row < M ? X[row * K_IN + k0 + tx] : 0.0f;
    Ws[ty][tx] = W[(k0 + ty) * N_OUT + col];
    __syncthreads();
    for (int k = 0; k < TILE; k++) acc += Xs[ty][k] * Ws[k][tx];
    __syncthreads();
  }
  if (row < M) Y[row * N_OUT + col] = acc + b[col];
}

// P[r] = softmax(Y[r]): one block per row, blockDim.x (a power of two)
// threads striding over its N_OUT logits, and two tree reductions in shared
// memory: the row's max (so that expf cannot overflow), then the sum of
// expf(y - max).
__global__ void softmax_rows(const float *Y, float *P) {
  PLOVER_DYNAMIC_SHARED(float, red);  // blockDim.x floats
  const float *y = Y + (size_t)blockIdx.x * N_OUT;
  float *p = P + (size_t)blockIdx.x * N_OUT;
  unsigned t = threadIdx.x;

  float m = -INFINITY;
  for (unsigned j = t; j < N_OUT; j += blockDim.x) m = fmaxf(m, y[j]);
  red[t] = m;
  __syncthreads();
  for (unsigned half = blockDim.x / 2; half > 0; half /= 2) {
    if (t < half) red[t] = fmaxf(red[t], red[t + half]);
    __syncthreads();
  }
  m = red[0];
  __syncthreads();  // every thread has read the max before red is reused

  float sum = 0.0f;
  for (unsigned j = t; j < N_OUT; j += blockDim.x) sum += expf(y[j] - m);
  red[t] = sum;
  __syncthreads();
  for (unsigned half = blockDim.x / 2; half > 0; half /= 2) {
    if (t < half) red[t] += red[t + half];
    __syncthreads();
  }
  sum = red[0];

  for (unsigned j = t; j < N_OUT; j += blockDim.x) p[j] = expf(y[j] - m) / sum;
}

// Entries are host code: they read lengths and launch, nothing else.
static size_t rows_of(const plover_state_t *s) {
  if (s->input.len == 0 || s->input.len % (4 * K_IN) != 0 || s->input.len > 4 * K_IN * MAX_ROWS) return 0;
  return s->input.len / (4 * K_IN);
}

// tmp = logits. Its launch is 2D and follows from the row count; the
// manifest's grid and block are not used.
PLOVER_ENTRY(dense) {
  (void)grid, (void)block;
  size_t rows = rows_of(s);
  if (rows == 0) {
    plover_reject(s, "input must be 1 to 64 rows of 256 float32 features");
    return;
  }
  if (s->constant.len != 4 * (K_IN * N_OUT + N_OUT)) {
    plover_fail(s, "constants must be W (256x128) then b (128), float32");
    return;
  }
  if (s->tmp.len < 4 * rows * N_OUT) {
    plover_fail(s, "tmp_bytes is too small for the logits");
    return;
  }
  const float *W = (const float *)s->constant.dat;
  dim3 threads(TILE, TILE);
  dim3 blocks(N_OUT / TILE, (unsigned)((rows + TILE - 1) / TILE));
  PLOVER_LAUNCH(dense_tiled, blocks, threads, s, (const float *)s->input.dat, W, W + K_IN * N_OUT,
                (float *)s->tmp.dat, (int)rows);
}

// out = probabilities, one block of `block` threads per row.
PLOVER_ENTRY(softmax) {
  (void)grid;
  size_t rows = rows_of(s);
  if (block < 1 || block > 1024 || (block & (block - 1)) != 0) {
    plover_fail(s, "softmax: block must be a power of two from 1 to 1024");
    return;
  }
  if (rows == 0 || s->tmp.len < 4 * rows * N_OUT || s->out.len < 4 * rows * N_OUT) {
    plover_fail(s, "softmax: input, tmp_bytes or out_bytes does not fit the rows");
    return;
  }
  s->out.len = 4 * rows * N_OUT;  // the response: the rows sent, not MAX_ROWS
  PLOVER_LAUNCH_SHARED(softmax_rows, (unsigned)rows, block, block * sizeof(float), s,
                       (const float *)s->tmp.dat, (float *)s->out.dat);
}
