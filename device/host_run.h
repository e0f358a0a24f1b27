#ifndef PLOVER_HOST_RUN_H
#define PLOVER_HOST_RUN_H
#include <stddef.h>
#include <stdint.h>
#include "plover.h"

typedef struct {
  void *fn;
  int32_t grid;
  int32_t block;
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
   * host device the CPU time of the thread that ran it (not the time it
   * waited for a CPU); on CUDA the copies' and the chain's time on the GPU
   * (its events). 0: unknown. */
  int64_t busy_ns;
} plover_timing_t;

typedef const char *(*plover_last_error_fn)(void);

/* Flags of a run (the zero argument of both runners): what it zeroes before
 * the chain, and whether in and out are memory the device works on in place
 * (a worker's slot; on CUDA registered with the driver). */
#define PLOVER_ZERO_TMP 1
#define PLOVER_ZERO_OUT 2
#define PLOVER_IN_PLACE 4

/* The state entries see: st, reset from base before every request. ABI 1
 * bundles get the ABI 1 view, which is ABI 2's state from input to stream. */
typedef struct {
  plover_state_t st;
  plover_state_t base;
  int abi1;
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

void *plover_host_alloc(size_t n);
const char *plover_host_run(plover_inst_state_t *s, const void *in,
                            size_t in_len, void *out, size_t out_len,
                            size_t tmp_len, uint32_t items, int zero,
                            const plover_step_t *steps, int n, void *last_error,
                            plover_timing_t *t);
#endif
