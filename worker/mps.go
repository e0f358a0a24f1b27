package worker

import (
	"fmt"
	"os"
)

// MPS: NVIDIA's Multi-Process Service lets workers share a GPU's SMs at
// once instead of time-slicing, with per-client limits read from the
// client's environment when CUDA initialises: so a worker of a function
// with limits is started for it, with them, never taken from the standby
// pool. MPS does not contain faults between its clients the way separate
// contexts do; it is an operator's choice (--mps), or follows a running
// control daemon.

// mpsContextHeadroom is device memory beyond a function's buffers that its
// worker's pinned-memory limit allows for the CUDA context and the
// bundle's own runtime allocations. On an H200 under MPS (driver 580,
// 2026-12-04) a context does not fit in 513 MB (cuDevicePrimaryCtxRetain:
// CUDA_ERROR_OUT_OF_MEMORY, and every worker ended as it started) and fits
// in 768: 1 GiB leaves room beyond the measurement.
const mpsContextHeadroom = 1 << 30

// mpsEnv is the environment that limits a worker under MPS: share percent
// of the SMs (0: none) and budget bytes of device memory (0: none) on
// device ordinal, plus the daemon's directories when the server was told
// where they are.
func mpsEnv(share int, budget int64, ordinal int) []string {
	var env []string
	for _, k := range []string{"CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_LOG_DIRECTORY"} {
		if v := os.Getenv(k); v != "" {
			env = append(env, k+"="+v)
		}
	}
	if share > 0 {
		env = append(env, fmt.Sprintf("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=%d", share))
	}
	if budget > 0 {
		mb := (budget + mpsContextHeadroom + 1<<20 - 1) >> 20
		env = append(env, fmt.Sprintf("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=%d=%dMB", ordinal, mb))
	}
	return env
}
