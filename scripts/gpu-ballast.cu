// gpu-ballast.cu: holds all but KEEP MiB (the first argument, default
// 6144) of GPU 0's memory until it is killed, so that a check can run
// Plover on a full card (scripts/full-card.sh). Prints one line once it
// holds it: "holding N MiB, F MiB free of T MiB".
//
//   nvcc -o ballast scripts/gpu-ballast.cu && ./ballast 6144 &
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

int main(int argc, char **argv) {
  size_t keep = (size_t)atol(argc > 1 ? argv[1] : "6144") << 20;
  size_t free_b = 0, total = 0;
  cudaError_t err = cudaMemGetInfo(&free_b, &total);
  if (err != cudaSuccess) {
    fprintf(stderr, "ballast: cudaMemGetInfo: %s\n", cudaGetErrorString(err));
    return 1;
  }
  if (free_b <= keep) {
    fprintf(stderr, "ballast: %zu MiB free, not more than the %zu to keep\n", free_b >> 20, keep >> 20);
    return 1;
  }
  // In pieces of 1 GiB: one allocation of nearly the whole card may be
  // refused for its size alone.
  const size_t piece = (size_t)1 << 30;
  size_t want = free_b - keep, held = 0;
  void *p;
  while (want - held >= piece && cudaMalloc(&p, piece) == cudaSuccess) held += piece;
  if (want > held && cudaMalloc(&p, want - held) == cudaSuccess) held = want;
  cudaMemGetInfo(&free_b, &total);
  printf("holding %zu MiB, %zu MiB free of %zu MiB\n", held >> 20, free_b >> 20, total >> 20);
  fflush(stdout);
  for (;;) pause();
}
