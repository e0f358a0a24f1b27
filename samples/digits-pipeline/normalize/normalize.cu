/*
 * normalize.cu — digits-normalize, step 1 of the digits pipeline: a raw
 * MNIST digit (784 bytes, 28x28 uint8, row-major, ink 255 on background 0)
 * becomes the cnn sample's input (784 little-endian float32, ink 1.0).
 *
 *   g++ -x c++ -std=c++17 -O2 -shared -fPIC -Iabi normalize.cu -> host bundle
 *
 * The cnn sample was trained on digits.Value(k) = float32(float64(k)/255)
 * (samples/cnn/digits/digits.go), so that is the conversion to reproduce.
 * Here it is one IEEE float32 division, k / 255.0f: for division, rounding
 * the exact quotient to double and then to float gives the correctly rounded
 * float (double's 53 bits >= 2*24 + 2), so the two agree bit for bit for
 * every k; the Go test checks all 256 byte values and the held-out digits.
 * Do not replace it with k * (1/255.0f): that rounds twice and differs for
 * 126 of the 256 bytes; for the same reason a CUDA build must keep IEEE
 * division (no --use_fast_math or -prec-div=false).
 */
#include "plover_kernel.h"

PLOVER_BUNDLE(PLOVER_TARGET);

#define N_PIXELS 784 /* 28 x 28 */

/* One pixel per thread; the grid-stride loop makes any grid and block
 * compute the same output. */
__global__ void normalize_pixels(const uint8_t *__restrict__ in,
                                 float *__restrict__ out, int n) {
  for (int i = (int)(blockIdx.x * blockDim.x + threadIdx.x); i < n;
       i += (int)(gridDim.x * blockDim.x))
    out[i] = (float)in[i] / 255.0f;
}

/* Lengths are checked here, on the host side, because on the CUDA target
 * the kernel cannot report anything: a short request would otherwise read
 * past the input. A longer one is refused too (no silent truncation). A
 * request of another length is the client's fault (plover_reject: 422);
 * out_bytes is the manifest's (plover_fail: 500). */
PLOVER_ENTRY(digits_normalize) {
  if (s->input.len != N_PIXELS) {
    plover_reject(s, "digits-normalize: input must be 784 bytes (28x28 uint8 pixels)");
    return;
  }
  if (s->out.len != N_PIXELS * sizeof(float)) {
    plover_fail(s, "digits-normalize: out_bytes must be 3136 (784 float32)");
    return;
  }
  PLOVER_LAUNCH(normalize_pixels, grid, block, s, s->input.dat,
                (float *)s->out.dat, N_PIXELS);
}
