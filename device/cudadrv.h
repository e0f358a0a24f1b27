/*
 * cudadrv.h — Plover's shim over the CUDA driver API.
 *
 * The package must build with Go and gcc alone, so nothing here includes
 * cuda.h or links -lcuda: the few types are declared below with the values
 * cuda.h gives them, and cudadrv.c dlopens libcuda.so.1 and resolves the
 * versioned entry points into a table (plcu_driver_t). A driver that lacks
 * one is refused when it is opened, never at the first call.
 *
 * Every function that touches the GPU takes the context and makes it current
 * on the calling thread first: Go moves goroutines between OS threads
 * between cgo calls, so "current" cannot be assumed to persist.
 */
#ifndef PLOVER_CUDADRV_H
#define PLOVER_CUDADRV_H

#include <stddef.h>
#include <stdint.h>

#include "host_run.h" /* plover_step_t, plover_timing_t, plover_state_t */

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef struct CUctx_st *CUcontext;
typedef struct CUstream_st *CUstream;
typedef struct CUevent_st *CUevent;
typedef struct CUgraph_st *CUgraph;
typedef struct CUgraphExec_st *CUgraphExec;

#define PLCU_SUCCESS 0
#define PLCU_STREAM_NON_BLOCKING 0x1          /* CU_STREAM_NON_BLOCKING */
#define PLCU_CAPTURE_MODE_THREAD_LOCAL 1      /* CU_STREAM_CAPTURE_MODE_THREAD_LOCAL */
#define PLCU_MEMHOSTALLOC_PORTABLE 0x1        /* CU_MEMHOSTALLOC_PORTABLE */
#define PLCU_MEMHOSTREGISTER_PORTABLE 0x1     /* CU_MEMHOSTREGISTER_PORTABLE */
#define PLCU_EVENT_DEFAULT 0x0                /* CU_EVENT_DEFAULT: timing enabled */

/* Must equal abi.MaxChainLength; cudadev.go checks it at compile time. */
#define PLCU_MAX_STEPS 64
/* Graphs kept per instance: one per chain and lengths, so batch sizes (a
 * power-of-two bucket each) replay side by side. */
#define PLCU_GRAPHS 8

typedef struct plcu_driver plcu_driver_t;

/* Run modes, chosen by the Go side (cudadev.go keeps the graph state). */
enum {
  PLCU_DIRECT = 0,  /* call every entry point */
  PLCU_CAPTURE = 1, /* capture the entries into a graph, keep it, launch it */
  PLCU_REPLAY = 2   /* launch the kept graph; entries are not called */
};

/* What one plcu_run did. Pointers are static strings (driver names, op names,
 * or the bundle's own error message, which plover.h says outlives the call). */
typedef struct {
  plover_timing_t t;
  CUresult err;           /* first driver error that failed the request */
  const char *err_op;     /* the driver call that returned it */
  const char *kernel_err; /* the bundle's plover_last_error, or NULL */
  int ran;                /* the mode that actually produced the output */
  int reached;            /* the chain was launched: a sticky error met
                             before it came from other work in the context */
  CUresult capture_err;   /* nonzero: a capture or replay failed and the */
  const char *capture_op; /*   chain ran directly instead */
  const char *capture_kernel_err; /* bundle error seen while capturing */
} plcu_result_t;

/* One instance: everything a request touches lives in C memory so that the
 * bundle may keep &s->... during the call and async copies can outlive no Go
 * frame. */
typedef struct {
  const plcu_driver_t *drv;
  CUcontext ctx;
  CUstream stream;
  CUevent ev[4];
  CUdeviceptr d_in, d_tmp, d_out;
  void *h_in, *h_out; /* pinned staging, MaxInput and Out bytes */
  int h_ext;          /* h_in/h_out are the caller's buffer, registered */
  CUresult host_err;  /* why the caller's buffer was not registered (0: it
                         was, or none was given) */
  size_t piece;       /* a run's copies go in async pieces of at most this
                         many bytes, so that another context's copy waits
                         behind one piece on the copy engine (0: whole) */
  CUgraphExec exec[PLCU_GRAPHS]; /* cached graphs (slots chosen by Go), or NULL */
  size_t exec_out_used[PLCU_GRAPHS]; /* out.len as the entries left it when recorded */
  plover_inst_state_t state;
  plcu_result_t res;
  plover_step_t steps[PLCU_MAX_STEPS];
} plcu_inst_t;

/* Opens path (normally "libcuda.so.1") and resolves every entry point. On
 * failure returns NULL and writes the reason to err. Never unloaded. */
plcu_driver_t *plcu_open(const char *path, char *err, size_t errlen);
CUresult plcu_init(const plcu_driver_t *d);
CUresult plcu_driver_version(const plcu_driver_t *d, int *v);
/* NULL when the driver does not know the code. */
const char *plcu_error_name(const plcu_driver_t *d, CUresult e);
const char *plcu_error_string(const plcu_driver_t *d, CUresult e);

CUresult plcu_device_count(const plcu_driver_t *d, int *n);
/* Retains the primary context of device ordinal, and reads the range of
 * its stream priorities (*prio_least is the lowest, usually 0; a greater
 * priority is a smaller number). */
CUresult plcu_device_open(const plcu_driver_t *d, int ordinal, CUdevice *dev,
                          CUcontext *ctx, char *name, int namelen,
                          size_t *total, int *prio_least, int *prio_greatest,
                          const char **op);
/* Reads device ordinal's name, memory and UUID (cuDeviceGetUuid_v2's 16
 * bytes; *has_uuid is 0 where the driver lacks it) without touching a
 * context: no primary context is retained or made, so under MPS the
 * process does not become a client of the GPU's MPS server. */
CUresult plcu_device_info(const plcu_driver_t *d, int ordinal, CUdevice *dev,
                          char *name, int namelen, size_t *total,
                          unsigned char uuid[16], int *has_uuid,
                          const char **op);
CUresult plcu_device_close(const plcu_driver_t *d, CUdevice dev);

CUresult plcu_mem_info(const plcu_driver_t *d, CUcontext ctx, size_t *free_b,
                       size_t *total_b);
CUresult plcu_alloc(const plcu_driver_t *d, CUcontext ctx, size_t n,
                    CUdeviceptr *p);
CUresult plcu_free(const plcu_driver_t *d, CUcontext ctx, CUdeviceptr p);
CUresult plcu_host_alloc(const plcu_driver_t *d, CUcontext ctx, size_t n,
                         void **p);
CUresult plcu_host_free(const plcu_driver_t *d, CUcontext ctx, void *p);
/* Pins memory the process already has (a worker's slot), for every
 * context: copies between it and a device then run at DMA speed. */
CUresult plcu_host_register(const plcu_driver_t *d, CUcontext ctx, void *p,
                            size_t n);
CUresult plcu_host_unregister(const plcu_driver_t *d, CUcontext ctx, void *p);
/* plcu_copy_probe times iters plain synchronous copies of n bytes from h
 * (pinned: registered or allocated so) to a device allocation of its own,
 * then iters back, on the host's monotonic clock: the floor the copy
 * benchmark sets Run's copies beside. *op names the call that failed. */
CUresult plcu_copy_probe(const plcu_driver_t *d, CUcontext ctx, void *h,
                         size_t n, int iters, int64_t *ns_in, int64_t *ns_out,
                         const char **op);
CUresult plcu_htod(const plcu_driver_t *d, CUcontext ctx, CUdeviceptr dst,
                   const void *src, size_t n);

/* Allocates an instance with its stream (at priority: its function's class,
 * within the device's range), events, device buffers and pinned staging: host (host_out + out bytes, input then output from host_out), registered in
 * place, when it is not NULL and the driver accepts it (else host_err says
 * why, and the instance has staging of its own); runs whose src and dst
 * are those halves then copy nothing on the host. The caller keeps host
 * mapped until plcu_inst_destroy. On failure nothing is left allocated and
 * *op names the call. */
CUresult plcu_inst_create(const plcu_driver_t *d, CUcontext ctx, size_t max_in,
                          size_t tmp, size_t out, CUdeviceptr constant,
                          size_t constant_len, void *host, size_t host_out, int abi1,
                          void *program, int priority, plcu_inst_t **inst,
                          const char **op);
/* The priority the instance's stream was made with (for tests). */
CUresult plcu_inst_stream_priority(plcu_inst_t *in, int *priority);
/* Runs an instance hook (plover_instance_init/fini) on the instance's state
 * and stream and waits for the stream and the context: returns the bundle's error, or NULL
 * with *e set when a driver call failed (*op names it). *reached is set to 1
 * just before the hook is called: a sticky error met while it is still 0
 * was other work's (the hook ran nothing). */
const char *plcu_inst_hook(plcu_inst_t *in, void *hook, void *last_error,
                           CUresult *e, const char **op, int *reached);
/* Runs plover_load or plover_unload with the constants writable and
 * s->program = *program, on a stream of its own (valid during the call
 * only), and waits for it and the context; *program receives s->program. Errors as
 * plcu_inst_hook. */
const char *plcu_program_hook(const plcu_driver_t *d, CUcontext ctx,
                              void *hook, void *last_error,
                              CUdeviceptr constant, size_t constant_len,
                              void **program, CUresult *e, const char **op,
                              int *reached);
/* skip_gpu: the context is poisoned; free only the C struct. */
void plcu_inst_destroy(plcu_inst_t *in, int skip_gpu);

/* One whole request; the result is in in->res. slot (0..PLCU_GRAPHS-1) is
 * the graph a REPLAY launches or a CAPTURE replaces. */
void plcu_run(plcu_inst_t *in, const void *src, size_t in_len, void *dst,
              size_t out_len, size_t tmp_len, uint32_t items, int zero,
              int nsteps, int mode, int slot, void *last_error);

#endif
