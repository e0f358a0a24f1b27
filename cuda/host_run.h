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
} plover_timing_t;

typedef const char *(*plover_last_error_fn)(void);

/* What a run zeroes before the chain (the zero argument of both runners). */
#define PLOVER_ZERO_TMP 1
#define PLOVER_ZERO_OUT 2

void *plover_host_alloc(size_t n);
const char *plover_host_run(plover_state_t *st, const void *in, size_t in_len,
                            void *out, size_t out_len, size_t tmp_len,
                            int zero, const plover_step_t *steps, int n,
                            void *last_error, plover_timing_t *t);
#endif
