#include "host_run.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

_Static_assert(sizeof(plover_state_t) == 160, "plover_state_t is 160 bytes in ABI 2");
_Static_assert(offsetof(plover_state_t, input) == 8, "the ABI 1 view starts at input");

static int64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* The calling thread's CPU time: a host run's kernels run on it, one after
 * another, so its CPU time over the run is the work the run did. */
static int64_t cpu_ns(void) {
  struct timespec ts;
  if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts) != 0) return 0;
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* In a worker process a run's device time is its share of the process's CPU
 * time (process_clock): a chain may compute on threads of its own (OpenMP, a
 * pool), whose time the calling thread's clock never sees, so a function
 * could be charged next to nothing for the whole machine. Runs in flight in
 * the process at once split each stretch of its CPU time equally (per_run:
 * the time each run in flight was charged since the start; a run is charged
 * its value at its end less its value at its start). The process's time
 * while no run is in flight is charged to no run; its CPU weight bounds it.
 * The process clock sums the process's threads: 0.7 us a read with 10,
 * 2.2 us with 100, 14 us with 1000 (kernel 6.18), a bundle's own cost,
 * bounded by --worker-max-pids. Elsewhere (the server's in-process runs, plover run) the
 * process's other work is not the run's: the calling thread's clock. */
static int process_clock;
static pthread_mutex_t ledger_mu = PTHREAD_MUTEX_INITIALIZER;
static int64_t ledger_last; /* the process's CPU time at the last event */
static double per_run;
static int in_flight;

void plover_host_process_clock(void) { process_clock = 1; }

static int64_t process_cpu_ns(void) {
  struct timespec ts;
  if (clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts) != 0) return 0;
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* A run starts (+1) or ends (-1): what passed since the last event goes to
 * the runs in flight during it; returns per_run. */
static double ledger_event(int change) {
  int64_t now = process_cpu_ns();
  pthread_mutex_lock(&ledger_mu);
  if (in_flight > 0 && now > ledger_last) per_run += (double)(now - ledger_last) / in_flight;
  if (now > ledger_last) ledger_last = now;
  in_flight += change;
  double v = per_run;
  pthread_mutex_unlock(&ledger_mu);
  return v;
}

/* 256-byte alignment matches cudaMalloc, so kernels that rely on it behave
 * the same on both targets. Zero-sized buffers still get a valid pointer.
 * A large buffer is its own anonymous mapping: zero pages, resident only
 * once touched. A worker's instance runs in place on the server's slot,
 * so its own in and out are never touched there, and zeroing them here
 * made max_input_bytes + out_bytes resident in every instance, counted
 * against max_host_memory_mb (a worker of 128 MiB out was killed). */
void *plover_host_alloc(size_t n) {
  if (n >= PLOVER_HOST_MAP_MIN) {
    void *m = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return m == MAP_FAILED ? NULL : m;
  }
  void *p = NULL;
  if (posix_memalign(&p, PLOVER_HOST_ALIGN, n ? n : 1) != 0) return NULL;
  memset(p, 0, n ? n : 1);
  return p;
}

void plover_host_free(void *p, size_t n) {
  if (p && n >= PLOVER_HOST_MAP_MIN)
    munmap(p, n);
  else
    free(p);
}

void plover_state_init(plover_inst_state_t *s, int abi1, void *in, size_t in_n,
                       void *constant, size_t constant_n, void *tmp,
                       size_t tmp_n, void *out, size_t out_n, void *stream,
                       void *program) {
  plover_state_t *b = &s->base;
  memset(s, 0, sizeof *s);
  s->abi1 = abi1;
  b->size = sizeof(plover_state_t);
  b->abi_version = PLOVER_ABI_VERSION;
  b->input.dat = (uint8_t *)in;
  b->input.len = in_n;
  b->constant.dat = (uint8_t *)constant;
  b->constant.len = constant ? constant_n : 0;
  b->tmp.dat = (uint8_t *)tmp;
  b->tmp.len = tmp_n;
  b->out.dat = (uint8_t *)out;
  b->out.len = out_n;
  b->stream = stream;
  b->program = program;
  s->st = *b;
}

void plover_state_begin(plover_inst_state_t *s, size_t in_len, size_t tmp_len,
                        size_t out_len, uint32_t items) {
  s->st = s->base;
  s->st.input.len = in_len;
  s->st.tmp.len = tmp_len;
  s->st.out.len = out_len;
  s->st.items = items;
}

typedef void (*any_entry_fn)(void *s, int grid, int block);

void plover_call_entries(plover_inst_state_t *s, const plover_step_t *steps,
                         int n) {
  void *arg = s->abi1 ? (void *)&s->st.input : (void *)&s->st;
  for (int i = 0; i < n; i++)
    ((any_entry_fn)steps[i].fn)(arg, steps[i].grid, steps[i].block);
}

size_t plover_state_out_used(const plover_inst_state_t *s, size_t out_len) {
  return s->abi1 ? out_len : s->st.out.len;
}

const char *plover_call_hook(void *hook, plover_state_t *st, void *last_error) {
  ((plover_hook_fn)hook)(st);
  return last_error ? ((plover_last_error_fn)last_error)() : NULL;
}

const char *plover_host_run(plover_inst_state_t *s, const void *in,
                            size_t in_len, void *out, size_t out_len,
                            size_t tmp_len, uint32_t items, int zero,
                            const plover_step_t *steps, int n, void *last_error,
                            plover_timing_t *t) {
  int64_t t0 = now_ns(), c0 = process_clock ? 0 : cpu_ns();
  double v0 = process_clock ? ledger_event(1) : 0;
  /* Checked, the chain runs on the instance's guarded buffers: copies. */
  int in_place = (zero & PLOVER_IN_PLACE) && !s->checked;
  plover_state_begin(s, in_len, tmp_len, out_len, items);
  if (s->checked) plover_checked_place(s);
  uint8_t *out_dat = s->st.out.dat; /* where the chain writes this request's out */
  t->copied = 0;
  /* This request's input and out are where they already are (a worker's
   * slot): the chain works on them there, if they start 256-byte aligned
   * as every buffer the chain sees does (plover.h), as a worker's slots'
   * do (device.SlotOut); memory that does not is copied as out of place,
   * through the instance's own buffers. The next request's begin points the state back at whatever it
   * is given. */
  if (in_place && in && (uintptr_t)in % PLOVER_HOST_ALIGN == 0)
    s->st.input.dat = (uint8_t *)in;
  else if (in_len) {
    memcpy(s->st.input.dat, in, in_len);
    t->copied += in_len;
  }
  if (in_place && out && (uintptr_t)out % PLOVER_HOST_ALIGN == 0)
    s->st.out.dat = out_dat = (uint8_t *)out;
  if ((zero & PLOVER_ZERO_TMP) && tmp_len) memset(s->st.tmp.dat, 0, tmp_len);
  if ((zero & PLOVER_ZERO_OUT) && out_len) memset(s->st.out.dat, 0, out_len);
  int64_t t1 = now_ns();
  const char *err = NULL;
  if (s->checked) {
    const char *overrun = plover_checked_call(s, steps, n);
    if (last_error) err = ((plover_last_error_fn)last_error)(); /* read (and cleared) either way */
    if (overrun) err = overrun;
  } else {
    plover_call_entries(s, steps, n);
    if (last_error) err = ((plover_last_error_fn)last_error)();
  }
  size_t used = plover_state_out_used(s, out_len);
  int64_t t2 = now_ns();
  if (out_dat != (uint8_t *)out && !err && used <= out_len && used) {
    memcpy(out, out_dat, used);
    t->copied += used;
  }
  int64_t t3 = now_ns();
  t->copy_in_ns = t1 - t0;
  t->kernels_ns = t2 - t1;
  t->copy_out_ns = t3 - t2;
  t->out_used = used;
  if (process_clock)
    t->busy_ns = (int64_t)(ledger_event(-1) - v0);
  else
    t->busy_ns = c0 ? cpu_ns() - c0 : 0;
  return err;
}
