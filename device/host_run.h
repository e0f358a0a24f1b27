#ifndef PLOVER_HOST_RUN_H
#define PLOVER_HOST_RUN_H
#include <stddef.h>
#include <stdint.h>
#include "plover.h"

typedef struct {
  void *fn;
  int32_t grid;
  int32_t block;
  const char *name; /* the entry's name, for checked mode's reports */
} plover_step_t;

typedef struct {
  int64_t copy_in_ns;
  int64_t kernels_ns;
  int64_t copy_out_ns;
  /* The bytes of out the chain produced: out.len as the entries left it
   * (ABI 2), else the whole out. Above the out length asked for means an
   * entry raised out.len: nothing was copied. */
  uint64_t out_used;
  /* Payload bytes copied on the host, into and out of the instance's own
   * buffers or staging: 0 for a run in place. */
  uint64_t copied;
  /* The device time the run used, what it is charged and billed: on the
   * host device CPU time, not the time it waited for a CPU (in a worker its
   * share of the process's, plover_host_process_clock; elsewhere the
   * calling thread's); on CUDA the copies' and the chain's time on the GPU
   * (its events). 0: unknown. */
  int64_t busy_ns;
} plover_timing_t;

typedef const char *(*plover_last_error_fn)(void);

/* From now on, host runs in this process are charged their share of its
 * CPU time, helper threads included (a worker process's setting). */
void plover_host_process_clock(void);

/* Flags of a run (the zero argument of both runners): what it zeroes before
 * the chain, and whether in and out are memory the device works on in place
 * (a worker's slot; on CUDA registered with the driver). */
#define PLOVER_ZERO_TMP 1
#define PLOVER_ZERO_OUT 2
#define PLOVER_IN_PLACE 4

/* Where every buffer a chain sees starts: cudaMalloc's alignment, which
 * plover.h promises on both targets. */
#define PLOVER_HOST_ALIGN 256

/* The state entries see: st, reset from base before every request. ABI 1
 * bundles get the ABI 1 view, which is ABI 2's state from input to stream. */
typedef struct {
  plover_state_t st;
  plover_state_t base;
  int abi1;
  /* Checked mode (host_checked.c): in, tmp and out each in a mapping of
   * their own, body bytes between inaccessible guard pages; this request's
   * in and out, and tmp at its capacity, end where the body does, to 256
   * bytes, and the bytes between their end and the body's hold a pattern
   * checked after every entry. */
  int checked;
  struct plover_guarded {
    uint8_t *body;
    size_t body_len;
    uint8_t *dat; /* this request's buffer (tmp: all of it), len bytes */
    size_t len;
  } guard[3]; /* in, tmp, out */
  char report[320]; /* an overrun's message */
} plover_inst_state_t;

/* Fills base for an instance: its buffers (capacities as lengths), the
 * program's constants and pointer. */
void plover_state_init(plover_inst_state_t *s, int abi1, void *in, size_t in_n,
                       void *constant, size_t constant_n, void *tmp,
                       size_t tmp_n, void *out, size_t out_n, void *stream,
                       void *program);
/* Resets st from base with this request's lengths. */
void plover_state_begin(plover_inst_state_t *s, size_t in_len, size_t tmp_len,
                        size_t out_len, uint32_t items);
void plover_call_entries(plover_inst_state_t *s, const plover_step_t *steps,
                         int n);
/* out_used after the chain (see plover_timing_t). */
size_t plover_state_out_used(const plover_inst_state_t *s, size_t out_len);
/* Calls hook(st) and returns the bundle's error (NULL: none). */
const char *plover_call_hook(void *hook, plover_state_t *st, void *last_error);

/* Buffers of at least this many bytes are mapped (plover_host_alloc). */
#define PLOVER_HOST_MAP_MIN (64 << 10)

void *plover_host_alloc(size_t n);
void plover_host_free(void *p, size_t n);

/* Checked mode. plover_guarded_alloc maps n bytes (rounded up to pages)
 * between two inaccessible pages, zeroed; NULL: out of memory. */
void *plover_guarded_alloc(size_t n);
void plover_guarded_free(void *body, size_t n);
/* Marks an instance checked, its buffers from plover_guarded_alloc with
 * these capacities; base then points at each placed for its capacity. */
void plover_checked_init(plover_inst_state_t *s, void *in, size_t in_n,
                         void *tmp, size_t tmp_n, void *out, size_t out_n);
/* Places this request's in and out in st (lengths from st), and tmp at its
 * capacity, and writes the pattern after each. */
void plover_checked_place(plover_inst_state_t *s);
/* Runs the chain's entries, checking the patterns after each: NULL, or
 * the report of the first overrun (the chain stops there). */
const char *plover_checked_call(plover_inst_state_t *s,
                                const plover_step_t *steps, int n);
/* Calls a hook (plover_instance_init, _fini) named name on s as
 * plover_call_hook does, under the fault handler, and checks the patterns
 * after it: the report of an overrun, else the hook's error, else NULL. */
const char *plover_checked_hook(plover_inst_state_t *s, void *hook,
                                const char *name, void *last_error);
/* Installs the SIGSEGV/SIGBUS handler that, for a fault on a checked run's
 * guard page, writes one line to stderr naming the entry and the buffer
 * (PLOVER_FAULT_MARK first), and the same line to report_fd unless it is
 * stderr or negative, then lets the fault kill the process. Worker
 * processes only: it replaces any handler the process had. A handler set
 * after it may call it (with its siginfo and context) for the report, and
 * must then see to the signal's end itself. */
int plover_checked_install(int report_fd);
#define PLOVER_FAULT_MARK "plover: checked mode: "
const char *plover_host_run(plover_inst_state_t *s, const void *in,
                            size_t in_len, void *out, size_t out_len,
                            size_t tmp_len, uint32_t items, int zero,
                            const plover_step_t *steps, int n, void *last_error,
                            plover_timing_t *t);
#endif
