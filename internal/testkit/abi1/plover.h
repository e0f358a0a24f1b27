/* The ABI 1 header exactly as released, kept so the tests build an ABI 1 bundle and prove it still loads. Do not edit. */
/*
 * plover.h — the Plover bundle ABI, version 1.
 *
 * A bundle is a shared library of kernel entry points plus a manifest
 * (plover.json) naming the chain to run. For every request the runtime fills a
 * plover_state_t and calls each entry of the chain in order, on one thread,
 * with no host work in between:
 *
 *     void entry(plover_state_t *s, int grid, int block);
 *
 *   s->input     the request body on the device; len = the request's byte
 *                count (<= manifest max_input_bytes). Read-only.
 *   s->constant  the bundle's constants file on the device, loaded once per
 *                function version and shared read-only by all instances.
 *                dat is NULL and len 0 when the bundle has no constants.
 *   s->tmp       scratch owned by this instance (tmp_bytes). Zeroed before
 *                every request when the manifest sets zero_tmp, otherwise it
 *                keeps whatever the previous request on this instance left.
 *   s->out       the response (out_bytes), owned by this instance; all
 *                out_bytes are returned. Zeroed before every request (so
 *                no byte of an earlier response shows through) unless the
 *                manifest sets "zero_out": false.
 *   s->stream    the cudaStream_t to launch on (CUDA target); NULL on the
 *                host target. Never launch on the default stream.
 *
 * grid and block come from the manifest (or a per-request override). An
 * entry must not call back into the runtime, block, or keep pointers into s
 * after it returns.
 *
 * Every bundle invokes PLOVER_BUNDLE("host") or PLOVER_BUNDLE("cuda") in
 * exactly one source file. The runtime refuses a bundle whose
 * plover_abi_version or plover_target does not match its device.
 *
 * Errors: an entry reports failure with plover_fail(s, "message"); the
 * runtime stops nothing mid-chain but fails the request (HTTP 500) with that
 * message after the chain. On the CUDA target a pending cudaGetLastError()
 * is reported the same way. Field order and the buf_t/state_t aliases match
 * PyPlover, so its kernels port by recompiling.
 */
#ifndef PLOVER_H
#define PLOVER_H

#include <stddef.h>
#include <stdint.h>

#define PLOVER_ABI_VERSION 1

#ifdef __cplusplus
#define PLOVER_EXTERN_C extern "C"
#else
#define PLOVER_EXTERN_C
#endif
#define PLOVER_EXPORT PLOVER_EXTERN_C __attribute__((visibility("default")))

typedef struct plover_buf {
  uint8_t *dat;
  size_t len;
} plover_buf_t;

typedef struct plover_state {
  plover_buf_t input;
  plover_buf_t constant;
  plover_buf_t tmp;
  plover_buf_t out;
  void *stream;
} plover_state_t;

/* PyPlover names. */
typedef plover_buf_t buf_t;
typedef plover_state_t state_t;

typedef void (*plover_entry_fn)(plover_state_t *s, int grid, int block);

/* Declares a kernel entry point with the exported, unmangled name `name`. */
#define PLOVER_ENTRY(name) \
  PLOVER_EXPORT void name(plover_state_t *s, int grid, int block)

/*
 * The runtime resolves these symbols in every bundle:
 *   const uint32_t plover_abi_version;       PLOVER_ABI_VERSION when built
 *   const char     plover_target[];          "host" or "cuda"
 *   const char    *plover_last_error(void);  NULL, or the first error since
 *                                            the last call (then cleared):
 *                                            plover_fail's message, else the
 *                                            pending CUDA error's name. The
 *                                            CUDA error is read and cleared
 *                                            on every call, so it never
 *                                            leaks into a later request.
 * The error slot is thread-local: the runtime runs a whole chain, and reads
 * the error, on one thread.
 */
#ifdef __CUDACC__
/* Reads and clears the calling thread's pending CUDA error: NULL or its name. */
static inline const char *plover_take_device_error_(void) {
  cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? NULL : cudaGetErrorName(e);
}
#else
static inline const char *plover_take_device_error_(void) { return NULL; }
#endif

#define PLOVER_BUNDLE(target)                                               \
  PLOVER_EXPORT const uint32_t plover_abi_version = PLOVER_ABI_VERSION;     \
  PLOVER_EXPORT const char plover_target[] = target;                        \
  static __thread const char *plover_error_;                                \
  PLOVER_EXPORT void plover_set_error_(const char *msg) {                   \
    if (plover_error_ == NULL) plover_error_ = msg;                         \
  }                                                                         \
  PLOVER_EXPORT const char *plover_last_error(void) {                       \
    const char *m = plover_error_;                                          \
    const char *d = plover_take_device_error_(); /* always read and cleared */ \
    plover_error_ = NULL;                                                   \
    return m != NULL ? m : d;                                               \
  }                                                                         \
  typedef int plover_bundle_defined_once_

/* Records a failure for this request; msg must be a string literal or
 * otherwise outlive the request. The first failure wins. */
PLOVER_EXTERN_C void plover_set_error_(const char *msg);
#define plover_fail(s, msg) ((void)(s), plover_set_error_(msg))

#endif /* PLOVER_H */
