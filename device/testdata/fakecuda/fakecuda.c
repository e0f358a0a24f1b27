/*
 * fakecuda.c — a stand-in for libcuda.so.1, so that the CUDA device's Go and
 * C code run in tests on machines without a GPU.
 *
 * Device memory is host memory and every stream operation executes at once
 * on the calling thread (a valid schedule for one in-order stream whose
 * results are read only after a sync). Kernels are host functions launched
 * through fakecu_launch (see fakebundle.c), which stream capture records and
 * cuGraphLaunch replays, so a test can see that replay does not call the
 * entry points. It is stricter than the real driver where that checks
 * Plover's own intent: capture must be THREAD_LOCAL on a non-blocking
 * stream, nothing may use the NULL stream, every call needs a current
 * context, and copies or events inside a capture invalidate it.
 *
 * Environment: FAKECUDA_INIT_ERROR=<code> makes cuInit fail,
 * FAKECUDA_DEVICES=<n> (default 2, at most 4) sets the device count.
 * FAKECUDA_REGISTER_ERROR=<code> makes cuMemHostRegister refuse.
 * FAKECUDA_UNREGISTER_ERROR=<code> makes the process's first
 * cuMemHostUnregister fail (the memory stays registered); later ones work.
 * Registering host memory that overlaps a registered range fails with 712
 * and unregistering what is not a registered base with 713, as on the real
 * driver.
 * FAKECUDA_FAULT=<code> is the sticky error a faulting kernel (fakecu_fault)
 * leaves instead of the one it asks for: the other codes NVIDIA documents as
 * ending the process's use of CUDA (an MPS client terminated, say), or
 * one of a lost MPS server (805-809: every later call returns it too, as
 * once the server is gone).
 * FAKECUDA_MAX_COPY=<n> makes an async copy between host and device of
 * more than n bytes fail with CUDA_ERROR_INVALID_VALUE: a test in another
 * process (a worker) sees that its copies went in pieces no larger.
 * FAKECUDA_KERNEL_US=<n> makes the GPU busy: every kernel holds it for n
 * microseconds, one kernel at a time in the process, and across processes
 * that name the same file in FAKECUDA_GPU_LOCK (flock): a GPU whose kernels
 * fill it, and whose contexts time-slice, so that a run's events span other
 * runs' kernels as they do on a real one.
 * Built with -DFAKECUDA_OMIT_GRAPH_LAUNCH it lacks cuGraphLaunch, like a
 * driver too old for Plover.
 *
 * This models the documented behaviour as Plover relies on it; it is no
 * evidence of how a real driver behaves.
 */
#include <fcntl.h>
#include <pthread.h>
#include <sys/file.h>
#include <unistd.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef void (*fk_kernel)(void *args, int grid, int block);

#define EXPORT __attribute__((visibility("default")))
#define MAXDEV 4
#define MEM_PER_DEVICE (1ull << 30)

enum {
  OK = 0,
  INVALID_VALUE = 1,
  OUT_OF_MEMORY = 2,
  NOT_INITIALIZED = 3,
  INVALID_DEVICE = 101,
  INVALID_CONTEXT = 201,
  ILLEGAL_STATE = 401,
  HOST_MEMORY_ALREADY_REGISTERED = 712,
  HOST_MEMORY_NOT_REGISTERED = 713,
  CAPTURE_UNSUPPORTED = 900,
  CAPTURE_INVALIDATED = 901,
};

/* Live object counts, read by tests through dlsym to catch leaks:
 * 0 device allocations, 1 pinned host allocations, 2 streams, 3 events,
 * 4 graphs, 5 graph execs, 6 kernels executed, 7 device bytes allocated. */
EXPORT long long fakecu_live[8];
#define COUNT(i, d) __atomic_add_fetch(&fakecu_live[i], (d), __ATOMIC_RELAXED)

/* The async copies between host and device, read by tests through dlsym:
 * [0] host to device, [1] device to host; each {calls, bytes, largest}. */
EXPORT long long fakecu_copies[2][3];

static CUresult count_copy(int dir, size_t n) {
  const char *max = getenv("FAKECUDA_MAX_COPY");
  if (max && atoll(max) > 0 && (long long)n > atoll(max)) return INVALID_VALUE;
  long long *c = fakecu_copies[dir];
  __atomic_add_fetch(&c[0], 1, __ATOMIC_RELAXED);
  __atomic_add_fetch(&c[1], (long long)n, __ATOMIC_RELAXED);
  long long big = __atomic_load_n(&c[2], __ATOMIC_RELAXED);
  while ((long long)n > big &&
         !__atomic_compare_exchange_n(&c[2], &big, (long long)n, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
  }
  return OK;
}

/* A memset on the legacy default stream (cudaMemset from a bundle),
 * queued: see fakecu_memset_default. */
typedef struct pending {
  void *dst;
  unsigned char v;
  size_t n;
  struct pending *next;
} pending_t;

struct CUctx_st {
  int dev;
  int refs;
  int sticky; /* a sticky error poisons the context until its last release */
  long long allocated;
  pending_t *pending, **pending_tail; /* legacy default stream work, in order */
};
typedef struct CUctx_st *CUcontext;

typedef struct {
  fk_kernel fn;
  int grid, block;
  void *args;
} node_t;

struct CUgraph_st {
  node_t *nodes;
  int n, cap;
};
typedef struct CUgraph_st *CUgraph;

struct CUgraphExec_st {
  node_t *nodes;
  int n;
};
typedef struct CUgraphExec_st *CUgraphExec;

struct CUstream_st {
  unsigned flags;
  int priority;
  int capturing, invalidated;
  CUgraph g;
};
typedef struct CUstream_st *CUstream;

struct CUevent_st {
  int64_t t;
};
typedef struct CUevent_st *CUevent;

static struct CUctx_st ctxs[MAXDEV];
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static int inited;
/* The busy GPU of FAKECUDA_KERNEL_US: one kernel at a time. */
static pthread_mutex_t gpu_mu = PTHREAD_MUTEX_INITIALIZER;
static int gpu_fd = -1; /* FAKECUDA_GPU_LOCK, opened by cuInit (before a
                           worker restricts its filesystem) */
static __thread CUcontext cur;

static int64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static int ndevices(void) {
  const char *e = getenv("FAKECUDA_DEVICES");
  int n = e ? atoi(e) : 2;
  return n < 0 ? 0 : n > MAXDEV ? MAXDEV : n;
}

#define NEED_CTX()                        \
  do {                                    \
    if (!inited) return NOT_INITIALIZED;  \
    if (cur == NULL) return INVALID_CONTEXT; \
    if (cur->sticky) return cur->sticky;  \
  } while (0)

EXPORT CUresult cuInit(unsigned int flags) {
  const char *e = getenv("FAKECUDA_INIT_ERROR");
  if (e && atoi(e)) return atoi(e);
  if (flags != 0) return INVALID_VALUE;
  const char *lock = getenv("FAKECUDA_GPU_LOCK");
  if (lock && gpu_fd < 0) gpu_fd = open(lock, O_RDWR | O_CREAT | O_CLOEXEC, 0666);
  inited = 1;
  return OK;
}

EXPORT CUresult cuDriverGetVersion(int *v) {
  *v = 12040;
  return OK;
}

static const struct {
  int code;
  const char *name, *desc;
} errs[] = {
    {0, "CUDA_SUCCESS", "no error"},
    {1, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
    {2, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
    {3, "CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
    {100, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected"},
    {101, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"},
    {201, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context"},
    {401, "CUDA_ERROR_ILLEGAL_STATE", "the operation is not permitted"},
    {712, "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED", "part or all of the requested memory range is already mapped"},
    {713, "CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED", "pointer does not correspond to a registered memory region"},
    {700, "CUDA_ERROR_ILLEGAL_ADDRESS", "an illegal memory access was encountered"},
    {719, "CUDA_ERROR_LAUNCH_FAILED", "unspecified launch failure"},
    {226, "CUDA_ERROR_CONTAINED", "error contained by the GPU"},
    {721, "CUDA_ERROR_TENSOR_MEMORY_LEAK", "tensor memory not completely deallocated"},
    {805, "CUDA_ERROR_MPS_CONNECTION_FAILED", "MPS client failed to connect to the MPS control daemon or the MPS server"},
    {806, "CUDA_ERROR_MPS_RPC_FAILURE", "the remote procedural call between the MPS server and the MPS client failed"},
    {807, "CUDA_ERROR_MPS_SERVER_NOT_READY", "MPS server is not ready to accept new MPS client requests"},
    {808, "CUDA_ERROR_MPS_MAX_CLIENTS_REACHED", "the hardware resources required to create MPS client have been exhausted"},
    {809, "CUDA_ERROR_MPS_MAX_CONNECTIONS_REACHED", "the hardware resources required to support device connections have been exhausted"},
    {810, "CUDA_ERROR_MPS_CLIENT_TERMINATED", "the MPS client has been terminated by the server"},
    {911, "CUDA_ERROR_EXTERNAL_DEVICE", "an async error occurred in a device outside of CUDA"},
    {900, "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED", "operation not permitted when stream is capturing"},
    {901, "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED", "operation failed due to a previous error during capture"},
};

static CUresult lookup(CUresult e, const char **p, int desc) {
  for (size_t i = 0; i < sizeof errs / sizeof errs[0]; i++)
    if (errs[i].code == e) {
      *p = desc ? errs[i].desc : errs[i].name;
      return OK;
    }
  *p = NULL;
  return INVALID_VALUE;
}

EXPORT CUresult cuGetErrorName(CUresult e, const char **p) { return lookup(e, p, 0); }
EXPORT CUresult cuGetErrorString(CUresult e, const char **p) { return lookup(e, p, 1); }

EXPORT CUresult cuDeviceGetCount(int *n) {
  if (!inited) return NOT_INITIALIZED;
  *n = ndevices();
  return OK;
}

EXPORT CUresult cuDeviceGet(CUdevice *d, int ordinal) {
  if (!inited) return NOT_INITIALIZED;
  if (ordinal < 0 || ordinal >= ndevices()) return INVALID_DEVICE;
  *d = ordinal;
  return OK;
}

EXPORT CUresult cuDeviceGetName(char *name, int len, CUdevice d) {
  if (!inited) return NOT_INITIALIZED;
  snprintf(name, (size_t)len, "Fake CUDA Device %d", d);
  return OK;
}

EXPORT CUresult cuDeviceTotalMem_v2(size_t *b, CUdevice d) {
  if (!inited) return NOT_INITIALIZED;
  (void)d;
  *b = MEM_PER_DEVICE;
  return OK;
}

/* The device's UUID: "fakecuda" and then the ordinal, 16 bytes. */
EXPORT CUresult cuDeviceGetUuid_v2(unsigned char *uuid, CUdevice d) {
  if (!inited) return NOT_INITIALIZED;
  if (d < 0 || d >= ndevices() || uuid == NULL) return INVALID_VALUE;
  memcpy(uuid, "fakecuda\0\0\0\0\0\0\0", 15);
  uuid[15] = (unsigned char)d;
  return OK;
}

/* Primary context retains in this process, read by tests through dlsym:
 * a process that opens its GPUs without a context (a server under MPS)
 * must make none. */
EXPORT long long fakecu_ctx_retains;

EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext *c, CUdevice d) {
  if (!inited) return NOT_INITIALIZED;
  if (d < 0 || d >= ndevices()) return INVALID_DEVICE;
  __atomic_add_fetch(&fakecu_ctx_retains, 1, __ATOMIC_RELAXED);
  pthread_mutex_lock(&mu);
  ctxs[d].dev = d;
  ctxs[d].refs++;
  pthread_mutex_unlock(&mu);
  *c = &ctxs[d];
  return OK;
}

EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice d) {
  if (d < 0 || d >= MAXDEV) return INVALID_DEVICE;
  pthread_mutex_lock(&mu);
  pending_t *drop = NULL;
  if (ctxs[d].refs > 0 && --ctxs[d].refs == 0) {
    /* The context goes, and its queued work with it, undone. */
    ctxs[d].sticky = 0;
    drop = ctxs[d].pending;
    ctxs[d].pending = NULL;
    ctxs[d].pending_tail = NULL;
  }
  pthread_mutex_unlock(&mu);
  while (drop != NULL) {
    pending_t *next = drop->next;
    free(drop);
    drop = next;
  }
  return OK;
}

EXPORT CUresult cuCtxSetCurrent(CUcontext c) {
  if (!inited) return NOT_INITIALIZED;
  cur = c;
  return OK;
}

/* Context synchronizations, read by tests through dlsym. */
EXPORT long long fakecu_ctx_syncs;

/* Waits for all the context's work: here, does the legacy default
 * stream's queued memsets, which nothing else waits for. */
/* Does the legacy default stream's queued work (cur's). */
static void drain_default(void);

EXPORT CUresult cuCtxSynchronize(void) {
  NEED_CTX();
  __atomic_add_fetch(&fakecu_ctx_syncs, 1, __ATOMIC_RELAXED);
  drain_default();
  return OK;
}

static void drain_default(void) {
  pthread_mutex_lock(&mu);
  pending_t *p = cur->pending;
  cur->pending = NULL;
  cur->pending_tail = NULL;
  pthread_mutex_unlock(&mu);
  while (p != NULL) {
    pending_t *next = p->next;
    memset(p->dst, p->v, p->n);
    free(p);
    p = next;
  }
}

EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t n) {
  NEED_CTX();
  if (n == 0) return INVALID_VALUE;
  pthread_mutex_lock(&mu);
  if (cur->allocated + (long long)n > (long long)MEM_PER_DEVICE) {
    pthread_mutex_unlock(&mu);
    return OUT_OF_MEMORY;
  }
  cur->allocated += (long long)n;
  pthread_mutex_unlock(&mu);
  /* A 256-byte header keeps the size and the 256-byte alignment. */
  unsigned char *b = aligned_alloc(256, 256 + ((n + 255) & ~(size_t)255));
  if (b == NULL) return OUT_OF_MEMORY;
  *(size_t *)b = n;
  /* Real device memory is not zeroed; make reliance on zeros visible. */
  memset(b + 256, 0xA5, n);
  COUNT(0, 1);
  COUNT(7, (long long)n);
  *p = (CUdeviceptr)(uintptr_t)(b + 256);
  return OK;
}

EXPORT CUresult cuMemFree_v2(CUdeviceptr p) {
  NEED_CTX();
  if (p == 0) return INVALID_VALUE;
  unsigned char *b = (unsigned char *)(uintptr_t)p - 256;
  size_t n = *(size_t *)b;
  pthread_mutex_lock(&mu);
  cur->allocated -= (long long)n;
  pthread_mutex_unlock(&mu);
  free(b);
  COUNT(0, -1);
  COUNT(7, -(long long)n);
  return OK;
}

EXPORT CUresult cuMemGetInfo_v2(size_t *free_b, size_t *total) {
  NEED_CTX();
  *total = MEM_PER_DEVICE;
  *free_b = MEM_PER_DEVICE - (size_t)cur->allocated;
  return OK;
}

EXPORT CUresult cuMemHostAlloc(void **p, size_t n, unsigned int flags) {
  NEED_CTX();
  if (n == 0 || (flags & ~7u)) return INVALID_VALUE;
  *p = malloc(n);
  if (*p == NULL) return OUT_OF_MEMORY;
  COUNT(1, 1);
  return OK;
}

/* The registered host ranges, process-wide as the driver keeps them: a
 * range that overlaps one already registered is refused with
 * CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED, and unregistering a pointer
 * that is not the base of one with CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED,
 * as the real driver does (it does not count registrations). */
typedef struct {
  uintptr_t base;
  size_t n;
} host_range_t;
static host_range_t *host_ranges;
static int nhost_ranges, cap_host_ranges;

EXPORT CUresult cuMemHostRegister_v2(void *p, size_t n, unsigned int flags) {
  NEED_CTX();
  if (p == NULL || n == 0 || (flags & ~15u)) return INVALID_VALUE;
  const char *refuse = getenv("FAKECUDA_REGISTER_ERROR");
  if (refuse && atoi(refuse)) return atoi(refuse);
  uintptr_t b = (uintptr_t)p;
  pthread_mutex_lock(&mu);
  for (int i = 0; i < nhost_ranges; i++) {
    host_range_t *r = &host_ranges[i];
    if (b < r->base + r->n && r->base < b + n) {
      pthread_mutex_unlock(&mu);
      return HOST_MEMORY_ALREADY_REGISTERED;
    }
  }
  if (nhost_ranges == cap_host_ranges) {
    int cap = cap_host_ranges ? 2 * cap_host_ranges : 16;
    host_range_t *nr = realloc(host_ranges, (size_t)cap * sizeof *nr);
    if (nr == NULL) {
      pthread_mutex_unlock(&mu);
      return OUT_OF_MEMORY;
    }
    host_ranges = nr;
    cap_host_ranges = cap;
  }
  host_ranges[nhost_ranges++] = (host_range_t){b, n};
  pthread_mutex_unlock(&mu);
  /* Page-locking makes the whole range resident, as the real driver does
   * ("page-locks the memory range"): touch every page. */
  for (size_t i = 0; i < n; i += 4096) (void)((volatile const char *)p)[i];
  COUNT(1, 1); /* counted with host allocations: each must be undone */
  return OK;
}

EXPORT CUresult cuMemHostUnregister(void *p) {
  NEED_CTX();
  if (p == NULL) return INVALID_VALUE;
  static int unregisters;
  const char *fail = getenv("FAKECUDA_UNREGISTER_ERROR");
  if (fail && atoi(fail) && __atomic_fetch_add(&unregisters, 1, __ATOMIC_RELAXED) == 0) return atoi(fail);
  pthread_mutex_lock(&mu);
  int i = 0;
  while (i < nhost_ranges && host_ranges[i].base != (uintptr_t)p) i++;
  if (i == nhost_ranges) {
    pthread_mutex_unlock(&mu);
    return HOST_MEMORY_NOT_REGISTERED;
  }
  host_ranges[i] = host_ranges[--nhost_ranges];
  pthread_mutex_unlock(&mu);
  COUNT(1, -1);
  return OK;
}

EXPORT CUresult cuMemFreeHost(void *p) {
  NEED_CTX();
  free(p);
  COUNT(1, -1);
  return OK;
}

EXPORT CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t n) {
  NEED_CTX();
  memcpy((void *)(uintptr_t)dst, src, n);
  return OK;
}

/* Plover keeps copies, memsets and events out of captures. */
static CUresult stream_op(CUstream s) {
  if (s == NULL) return INVALID_VALUE; /* never the NULL stream */
  if (s->capturing) {
    s->invalidated = 1;
    return CAPTURE_UNSUPPORTED;
  }
  return OK;
}

EXPORT CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void *src, size_t n, CUstream s) {
  NEED_CTX();
  CUresult e = stream_op(s);
  if (e || (e = count_copy(0, n))) return e;
  memcpy((void *)(uintptr_t)dst, src, n);
  return OK;
}

EXPORT CUresult cuMemcpyDtoHAsync_v2(void *dst, CUdeviceptr src, size_t n, CUstream s) {
  NEED_CTX();
  CUresult e = stream_op(s);
  if (e || (e = count_copy(1, n))) return e;
  memcpy(dst, (const void *)(uintptr_t)src, n);
  return OK;
}

EXPORT CUresult cuMemsetD8Async(CUdeviceptr dst, unsigned char v, size_t n, CUstream s) {
  NEED_CTX();
  CUresult e = stream_op(s);
  if (e) return e;
  memset((void *)(uintptr_t)dst, v, n);
  return OK;
}

EXPORT CUresult cuStreamCreate(CUstream *s, unsigned int flags) {
  NEED_CTX();
  *s = calloc(1, sizeof **s);
  if (*s == NULL) return OUT_OF_MEMORY;
  (*s)->flags = flags;
  COUNT(2, 1);
  return OK;
}

/* Priorities from 0 (the lowest, a plain stream's) to -5; one outside is
 * clamped to the range, as the driver does. */
enum { PRIO_LEAST = 0, PRIO_GREATEST = -5 };

EXPORT CUresult cuCtxGetStreamPriorityRange(int *least, int *greatest) {
  NEED_CTX();
  if (least) *least = PRIO_LEAST;
  if (greatest) *greatest = PRIO_GREATEST;
  return OK;
}

EXPORT CUresult cuStreamCreateWithPriority(CUstream *s, unsigned int flags, int priority) {
  CUresult e = cuStreamCreate(s, flags);
  if (e) return e;
  (*s)->priority = priority > PRIO_LEAST ? PRIO_LEAST : priority < PRIO_GREATEST ? PRIO_GREATEST : priority;
  return OK;
}

EXPORT CUresult cuStreamGetPriority(CUstream s, int *priority) {
  NEED_CTX();
  if (s == NULL || priority == NULL) return INVALID_VALUE;
  *priority = s->priority;
  return OK;
}

EXPORT CUresult cuStreamDestroy_v2(CUstream s) {
  NEED_CTX();
  if (s == NULL) return INVALID_VALUE;
  free(s);
  COUNT(2, -1);
  return OK;
}

EXPORT CUresult cuStreamSynchronize(CUstream s) {
  NEED_CTX();
  /* CU_STREAM_LEGACY, CU_STREAM_PER_THREAD: the default streams' work. */
  if (s == (CUstream)0x1 || s == (CUstream)0x2) {
    drain_default();
    return OK;
  }
  return stream_op(s);
}

static void graph_free(CUgraph g) {
  for (int i = 0; i < g->n; i++) free(g->nodes[i].args);
  free(g->nodes);
  free(g);
}

EXPORT CUresult cuStreamBeginCapture_v2(CUstream s, int mode) {
  NEED_CTX();
  if (s == NULL || s->flags != 1 || mode != 1 || s->capturing) return INVALID_VALUE;
  s->g = calloc(1, sizeof *s->g);
  if (s->g == NULL) return OUT_OF_MEMORY;
  s->capturing = 1;
  s->invalidated = 0;
  return OK;
}

EXPORT CUresult cuStreamEndCapture(CUstream s, CUgraph *g) {
  NEED_CTX();
  if (s == NULL || !s->capturing) return ILLEGAL_STATE;
  s->capturing = 0;
  if (s->invalidated) {
    graph_free(s->g);
    s->g = NULL;
    *g = NULL;
    return CAPTURE_INVALIDATED;
  }
  *g = s->g;
  s->g = NULL;
  COUNT(4, 1);
  return OK;
}

EXPORT CUresult cuGraphDestroy(CUgraph g) {
  if (g == NULL) return INVALID_VALUE;
  graph_free(g);
  COUNT(4, -1);
  return OK;
}

EXPORT CUresult cuGraphInstantiateWithFlags(CUgraphExec *x, CUgraph g, unsigned long long flags) {
  NEED_CTX();
  if (g == NULL || flags != 0) return INVALID_VALUE;
  CUgraphExec e = calloc(1, sizeof *e);
  e->nodes = calloc((size_t)g->n + 1, sizeof *e->nodes);
  e->n = g->n;
  memcpy(e->nodes, g->nodes, (size_t)g->n * sizeof *e->nodes);
  /* The exec owns the argument blocks from now on; the graph forgets them. */
  for (int i = 0; i < g->n; i++) g->nodes[i].args = NULL;
  *x = e;
  COUNT(5, 1);
  return OK;
}


static void run_kernel(fk_kernel fn, void *args, int grid, int block) {
  const char *us = getenv("FAKECUDA_KERNEL_US");
  long hold = us ? atol(us) : 0;
  if (hold <= 0) {
    fn(args, grid, block);
    COUNT(6, 1);
    return;
  }
  pthread_mutex_lock(&gpu_mu);
  if (gpu_fd >= 0) flock(gpu_fd, LOCK_EX);
  int64_t until = now_ns() + hold * 1000;
  fn(args, grid, block);
  COUNT(6, 1);
  for (int64_t left; (left = until - now_ns()) > 0;) {
    struct timespec ts = {left / 1000000000, left % 1000000000};
    nanosleep(&ts, NULL);
  }
  if (gpu_fd >= 0) flock(gpu_fd, LOCK_UN);
  pthread_mutex_unlock(&gpu_mu);
}

static void run_node(const node_t *nd) { run_kernel(nd->fn, nd->args, nd->grid, nd->block); }

#ifndef FAKECUDA_OMIT_GRAPH_LAUNCH
EXPORT CUresult cuGraphLaunch(CUgraphExec x, CUstream s) {
  NEED_CTX();
  if (x == NULL) return INVALID_VALUE;
  CUresult e = stream_op(s);
  if (e) return e;
  for (int i = 0; i < x->n && !cur->sticky; i++) run_node(&x->nodes[i]);
  return OK;
}
#endif

EXPORT CUresult cuGraphExecDestroy(CUgraphExec x) {
  if (x == NULL) return INVALID_VALUE;
  for (int i = 0; i < x->n; i++) free(x->nodes[i].args);
  free(x->nodes);
  free(x);
  COUNT(5, -1);
  return OK;
}

EXPORT CUresult cuEventCreate(CUevent *e, unsigned int flags) {
  NEED_CTX();
  if (flags != 0) return INVALID_VALUE; /* Plover needs timing events */
  *e = calloc(1, sizeof **e);
  COUNT(3, 1);
  return OK;
}

EXPORT CUresult cuEventRecord(CUevent e, CUstream s) {
  NEED_CTX();
  CUresult r = stream_op(s);
  if (r) return r;
  e->t = now_ns();
  return OK;
}

EXPORT CUresult cuEventElapsedTime(float *ms, CUevent a, CUevent b) {
  NEED_CTX();
  *ms = (float)(b->t - a->t) / 1e6f;
  return OK;
}

EXPORT CUresult cuEventDestroy_v2(CUevent e) {
  NEED_CTX();
  free(e);
  COUNT(3, -1);
  return OK;
}

/* ---- what a bundle's cudart would do, for fakebundle.c ---- */

/* A kernel launch; returns a cudaError_t-like code (9: invalid configuration). */
EXPORT int fakecu_launch(void *stream, int grid, int block, fk_kernel fn,
                         const void *args, size_t argsz) {
  if (!inited || cur == NULL) return 201;
  if (cur->sticky) return cur->sticky;
  CUstream s = stream;
  if (s == NULL) return 1;
  if (grid < 1 || block < 1 || block > 1024) {
    if (s->capturing) s->invalidated = 1;
    return 9;
  }
  if (!s->capturing) {
    run_kernel(fn, (void *)args, grid, block);
    return 0;
  }
  CUgraph g = s->g;
  if (g->n == g->cap) {
    g->cap = g->cap ? 2 * g->cap : 8;
    g->nodes = realloc(g->nodes, (size_t)g->cap * sizeof *g->nodes);
  }
  node_t *nd = &g->nodes[g->n++];
  nd->fn = fn;
  nd->grid = grid;
  nd->block = block;
  nd->args = malloc(argsz ? argsz : 1);
  memcpy(nd->args, args, argsz);
  return 0;
}

/* cudaMemset on the legacy default stream, as a hook may do: queued, and
 * done at the next synchronize of a default stream (CU_STREAM_LEGACY,
 * CU_STREAM_PER_THREAD) or the context, never by synchronizing a
 * non-blocking stream (an instance's), which does not wait for the legacy
 * stream. The latest schedule the real driver allows: it shows whether
 * Plover waits for such work before the first request. */
EXPORT int fakecu_memset_default(void *dst, int v, size_t n) {
  if (!inited || cur == NULL) return 201;
  if (cur->sticky) return cur->sticky;
  pending_t *p = malloc(sizeof *p);
  if (p == NULL) return 2;
  *p = (pending_t){dst, (unsigned char)v, n, NULL};
  pthread_mutex_lock(&mu);
  if (cur->pending_tail == NULL) cur->pending_tail = &cur->pending;
  *cur->pending_tail = p;
  cur->pending_tail = &p->next;
  pthread_mutex_unlock(&mu);
  return 0;
}

/* cudaStreamSynchronize from inside an entry point: illegal while capturing. */
EXPORT int fakecu_stream_sync(void *stream) {
  CUstream s = stream;
  if (s != NULL && s->capturing) {
    s->invalidated = 1;
    return 900;
  }
  return 0;
}

/* Called by a kernel body: what an out-of-bounds store does to a context. */
EXPORT void fakecu_fault(int code) {
  const char *e = getenv("FAKECUDA_FAULT");
  if (e && atoi(e)) code = atoi(e);
  if (cur != NULL) cur->sticky = code;
}
