/*
 * plover.h — the Plover bundle ABI, version 2.2.
 *
 * A bundle is a shared library of entry points plus a manifest (plover.json)
 * naming the chain to run. For every request the runtime fills a
 * plover_state_t and calls each entry of the chain in order, on one thread,
 * with no host work in between. Chains of other instances of the function,
 * and their plover_instance_init and _fini, may run at the same time on
 * other threads (a worker serves each instance apart, and the host device
 * runs up to twice the CPUs at once):
 *
 *     PLOVER_ENTRY(name) { ... }   // void name(plover_state_t *s, int grid, int block)
 *
 * ENTRIES ARE HOST CODE. They run on the CPU and launch kernels; on the CUDA
 * target every dat pointer below is device memory, so an entry that reads
 * s->input.dat[0] itself crashes. Read lengths, launch kernels, that's all.
 *
 *   s->input     the request body; len = its byte count (<= max_input_bytes).
 *                Read-only.
 *   s->constant  the bundle's constants file, byte for byte (no header), put
 *                on the device once per function version and shared
 *                read-only by all instances; dat NULL and len 0 without one.
 *   s->tmp       scratch owned by this instance (tmp_bytes). Zeroed before
 *                every request when the manifest sets zero_tmp; otherwise it
 *                keeps what the previous request on this instance left.
 *   s->out       the response, owned by this instance; len = out_bytes.
 *                Zeroed before every request (no byte of an earlier response
 *                shows through) unless the manifest sets "zero_out": false.
 *                An entry may LOWER out.len: the response is the first
 *                out.len bytes after the chain. Raising it fails the request.
 *   s->stream    the cudaStream_t to launch on (CUDA); NULL on the host
 *                target. Never launch on the default stream.
 *   s->program   yours: what plover_load left there (else NULL), the same
 *                for every instance of this version on this device, so
 *                used by several at once: what it points to must be
 *                read-only or synchronised (a library handle such as
 *                cuBLAS's, bound to one stream at a time, belongs in
 *                s->instance: one per instance, from plover_instance_init).
 *   s->instance  yours: what plover_instance_init left there (else NULL).
 *   s->items     (2.1) how many requests this run holds, when the function
 *                batches (see BATCHING); 0 when it does not.
 *
 * input, constant, tmp and out each start 256-byte aligned (cudaMalloc's
 * alignment) on both targets.
 *
 * The runtime resets every field before each request, so an entry that
 * changes one (other than the dat bytes) affects only the current request.
 * grid and block come from the manifest or a per-request override; an entry
 * that ignores either needs no (void)grid: PLOVER_ENTRY marks both unused,
 * so -Wextra does not warn. An entry must not block, call back into the
 * runtime, or keep pointers into s after it returns.
 *
 * CUDA GRAPHS. On the CUDA target an instance runs a chain directly the
 * first time it sees given input, tmp and out lengths, records its launches
 * the second time, and replays the recording from then on: the entries'
 * host code then does NOT run. So an entry's launches (and the out.len it
 * sets) may depend only on the lengths, grid, block and the buffer pointers,
 * never on a counter, the clock or host-side state, and a host-side effect
 * happens a few times per instance, not per request. A chain that needs its
 * host code on every request sets "graph": false in the manifest. Chains
 * given per request never replay; the host target always calls the entries.
 *
 * DECLARED ENTRIES. PLOVER_ENTRY records each entry's name in the bundle
 * (section "plover_entries"); the manifest chain and per-request overrides
 * may name only those. Use PLOVER_ENTRY once per entry, at its definition.
 *
 * LIFECYCLE HOOKS, optional; define any of them with these exact names.
 * plover.h declares them PLOVER_EXPORT, so a definition at global scope
 * is exported under its C name even without PLOVER_EXPORT (which C++'s
 * mangling and -fvisibility=hidden would otherwise need). Deploy refuses
 * an exported function named one typo from a hook (plover_instance_int:
 * it would never be called), and a C++ function of a hook's name with
 * another signature or in a namespace:
 *
 *   PLOVER_EXPORT void plover_load(plover_state_t *s);
 *       Once per version per device, after the constants are on it and
 *       before any instance exists: s->constant is WRITABLE during this
 *       call only (transform weights in place, build tables), s->stream is
 *       a stream valid during the call, input/tmp/out are empty. Set
 *       s->program to share a pointer with every instance.
 *   PLOVER_EXPORT void plover_unload(plover_state_t *s);
 *       When the version is unloaded from the device, after its last
 *       instance, with the constants and s->program: free what plover_load
 *       made. Not called after a failed plover_load.
 *   PLOVER_EXPORT void plover_instance_init(plover_state_t *s);
 *   PLOVER_EXPORT void plover_instance_fini(plover_state_t *s);
 *       Once per instance, after its buffers exist and before they are
 *       freed, with that instance's tmp, out and stream (library handles,
 *       per-instance set-up); init may set s->instance, fini must free what
 *       init made. No fini after a failed init.
 *
 * A hook fails with plover_fail: plover_load's failure fails the load (the
 * request gets HTTP 500 with the message), plover_instance_init's fails the
 * instance creation; repeated failures back the function off like crashes.
 * Failures of fini and unload are ignored. On CUDA the runtime waits for the
 * hook's stream and the default streams (legacy, per-thread) before it goes
 * on; work the hook put on streams of its own it must wait for itself.
 * Hook time is part of the load time.
 * In a worker process (the default isolation) fini runs when the runtime
 * closes an instance and the version stays (an idle instance released).
 * Unloading a version whose worker holds nothing else (a delete, a
 * redeploy, an eviction, scale to zero, the end of plover run) ends that
 * process at once, which frees everything: the fini of the instances
 * closed with it may be cut short, and plover_unload does not run. Both
 * run where the process goes on: in a tenant's shared worker (serve
 * --worker-scope tenant) beside another program, plover_unload within
 * 10 s (past it the worker ends, with the tenant's other programs) and
 * about 1 s at the server's stop; and in-process (--isolation none),
 * unbounded. A killed worker (a crash, a deadline overrun, a faulted GPU)
 * runs no hook.
 *
 * BATCHING (2.1). A bundle that defines PLOVER_BATCHED(n) in one source
 * file says its chain handles up to n requests in one run; its manifest's
 * "batch" section (max_items <= n, item_input_bytes, item_output_bytes)
 * turns batching on; one without the other is refused at deploy. The
 * runtime then gathers concurrent requests, each exactly item_input_bytes,
 * and runs them as one chain: s->items = k (1..max_items), input = the k
 * inputs back to back (len k * item_input_bytes), out = k outputs back to
 * back (len k * item_output_bytes); request i gets out bytes
 * [i * item_output_bytes, (i + 1) * item_output_bytes). Launch for
 * s->items, read sizes from the lengths, and leave out.len as it is. On
 * CUDA, k may be rounded up to a power of two (the extra inputs are zero,
 * their outputs dropped) so that few graph recordings cover every batch
 * size. A run that fails fails every
 * request in it with the same error, but for a refusal (plover_reject): the
 * runtime then runs each of its requests alone (s->items = 1), so that only
 * the one whose input is refused gets the refusal: its batch-mates' inputs
 * then pass through the chain twice (keep no state across runs that this
 * would change). A bundle without
 * PLOVER_BATCHED is never batched.
 *
 * ERRORS. An entry reports failure with plover_fail(s, "message"); the
 * chain still runs to its end, then the request fails (HTTP 500) with the
 * message. On the CUDA target a pending cudaGetLastError() is reported the
 * same way, as a failure from the call that left it: a launch that failed
 * before plover_fail or plover_reject wins over them. 2.2: an entry that
 * finds its input malformed refuses it with plover_reject(s, "message")
 * and returns: the request fails as the client's fault (HTTP 422
 * invalid_input, gRPC InvalidArgument) with the message, up to 255 bytes
 * of it (less a UTF-8 character the cut splits), copied (it may be built
 * on the stack).
 * The first failure or refusal of a request wins; a refusal in a hook is a
 * failure. Call both on the thread the runtime called the entry on: the
 * error slot is that thread's, so a call from a thread the entry started
 * (std::thread, OpenMP) is lost and the request succeeds. Field names and the buf_t/state_t aliases match PyPlover, so its
 * kernels port by recompiling.
 *
 * VERSIONS. plover_abi_version is (major << 16) | minor. A runtime loads
 * bundles of its own major and any minor up to its own (and ABI 1 bundles);
 * later minors only add fields at the end of plover_state_t (taken from
 * reserved room, so its size does not change) and new optional hooks.
 * A change of this header alone keeps the version when bundles built with
 * it and before it speak the same binary ABI: 2.2 came to declare the hooks
 * (above) and to let a CUDA error that came first win over plover_fail and
 * plover_reject, with the same symbols, state and calls.
 */
#ifndef PLOVER_H
#define PLOVER_H

#include <stddef.h>
#include <stdint.h>

#define PLOVER_ABI_MAJOR 2
#define PLOVER_ABI_MINOR 2
#define PLOVER_ABI_VERSION ((PLOVER_ABI_MAJOR << 16) | PLOVER_ABI_MINOR)

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
  uint32_t size;        /* sizeof(plover_state_t) in the runtime: 160 */
  uint32_t abi_version; /* the runtime's PLOVER_ABI_VERSION */
  plover_buf_t input;    /* may point elsewhere each request (a worker's slot): read it from s */
  plover_buf_t constant;
  plover_buf_t tmp;
  plover_buf_t out;      /* as input: never keep the pointer from plover_instance_init */
  void *stream;
  void *program;
  void *instance;
  uint32_t items;        /* 2.1: requests in this run (batching); else 0 */
  uint32_t reserved32_;  /* zero */
  uint64_t reserved_[7]; /* later minors' fields; zero */
} plover_state_t;

/* PyPlover names. */
typedef plover_buf_t buf_t;
typedef plover_state_t state_t;

typedef void (*plover_entry_fn)(plover_state_t *s, int grid, int block);
typedef void (*plover_hook_fn)(plover_state_t *s);

/* The hooks (LIFECYCLE HOOKS), declared so that their definitions get C
 * linkage and default visibility. A declaration alone defines and needs
 * nothing: a bundle without hooks neither exports nor imports them. */
PLOVER_EXPORT void plover_load(plover_state_t *s);
PLOVER_EXPORT void plover_unload(plover_state_t *s);
PLOVER_EXPORT void plover_instance_init(plover_state_t *s);
PLOVER_EXPORT void plover_instance_fini(plover_state_t *s);

/* retain keeps the entry table through the linker's --gc-sections. */
#if defined(__has_attribute)
#if __has_attribute(retain)
#define PLOVER_RETAIN_ retain,
#endif
#endif
#ifndef PLOVER_RETAIN_
#define PLOVER_RETAIN_
#endif

/* Defines an entry point with the exported, unmangled name `name` and
 * declares it in the bundle's entry table. grid and block are marked unused
 * (an attribute, no change to the entry's type): an entry may ignore them. */
#define PLOVER_ENTRY(name)                                                \
  static const char plover_entry_##name##_[] __attribute__((             \
      used, PLOVER_RETAIN_ section("plover_entries"), aligned(1))) = #name; \
  PLOVER_EXPORT void name(plover_state_t *s, int grid __attribute__((unused)), \
                          int block __attribute__((unused)))

/*
 * PLOVER_BUNDLE("host") or PLOVER_BUNDLE("cuda"), in exactly one source file
 * of the bundle, defines the symbols the runtime reads:
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
  /* A CUDA error pending when a failure or refusal comes came first: it   \
   * is taken now, so that a later cudaGetLastError() cannot lose both. */  \
  PLOVER_EXPORT void plover_set_error_(const char *msg) {                   \
    if (plover_error_ != NULL) return;                                      \
    plover_error_ = plover_take_device_error_();                            \
    if (plover_error_ == NULL) plover_error_ = msg;                         \
  }                                                                         \
  static __thread char plover_rejected_[257];                               \
  PLOVER_EXPORT void plover_set_reject_(const char *msg) {                  \
    if (plover_error_ != NULL) return;                                      \
    if ((plover_error_ = plover_take_device_error_()) != NULL) return;      \
    /* \x1e (record separator) first: the runtime reads it as a refusal. */ \
    plover_rejected_[0] = '\x1e';                                           \
    size_t i = 0;                                                           \
    for (; msg != NULL && msg[i] != 0 && i < sizeof plover_rejected_ - 2; i++) \
      plover_rejected_[i + 1] = msg[i];                                     \
    plover_rejected_[i + 1] = 0;                                            \
    plover_error_ = plover_rejected_;                                       \
  }                                                                         \
  PLOVER_EXPORT const char *plover_last_error(void) {                       \
    const char *m = plover_error_;                                          \
    const char *d = plover_take_device_error_(); /* always read and cleared */ \
    plover_error_ = NULL;                                                   \
    return m != NULL ? m : d;                                               \
  }                                                                         \
  typedef int plover_bundle_defined_once_

/* PLOVER_BATCHED(n), in one source file: this bundle's chain handles up to
 * n requests per run (s->items); see BATCHING. */
#define PLOVER_BATCHED(n) \
  PLOVER_EXPORT const uint32_t plover_max_items = (n)

/* Records a failure for this request (or hook); msg is NOT copied: the
 * runtime reads it after the whole chain (or the hook) has returned, so it
 * must be a string literal or static storage, never the entry's stack. The
 * first failure wins. */
PLOVER_EXTERN_C void plover_set_error_(const char *msg);
#define plover_fail(s, msg) ((void)(s), plover_set_error_(msg))

/* 2.2: refuses this request's input as the client's fault (HTTP 422); msg
 * is copied, up to 255 bytes (a UTF-8 character cut there is dropped). The
 * first failure or refusal wins. */
PLOVER_EXTERN_C void plover_set_reject_(const char *msg);
#define plover_reject(s, msg) ((void)(s), plover_set_reject_(msg))

#endif /* PLOVER_H */
