/*
 * top1.cu — digits-top1, the last step of the digits pipeline: the cnn
 * sample's 10 float32 sigmoid scores become the prediction, 8 bytes:
 *
 *   offset 0  int32   label: index of the highest score, lowest on ties
 *   offset 4  float32 score: that score, bit for bit
 *
 * both little-endian (every target Plover runs on is little-endian).
 *
 *   g++ -x c++ -std=c++17 -O2 -shared -fPIC -Iabi top1.cu -> host bundle
 */
#include "plover_kernel.h"

PLOVER_BUNDLE(PLOVER_TARGET);

#define N_SCORES 10
#define OUT_BYTES 8 /* int32 label + float32 score */

/* Ten comparisons: one thread does them all, so there is no reduction to
 * get wrong; the other threads of any launch shape return at once.
 * The strict > is samples/cnn/model.Argmax's: the lowest index wins ties,
 * and a NaN never wins (comparisons with it are false), exactly as in Go. */
__global__ void top1(const float *__restrict__ scores, uint8_t *__restrict__ out) {
  if (blockIdx.x != 0 || threadIdx.x != 0) return;
  int best = 0;
  for (int i = 1; i < N_SCORES; i++)
    if (scores[i] > scores[best]) best = i;
  *(int32_t *)out = best;
  *(float *)(out + 4) = scores[best];
}

/* Lengths are checked on the host side: on the CUDA target the kernel
 * cannot fail a request, and a short input would be read past its end.
 * The input's length is the client's fault (plover_reject), out_bytes the
 * manifest's (plover_fail). */
PLOVER_ENTRY(digits_top1) {
  if (s->input.len != N_SCORES * sizeof(float)) {
    plover_reject(s, "digits-top1: input must be 40 bytes (10 float32 scores)");
    return;
  }
  if (s->out.len != OUT_BYTES) {
    plover_fail(s, "digits-top1: out_bytes must be 8 (int32 label, float32 score)");
    return;
  }
  PLOVER_LAUNCH(top1, grid, block, s, (const float *)s->input.dat, s->out.dat);
}
