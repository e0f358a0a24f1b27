/* clock_gettime under any -std, not only the GNU dialect cgo defaults to. */
#define _POSIX_C_SOURCE 200809L

#include "cudadrv.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/*
 * Every driver entry point Plover calls, by the exact symbol libcuda.so.1
 * exports. cuda.h maps the plain names to these versioned ones (cuMemAlloc ->
 * cuMemAlloc_v2, ...); the unversioned symbols that still exist are the old
 * 32-bit-size ABI and must not be used. cuGraphInstantiateWithFlags is the
 * newest (CUDA 11.4), so it sets the oldest driver that loads.
 */
#define PLCU_SYMBOLS(X)                                                  \
  X(cuInit, (unsigned int))                                              \
  X(cuDriverGetVersion, (int *))                                         \
  X(cuGetErrorName, (CUresult, const char **))                           \
  X(cuGetErrorString, (CUresult, const char **))                         \
  X(cuDeviceGetCount, (int *))                                           \
  X(cuDeviceGet, (CUdevice *, int))                                      \
  X(cuDeviceGetName, (char *, int, CUdevice))                            \
  X(cuDeviceTotalMem_v2, (size_t *, CUdevice))                           \
  X(cuDevicePrimaryCtxRetain, (CUcontext *, CUdevice))                   \
  X(cuDevicePrimaryCtxRelease_v2, (CUdevice))                            \
  X(cuCtxSetCurrent, (CUcontext))                                        \
  X(cuMemAlloc_v2, (CUdeviceptr *, size_t))                              \
  X(cuMemFree_v2, (CUdeviceptr))                                         \
  X(cuMemGetInfo_v2, (size_t *, size_t *))                               \
  X(cuMemHostAlloc, (void **, size_t, unsigned int))                     \
  X(cuMemFreeHost, (void *))                                             \
  X(cuMemHostRegister_v2, (void *, size_t, unsigned int))                \
  X(cuMemHostUnregister, (void *))                                       \
  X(cuMemcpyHtoD_v2, (CUdeviceptr, const void *, size_t))                \
  X(cuMemcpyHtoDAsync_v2, (CUdeviceptr, const void *, size_t, CUstream)) \
  X(cuMemcpyDtoHAsync_v2, (void *, CUdeviceptr, size_t, CUstream))       \
  X(cuMemsetD8Async, (CUdeviceptr, unsigned char, size_t, CUstream))     \
  X(cuStreamCreate, (CUstream *, unsigned int))                          \
  X(cuStreamCreateWithPriority, (CUstream *, unsigned int, int))         \
  X(cuStreamGetPriority, (CUstream, int *))                              \
  X(cuCtxGetStreamPriorityRange, (int *, int *))                         \
  X(cuStreamDestroy_v2, (CUstream))                                      \
  X(cuStreamSynchronize, (CUstream))                                     \
  X(cuStreamBeginCapture_v2, (CUstream, int))                            \
  X(cuStreamEndCapture, (CUstream, CUgraph *))                           \
  X(cuGraphInstantiateWithFlags, (CUgraphExec *, CUgraph, unsigned long long)) \
  X(cuGraphLaunch, (CUgraphExec, CUstream))                              \
  X(cuGraphExecDestroy, (CUgraphExec))                                   \
  X(cuGraphDestroy, (CUgraph))                                           \
  X(cuEventCreate, (CUevent *, unsigned int))                            \
  X(cuEventRecord, (CUevent, CUstream))                                  \
  X(cuEventElapsedTime, (float *, CUevent, CUevent))                     \
  X(cuEventDestroy_v2, (CUevent))

struct plcu_driver {
  void *lib;
#define PLCU_FIELD(name, args) CUresult(*name) args;
  PLCU_SYMBOLS(PLCU_FIELD)
#undef PLCU_FIELD
  /* Optional: only a server that opens its GPUs without a context (under
   * MPS) needs it, and falls back to a context where it is missing. The
   * _v2 gives a MIG compute instance's UUID where CUDA sees one; the old
   * one gave the whole GPU's. */
  CUresult (*cuDeviceGetUuid_v2)(unsigned char *, CUdevice);
};

plcu_driver_t *plcu_open(const char *path, char *err, size_t errlen) {
  /* RTLD_LOCAL: the bundles' static cudart dlopens libcuda.so.1 itself and
   * gets this same loaded copy by soname; nothing needs our symbols global. */
  void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (lib == NULL) {
    const char *m = dlerror();
    snprintf(err, errlen, "cannot load %s: %s", path, m ? m : "dlopen failed");
    return NULL;
  }
  plcu_driver_t *d = calloc(1, sizeof *d);
  if (d == NULL) {
    snprintf(err, errlen, "out of memory");
    return NULL; /* lib stays loaded: CUDA libraries are never unloaded */
  }
  d->lib = lib;
#define PLCU_RESOLVE(name, args)                                              \
  *(void **)(&d->name) = dlsym(lib, #name);                                   \
  if (d->name == NULL) {                                                      \
    snprintf(err, errlen,                                                     \
             "%s does not export %s: the NVIDIA driver is too old (Plover "   \
             "needs one that supports CUDA 11.4 or newer)",                   \
             path, #name);                                                    \
    free(d);                                                                  \
    return NULL;                                                              \
  }
  PLCU_SYMBOLS(PLCU_RESOLVE)
#undef PLCU_RESOLVE
  *(void **)(&d->cuDeviceGetUuid_v2) = dlsym(lib, "cuDeviceGetUuid_v2");
  return d;
}

CUresult plcu_init(const plcu_driver_t *d) { return d->cuInit(0); }

CUresult plcu_driver_version(const plcu_driver_t *d, int *v) {
  return d->cuDriverGetVersion(v);
}

const char *plcu_error_name(const plcu_driver_t *d, CUresult e) {
  const char *s = NULL;
  if (d == NULL || d->cuGetErrorName(e, &s) != PLCU_SUCCESS) return NULL;
  return s;
}

const char *plcu_error_string(const plcu_driver_t *d, CUresult e) {
  const char *s = NULL;
  if (d == NULL || d->cuGetErrorString(e, &s) != PLCU_SUCCESS) return NULL;
  return s;
}

CUresult plcu_device_count(const plcu_driver_t *d, int *n) {
  return d->cuDeviceGetCount(n);
}

/* What a device is without a context: its handle, name and memory. */
static CUresult device_basics(const plcu_driver_t *d, int ordinal,
                              CUdevice *dev, char *name, int namelen,
                              size_t *total, const char **op) {
  CUresult e;
  if ((e = d->cuDeviceGet(dev, ordinal)) != PLCU_SUCCESS) {
    *op = "cuDeviceGet";
    return e;
  }
  if ((e = d->cuDeviceGetName(name, namelen, *dev)) != PLCU_SUCCESS) {
    *op = "cuDeviceGetName";
    return e;
  }
  if ((e = d->cuDeviceTotalMem_v2(total, *dev)) != PLCU_SUCCESS) {
    *op = "cuDeviceTotalMem_v2";
    return e;
  }
  return PLCU_SUCCESS;
}

CUresult plcu_device_open(const plcu_driver_t *d, int ordinal, CUdevice *dev,
                          CUcontext *ctx, char *name, int namelen,
                          size_t *total, int *prio_least, int *prio_greatest,
                          const char **op) {
  CUresult e;
  if ((e = device_basics(d, ordinal, dev, name, namelen, total, op)) !=
      PLCU_SUCCESS) {
    return e;
  }
  /* The primary context, never cuCtxCreate: it is the one the bundles'
   * cudart uses, so their launches and our stream share one context. */
  if ((e = d->cuDevicePrimaryCtxRetain(ctx, *dev)) != PLCU_SUCCESS) {
    *op = "cuDevicePrimaryCtxRetain";
    return e;
  }
  *op = "cuCtxSetCurrent";
  if ((e = d->cuCtxSetCurrent(*ctx)) == PLCU_SUCCESS) {
    *op = "cuCtxGetStreamPriorityRange";
    e = d->cuCtxGetStreamPriorityRange(prio_least, prio_greatest);
  }
  if (e != PLCU_SUCCESS) {
    d->cuDevicePrimaryCtxRelease_v2(*dev);
    return e;
  }
  return PLCU_SUCCESS;
}

CUresult plcu_device_info(const plcu_driver_t *d, int ordinal, CUdevice *dev,
                          char *name, int namelen, size_t *total,
                          unsigned char uuid[16], int *has_uuid,
                          const char **op) {
  CUresult e;
  *has_uuid = 0;
  if ((e = device_basics(d, ordinal, dev, name, namelen, total, op)) !=
      PLCU_SUCCESS) {
    return e;
  }
  if (d->cuDeviceGetUuid_v2 != NULL) {
    if ((e = d->cuDeviceGetUuid_v2(uuid, *dev)) != PLCU_SUCCESS) {
      *op = "cuDeviceGetUuid_v2";
      return e;
    }
    *has_uuid = 1;
  }
  return PLCU_SUCCESS;
}

CUresult plcu_device_close(const plcu_driver_t *d, CUdevice dev) {
  return d->cuDevicePrimaryCtxRelease_v2(dev);
}

CUresult plcu_mem_info(const plcu_driver_t *d, CUcontext ctx, size_t *free_b,
                       size_t *total_b) {
  CUresult e = d->cuCtxSetCurrent(ctx);
  if (e != PLCU_SUCCESS) return e;
  return d->cuMemGetInfo_v2(free_b, total_b);
}

CUresult plcu_alloc(const plcu_driver_t *d, CUcontext ctx, size_t n,
                    CUdeviceptr *p) {
  CUresult e = d->cuCtxSetCurrent(ctx);
  if (e != PLCU_SUCCESS) return e;
  /* cuMemAlloc refuses 0 bytes; a zero-sized buffer still gets a valid
   * pointer, as on the host device. */
  return d->cuMemAlloc_v2(p, n ? n : 1);
}

CUresult plcu_free(const plcu_driver_t *d, CUcontext ctx, CUdeviceptr p) {
  CUresult e = d->cuCtxSetCurrent(ctx);
  if (e != PLCU_SUCCESS) return e;
  return p ? d->cuMemFree_v2(p) : PLCU_SUCCESS;
}

CUresult plcu_host_alloc(const plcu_driver_t *d, CUcontext ctx, size_t n,
                         void **p) {
  CUresult e = d->cuCtxSetCurrent(ctx);
  if (e != PLCU_SUCCESS) return e;
  /* PORTABLE: pinned for every context, so staging stays valid however
   * devices and contexts are arranged later. */
  return d->cuMemHostAlloc(p, n ? n : 1, PLCU_MEMHOSTALLOC_PORTABLE);
}

CUresult plcu_host_free(const plcu_driver_t *d, CUcontext ctx, void *p) {
  CUresult e = d->cuCtxSetCurrent(ctx);
  if (e != PLCU_SUCCESS) return e;
  return p ? d->cuMemFreeHost(p) : PLCU_SUCCESS;
}

CUresult plcu_host_register(const plcu_driver_t *d, CUcontext ctx, void *p,
                            size_t n) {
  CUresult e = d->cuCtxSetCurrent(ctx);
  if (e != PLCU_SUCCESS) return e;
  return d->cuMemHostRegister_v2(p, n, PLCU_MEMHOSTREGISTER_PORTABLE);
}

CUresult plcu_host_unregister(const plcu_driver_t *d, CUcontext ctx, void *p) {
  CUresult e = d->cuCtxSetCurrent(ctx);
  if (e != PLCU_SUCCESS) return e;
  return d->cuMemHostUnregister(p);
}

static int64_t mono_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

CUresult plcu_copy_probe(const plcu_driver_t *d, CUcontext ctx, void *h,
                         size_t n, int iters, int64_t *ns_in, int64_t *ns_out,
                         const char **op) {
  CUdeviceptr dp = 0;
  CUstream st = NULL;
  CUresult e;
  *op = "cuCtxSetCurrent";
  if ((e = d->cuCtxSetCurrent(ctx)) != PLCU_SUCCESS) return e;
  *op = "cuStreamCreate";
  if ((e = d->cuStreamCreate(&st, 0)) != PLCU_SUCCESS) return e;
  *op = "cuMemAlloc_v2";
  if ((e = d->cuMemAlloc_v2(&dp, n)) != PLCU_SUCCESS) {
    d->cuStreamDestroy_v2(st);
    return e;
  }
  int64_t t0 = mono_ns();
  *op = "cuMemcpyHtoD_v2"; /* from pinned memory: returns once done */
  for (int i = 0; i < iters && e == PLCU_SUCCESS; i++)
    e = d->cuMemcpyHtoD_v2(dp, h, n);
  int64_t t1 = mono_ns();
  for (int i = 0; i < iters && e == PLCU_SUCCESS; i++) {
    *op = "cuMemcpyDtoHAsync_v2";
    e = d->cuMemcpyDtoHAsync_v2(h, dp, n, st);
    if (e == PLCU_SUCCESS) {
      *op = "cuStreamSynchronize";
      e = d->cuStreamSynchronize(st);
    }
  }
  int64_t t2 = mono_ns();
  d->cuMemFree_v2(dp);
  d->cuStreamDestroy_v2(st);
  *ns_in = t1 - t0;
  *ns_out = t2 - t1;
  return e;
}

CUresult plcu_htod(const plcu_driver_t *d, CUcontext ctx, CUdeviceptr dst,
                   const void *src, size_t n) {
  CUresult e = d->cuCtxSetCurrent(ctx);
  if (e != PLCU_SUCCESS) return e;
  return n ? d->cuMemcpyHtoD_v2(dst, src, n) : PLCU_SUCCESS;
}

CUresult plcu_inst_create(const plcu_driver_t *d, CUcontext ctx, size_t max_in,
                          size_t tmp, size_t out, CUdeviceptr constant,
                          size_t constant_len, void *host, size_t host_out, int abi1,
                          void *program, int priority, plcu_inst_t **pin,
                          const char **op) {
  plcu_inst_t *in = calloc(1, sizeof *in);
  if (in == NULL) {
    *op = "calloc";
    return 2; /* CUDA_ERROR_OUT_OF_MEMORY */
  }
  in->drv = d;
  in->ctx = ctx;
  CUresult e;
#define TRY(name, call)                  \
  if ((e = (call)) != PLCU_SUCCESS) {    \
    *op = name;                          \
    goto fail;                           \
  }
  TRY("cuCtxSetCurrent", d->cuCtxSetCurrent(ctx));
  /* Non-blocking: the legacy default stream must never serialise with, or
   * be captured into, an instance's work (bundles' cudart and other
   * libraries may use it). */
  TRY("cuStreamCreateWithPriority",
      d->cuStreamCreateWithPriority(&in->stream, PLCU_STREAM_NON_BLOCKING, priority));
  for (int i = 0; i < 4; i++)
    TRY("cuEventCreate", d->cuEventCreate(&in->ev[i], PLCU_EVENT_DEFAULT));
  TRY("cuMemAlloc_v2", d->cuMemAlloc_v2(&in->d_in, max_in ? max_in : 1));
  TRY("cuMemAlloc_v2", d->cuMemAlloc_v2(&in->d_tmp, tmp ? tmp : 1));
  TRY("cuMemAlloc_v2", d->cuMemAlloc_v2(&in->d_out, out ? out : 1));
  /* The caller's buffer (a worker's shared slot), pinned where it is, saves
   * a copy each way; a driver or mapping that refuses it gets staging of
   * the instance's own. */
  if (host != NULL && host_out + out > 0 &&
      (in->host_err = d->cuMemHostRegister_v2(host, host_out + out, PLCU_MEMHOSTREGISTER_PORTABLE)) == PLCU_SUCCESS) {
    in->h_ext = 1;
    in->h_in = host;
    in->h_out = (char *)host + host_out;
  } else {
    TRY("cuMemHostAlloc", d->cuMemHostAlloc(&in->h_in, max_in ? max_in : 1,
                                            PLCU_MEMHOSTALLOC_PORTABLE));
    TRY("cuMemHostAlloc", d->cuMemHostAlloc(&in->h_out, out ? out : 1,
                                            PLCU_MEMHOSTALLOC_PORTABLE));
  }
#undef TRY
  plover_state_init(&in->state, abi1, (void *)(uintptr_t)in->d_in, max_in,
                    (void *)(uintptr_t)constant, constant_len,
                    (void *)(uintptr_t)in->d_tmp, tmp,
                    (void *)(uintptr_t)in->d_out, out, in->stream, program);
  *pin = in;
  return PLCU_SUCCESS;
fail:
  plcu_inst_destroy(in, 0);
  return e;
}

static void plcu_inst_drop_graph(plcu_inst_t *in, int slot) {
  if (in->exec[slot] != NULL) {
    in->drv->cuGraphExecDestroy(in->exec[slot]);
    in->exec[slot] = NULL;
  }
}

CUresult plcu_inst_stream_priority(plcu_inst_t *in, int *priority) {
  CUresult e = in->drv->cuCtxSetCurrent(in->ctx);
  if (e != PLCU_SUCCESS) return e;
  return in->drv->cuStreamGetPriority(in->stream, priority);
}

void plcu_inst_destroy(plcu_inst_t *in, int skip_gpu) {
  if (in == NULL) return;
  const plcu_driver_t *d = in->drv;
  if (!skip_gpu) {
    d->cuCtxSetCurrent(in->ctx);
    for (int k = 0; k < PLCU_GRAPHS; k++) plcu_inst_drop_graph(in, k);
    /* Every run ends with a stream sync, so nothing is in flight here. */
    if (in->stream) d->cuStreamDestroy_v2(in->stream);
    for (int i = 0; i < 4; i++)
      if (in->ev[i]) d->cuEventDestroy_v2(in->ev[i]);
    if (in->d_in) d->cuMemFree_v2(in->d_in);
    if (in->d_tmp) d->cuMemFree_v2(in->d_tmp);
    if (in->d_out) d->cuMemFree_v2(in->d_out);
    if (in->h_ext) {
      d->cuMemHostUnregister(in->h_in);
    } else {
      if (in->h_in) d->cuMemFreeHost(in->h_in);
      if (in->h_out) d->cuMemFreeHost(in->h_out);
    }
  }
  free(in);
}

static int64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static void call_entries(plcu_inst_t *in, int n) {
  plover_call_entries(&in->state, in->steps, n);
}

static const char *take_error(void *last_error) {
  return last_error ? ((plover_last_error_fn)last_error)() : NULL;
}

/* Calls hook on st, then waits for stream and for the default streams: a
 * hook's work must be done before what follows it (the first request,
 * freeing the buffers). The stream alone is not enough: a hook may work on
 * the legacy default stream or a per-thread one (cudaMemset, a cudaMemcpy
 * from pageable memory), which the instances' streams, non-blocking, never
 * wait for, so a first request's kernels could read constants not fully
 * written. Not the whole context (cuCtxSynchronize): in a tenant's worker
 * that waits for the other functions' kernels too, and a sibling's long
 * run would hold a load past its bound, whose kill ends them all. */
static const char *hook_and_sync(const plcu_driver_t *d, CUstream stream,
                                 void *hook, plover_state_t *st,
                                 void *last_error, CUresult *e,
                                 const char **op, int *reached) {
  *reached = 1;
  const char *msg = plover_call_hook(hook, st, last_error);
  CUresult se = d->cuStreamSynchronize(stream);
  if (se != PLCU_SUCCESS && *e == PLCU_SUCCESS) {
    *e = se;
    *op = "cuStreamSynchronize";
  }
  /* CU_STREAM_LEGACY and CU_STREAM_PER_THREAD, cuda.h's handles. */
  for (uintptr_t h = 0x1; h <= 0x2; h++) {
    se = d->cuStreamSynchronize((CUstream)h);
    if (se != PLCU_SUCCESS && *e == PLCU_SUCCESS) {
      *e = se;
      *op = "cuStreamSynchronize (a default stream)";
    }
  }
  /* An error the hook's kernels raised asynchronously shows after the sync. */
  if (msg == NULL) msg = take_error(last_error);
  return msg;
}

const char *plcu_inst_hook(plcu_inst_t *in, void *hook, void *last_error,
                           CUresult *e, const char **op, int *reached) {
  *reached = 0;
  *e = in->drv->cuCtxSetCurrent(in->ctx);
  if (*e != PLCU_SUCCESS) {
    *op = "cuCtxSetCurrent";
    return NULL;
  }
  /* cuCtxSetCurrent does not report a sticky error: a context that other
   * work poisoned is found here, on the idle stream, before the hook runs,
   * and not by the sync after it, which would take it for the hook's. */
  *e = in->drv->cuStreamSynchronize(in->stream);
  if (*e != PLCU_SUCCESS) {
    *op = "cuStreamSynchronize";
    return NULL;
  }
  in->state.st = in->state.base;
  const char *msg = hook_and_sync(in->drv, in->stream, hook, &in->state.st,
                                  last_error, e, op, reached);
  in->state.base.instance = in->state.st.instance;
  return msg;
}

const char *plcu_program_hook(const plcu_driver_t *d, CUcontext ctx,
                              void *hook, void *last_error,
                              CUdeviceptr constant, size_t constant_len,
                              void **program, CUresult *e, const char **op,
                              int *reached) {
  CUstream stream = NULL;
  *reached = 0;
  if ((*e = d->cuCtxSetCurrent(ctx)) != PLCU_SUCCESS) {
    *op = "cuCtxSetCurrent";
    return NULL;
  }
  if ((*e = d->cuStreamCreate(&stream, PLCU_STREAM_NON_BLOCKING)) != PLCU_SUCCESS) {
    *op = "cuStreamCreate";
    return NULL;
  }
  plover_inst_state_t s;
  plover_state_init(&s, 0, NULL, 0, (void *)(uintptr_t)constant, constant_len,
                    NULL, 0, NULL, 0, stream, *program);
  const char *msg = hook_and_sync(d, stream, hook, &s.st, last_error, e, op, reached);
  *program = s.st.program;
  d->cuStreamDestroy_v2(stream);
  return msg;
}

static void capture_failed(plcu_result_t *r, CUresult e, const char *op) {
  r->capture_err = e;
  r->capture_op = op;
}

/*
 * Captures the chain on the instance stream, keeps the graph and launches
 * it. Returns 1 when the graph ran; 0 when the capture failed and nothing of
 * the chain was enqueued, so the caller can run it directly. Only the chain
 * is captured: the copies and the tmp memset stay outside because ZeroTmp is
 * not part of the ChainKey promise, and a graph that holds only what the
 * bundle enqueued makes a failed capture safe to redo directly.
 */
static int capture(plcu_inst_t *in, int n, int slot, void *last_error,
                   plcu_result_t *r) {
  const plcu_driver_t *d = in->drv;
  CUgraph g = NULL;
  CUgraphExec x = NULL;
  /* THREAD_LOCAL: other goroutines' threads capture their own instances at
   * the same time; GLOBAL mode would make their unsafe calls fail ours. */
  CUresult e = d->cuStreamBeginCapture_v2(in->stream, PLCU_CAPTURE_MODE_THREAD_LOCAL);
  if (e != PLCU_SUCCESS) {
    capture_failed(r, e, "cuStreamBeginCapture_v2");
    return 0;
  }
  call_entries(in, n);
  e = d->cuStreamEndCapture(in->stream, &g);
  /* Read (and clear) the bundle's error now: whatever went wrong while
   * capturing must not be reported against the direct rerun. */
  const char *kerr = take_error(last_error);
  if (e != PLCU_SUCCESS) {
    if (g != NULL) d->cuGraphDestroy(g);
    r->capture_kernel_err = kerr;
    capture_failed(r, e, "cuStreamEndCapture");
    return 0;
  }
  if (kerr != NULL) {
    /* A launch refused while capturing, or plover_fail: the graph may be
     * missing nodes. The direct rerun decides what the request returns. */
    if (g != NULL) d->cuGraphDestroy(g);
    r->capture_kernel_err = kerr;
    capture_failed(r, 0, "capture");
    return 0;
  }
  /* Flags 0, not CUDA_GRAPH_INSTANTIATE_FLAG_USE_NODE_PRIORITY: a replay
   * runs at the priority of the stream it is launched into, the instance's
   * (its function's class), as its direct runs do. */
  e = d->cuGraphInstantiateWithFlags(&x, g, 0);
  d->cuGraphDestroy(g); /* the exec does not need it */
  if (e != PLCU_SUCCESS) {
    capture_failed(r, e, "cuGraphInstantiateWithFlags");
    return 0;
  }
  plcu_inst_drop_graph(in, slot);
  in->exec[slot] = x;
  e = d->cuGraphLaunch(x, in->stream);
  if (e != PLCU_SUCCESS) {
    plcu_inst_drop_graph(in, slot);
    capture_failed(r, e, "cuGraphLaunch");
    return 0;
  }
  return 1;
}

/* A run's copies, issued as in->piece-byte pieces back to back on the
 * stream (no host sync between them), meant to let another context's copy
 * in between two pieces. On an H200 pieces alone did not shorten another
 * function's wait (it looks like time-slicing between contexts); with
 * the floods held to one run they did (BENCHMARKS.md, "GPU, third run"). */
static size_t piece_len(const plcu_inst_t *in, size_t left) {
  return in->piece && in->piece < left ? in->piece : left;
}

static CUresult htod_pieces(plcu_inst_t *in, const void *src, size_t n) {
  CUresult e = PLCU_SUCCESS;
  for (size_t off = 0, k; off < n && e == PLCU_SUCCESS; off += k) {
    k = piece_len(in, n - off);
    e = in->drv->cuMemcpyHtoDAsync_v2(in->d_in + off, (const char *)src + off, k, in->stream);
  }
  return e;
}

static CUresult dtoh_pieces(plcu_inst_t *in, void *dst, size_t n) {
  CUresult e = PLCU_SUCCESS;
  for (size_t off = 0, k; off < n && e == PLCU_SUCCESS; off += k) {
    k = piece_len(in, n - off);
    e = in->drv->cuMemcpyDtoHAsync_v2((char *)dst + off, in->d_out + off, k, in->stream);
  }
  return e;
}

/*
 * Timing uses CUDA events on the instance stream for the device side (the
 * H2D copy and memset, the chain, the D2H copy) plus clock_gettime for the
 * host memcpys into and out of pinned staging. Timing the device side with
 * host clocks would need a stream sync after each phase, which stalls the
 * pipeline and adds latency to every request; four event records cost
 * about a microsecond each and leave the work queued back to back.
 */
void plcu_run(plcu_inst_t *in, const void *src, size_t in_len, void *dst,
              size_t out_len, size_t tmp_len, uint32_t items, int zero,
              int nsteps, int mode, int slot, void *last_error) {
  const plcu_driver_t *d = in->drv;
  plcu_result_t *r = &in->res;
  memset(r, 0, sizeof *r);
  CUresult e;
  size_t used = 0;
  int64_t t0 = now_ns();
  if ((e = d->cuCtxSetCurrent(in->ctx)) != PLCU_SUCCESS) {
    r->err = e;
    r->err_op = "cuCtxSetCurrent";
    return;
  }
  /* In place: src and dst are a worker's slot, registered with the driver
   * (RegisterHost): the copies go straight between them and the GPU.
   * Otherwise through the instance's pinned buffers, which are the
   * instance's own slot when src and dst are its halves. */
  const void *h_in = in->h_in;
  void *h_out = in->h_out;
  if (zero & PLOVER_IN_PLACE) {
    h_in = src;
    h_out = dst;
  }
  r->t.copied = 0;
  if (in_len && src != h_in) {
    memcpy(in->h_in, src, in_len);
    r->t.copied += in_len;
  }
  int64_t t1 = now_ns();
#define STEP(name, call)                 \
  if ((e = (call)) != PLCU_SUCCESS) {    \
    r->err = e;                          \
    r->err_op = name;                    \
    goto sync;                           \
  }
  STEP("cuEventRecord", d->cuEventRecord(in->ev[0], in->stream));
  if (in_len)
    STEP("cuMemcpyHtoDAsync_v2", htod_pieces(in, h_in, in_len));
  if ((zero & PLOVER_ZERO_OUT) && out_len)
    STEP("cuMemsetD8Async", d->cuMemsetD8Async(in->d_out, 0, out_len, in->stream));
  if ((zero & PLOVER_ZERO_TMP) && tmp_len)
    STEP("cuMemsetD8Async", d->cuMemsetD8Async(in->d_tmp, 0, tmp_len, in->stream));
  STEP("cuEventRecord", d->cuEventRecord(in->ev[1], in->stream));

  plover_state_begin(&in->state, in_len, tmp_len, out_len, items);
  r->reached = 1;
  r->ran = PLCU_DIRECT;
  if (slot < 0 || slot >= PLCU_GRAPHS) mode = PLCU_DIRECT;
  if (mode == PLCU_REPLAY && in->exec[slot] != NULL) {
    if ((e = d->cuGraphLaunch(in->exec[slot], in->stream)) == PLCU_SUCCESS) {
      r->ran = PLCU_REPLAY;
    } else {
      plcu_inst_drop_graph(in, slot);
      capture_failed(r, e, "cuGraphLaunch");
    }
  } else if (mode == PLCU_CAPTURE) {
    if (capture(in, nsteps, slot, last_error, r)) r->ran = PLCU_CAPTURE;
  }
  if (r->ran == PLCU_DIRECT) {
    /* A failed capture called the entries already: they start again from
     * the state every request starts from, not from what they left. */
    if (mode == PLCU_CAPTURE) plover_state_begin(&in->state, in_len, tmp_len, out_len, items);
    call_entries(in, nsteps);
  }
  r->kernel_err = take_error(last_error);
  /* A replay runs no entry code, so it reproduces the out.len recorded. */
  if (r->ran == PLCU_REPLAY) {
    used = in->exec_out_used[slot];
  } else {
    used = plover_state_out_used(&in->state, out_len);
    if (r->ran == PLCU_CAPTURE) in->exec_out_used[slot] = used;
  }
  r->t.out_used = used;

  STEP("cuEventRecord", d->cuEventRecord(in->ev[2], in->stream));
  /* A failed chain's output is never returned: skip the copy. */
  if (r->kernel_err == NULL && used && used <= out_len)
    STEP("cuMemcpyDtoHAsync_v2", dtoh_pieces(in, h_out, used));
  STEP("cuEventRecord", d->cuEventRecord(in->ev[3], in->stream));
#undef STEP
sync:
  /* Always sync, even after a failure: the staging buffers and the state
   * belong to whatever is still queued until the stream drains. */
  e = d->cuStreamSynchronize(in->stream);
  if (e != PLCU_SUCCESS && r->err == PLCU_SUCCESS) {
    r->err = e;
    r->err_op = "cuStreamSynchronize";
  }
  if (r->err != PLCU_SUCCESS || r->kernel_err != NULL) return;
  /* The stream drained cleanly, so a timing failure is no reason to fail
   * the request: that phase reads as zero. */
  float ms[3] = {0, 0, 0};
  for (int i = 0; i < 3; i++)
    if (d->cuEventElapsedTime(&ms[i], in->ev[i], in->ev[i + 1]) != PLCU_SUCCESS)
      ms[i] = 0;
  int64_t t2 = now_ns();
  if (used && used <= out_len && dst != h_out) {
    memcpy(dst, h_out, used);
    r->t.copied += used;
  }
  int64_t t3 = now_ns();
  r->t.copy_in_ns = (t1 - t0) + (int64_t)(ms[0] * 1e6);
  r->t.kernels_ns = (int64_t)(ms[1] * 1e6);
  r->t.copy_out_ns = (int64_t)(ms[2] * 1e6) + (t3 - t2);
  r->t.busy_ns = (int64_t)((ms[0] + ms[1] + ms[2]) * 1e6);
}
