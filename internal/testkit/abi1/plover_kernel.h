/* The ABI 1 kernel header exactly as released (see plover.h here). Do not edit. */
/*
 * plover_kernel.h — write a kernel once, build it for both targets.
 *
 *   nvcc  -x cu  -shared -Xcompiler -fPIC      ->  CUDA bundle
 *   g++   -x c++ -shared -fPIC -O2             ->  host bundle
 *
 * Write device code with __global__/__device__ and the index variables
 * (threadIdx, blockIdx, blockDim, gridDim; .x only), and launch with
 *
 *     PLOVER_LAUNCH(kernel, grid, block, s, args...);
 *
 * which is kernel<<<grid, block, 0, s->stream>>>(args...) under nvcc. On the
 * host target the launch runs the grid*block "threads" one after another on
 * the calling thread, block by block. That is exact for kernels whose threads
 * do not communicate. Not available on the host target (they fail to compile):
 * __syncthreads, __shared__, warp intrinsics, dynamic shared memory, 2D/3D
 * launches. atomicAdd exists on the host target and is a plain add, which is
 * exact because the threads run serially. Because threads run one after
 * another, a grid-stride loop walks memory with a stride of grid*block on the
 * host; launch one element per thread where you can (vecadd: 3x faster).
 *
 * PLOVER_TARGET is "cuda" under nvcc and "host" otherwise, so a portable
 * bundle declares itself with PLOVER_BUNDLE(PLOVER_TARGET).
 */
#ifndef PLOVER_KERNEL_H
#define PLOVER_KERNEL_H

#include "plover.h"

#ifdef __CUDACC__

#define PLOVER_TARGET "cuda"

#define PLOVER_LAUNCH(kernel, grid, block, s, ...) \
  kernel<<<(grid), (block), 0, (cudaStream_t)((s)->stream)>>>(__VA_ARGS__)

#else /* host target */

#include <math.h>

#define PLOVER_TARGET "host"

#define __global__ static
#define __device__ static inline
#define __host__
#define __forceinline__ inline
#define __restrict__ __restrict

typedef struct plover_dim3 {
  unsigned int x, y, z;
} plover_dim3;

/* Thread-local: two instances may run the same bundle on two threads. */
static __thread plover_dim3 threadIdx, blockIdx, blockDim, gridDim;

static inline float atomicAdd(float *addr, float v) {
  float old = *addr;
  *addr = old + v;
  return old;
}

static inline int atomicAddInt(int *addr, int v) {
  int old = *addr;
  *addr = old + v;
  return old;
}

#define PLOVER_LAUNCH(kernel, grid, block, s, ...)                           \
  do {                                                                       \
    (void)(s);                                                               \
    gridDim.x = (unsigned)(grid); gridDim.y = gridDim.z = 1;                 \
    blockDim.x = (unsigned)(block); blockDim.y = blockDim.z = 1;             \
    threadIdx.y = threadIdx.z = blockIdx.y = blockIdx.z = 0;                 \
    for (blockIdx.x = 0; blockIdx.x < gridDim.x; blockIdx.x++)               \
      for (threadIdx.x = 0; threadIdx.x < blockDim.x; threadIdx.x++)         \
        kernel(__VA_ARGS__);                                                 \
  } while (0)

#endif /* __CUDACC__ */

#endif /* PLOVER_KERNEL_H */
