/* Checked mode on the host device: an overrun of in, tmp or out is caught
 * (a read only where it reaches the guard page: see below).
 *
 * Each buffer is a mapping of its own with an inaccessible page on either
 * side. in and out are placed per request so that the request's buffer
 * ends at the start of the guard after it, to CUDA's 256-byte alignment;
 * tmp stays where its capacity places it: it keeps the instance's state
 * from one request to the next (plover.h), which a request with less tmp
 * must neither move nor overwrite, so a write past this request's tmp
 * length but within tmp_bytes is no overrun (the instance's own memory).
 * An access that reaches the guard faults at the access (the handler names
 * the entry and the buffer before the fault kills the worker); the 0-255
 * bytes between the end and the guard hold a pattern that is checked after
 * every entry, so a small overrun that writes fails the request with the
 * same names and the worker lives on. A read there is not caught (it
 * returns the pattern): the guard's unit is a page and every buffer
 * starts 256-byte aligned (plover.h), so only a length that is a multiple
 * of 256 ends flush against the guard. Writes before a buffer's start are
 * caught only at a full body's start. */
#define _GNU_SOURCE
#include "host_run.h"

#include <signal.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include <stdio.h>
#if defined(__x86_64__)
#include <ucontext.h>
#endif

#define PATTERN 0xFD /* what the bytes after a buffer hold */
#define ALIGN 256

static const char *const names[3] = {"in", "tmp", "out"};

static size_t page(void) {
  static size_t p;
  if (p == 0) p = (size_t)sysconf(_SC_PAGESIZE);
  return p;
}

static size_t round_up(size_t n, size_t a) { return (n + a - 1) / a * a; }

static size_t body_len(size_t n) { return round_up(n ? n : 1, page()); }

void *plover_guarded_alloc(size_t n) {
  size_t pg = page(), body = body_len(n);
  uint8_t *m = mmap(NULL, body + 2 * pg, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (m == MAP_FAILED) return NULL;
  if (mprotect(m + pg, body, PROT_READ | PROT_WRITE) != 0) {
    munmap(m, body + 2 * pg);
    return NULL;
  }
  return m + pg;
}

void plover_guarded_free(void *body, size_t n) {
  if (body) munmap((uint8_t *)body - page(), body_len(n) + 2 * page());
}

/* b's buffer for len bytes: the last round_up(len, 256) bytes of its body. */
static void place(struct plover_guarded *g, size_t len) {
  g->len = len;
  g->dat = g->body + g->body_len - round_up(len, ALIGN);
  memset(g->dat + len, PATTERN, g->body_len - (size_t)(g->dat - g->body) - len);
}

void plover_checked_init(plover_inst_state_t *s, void *in, size_t in_n, void *tmp, size_t tmp_n, void *out,
                         size_t out_n) {
  void *bufs[3] = {in, tmp, out};
  size_t caps[3] = {in_n, tmp_n, out_n};
  plover_buf_t *base[3] = {&s->base.input, &s->base.tmp, &s->base.out};
  s->checked = 1;
  for (int b = 0; b < 3; b++) {
    s->guard[b].body = bufs[b];
    s->guard[b].body_len = body_len(caps[b]);
    place(&s->guard[b], caps[b]);
    base[b]->dat = s->guard[b].dat;
  }
  s->st = s->base;
}

void plover_checked_place(plover_inst_state_t *s) {
  plover_buf_t *st[3] = {&s->st.input, &s->st.tmp, &s->st.out};
  for (int b = 0; b < 3; b++) {
    /* tmp at its capacity, where it always is: the pattern is written
     * again past it (an overrun last request changed it), never in it. */
    place(&s->guard[b], b == 1 ? s->base.tmp.len : st[b]->len);
    st[b]->dat = s->guard[b].dat;
  }
}

/* The run or hook this thread is in, for the fault handler; cur_len says
 * what in's and out's length is: this request's, or (a hook) their
 * capacity. tmp's is always its capacity (len_note). */
static __thread plover_inst_state_t *cur_state;
static __thread const char *cur_what; /* "entry " or "hook " */
static __thread const char *cur_entry;
static __thread const char *cur_len;

static const char *const request_len = " bytes this request", *const hook_len = " bytes, all of it";

static const char *len_note(int b) { return b == 1 ? hook_len : cur_len; }

/* scan checks the pattern after each buffer once entry has run: NULL, or
 * the report of the bytes it changed. */
static const char *scan(plover_inst_state_t *s, const char *entry) {
  for (int b = 0; b < 3; b++) {
    struct plover_guarded *g = &s->guard[b];
    uint8_t *end = g->body + g->body_len, *p = g->dat + g->len, *first = NULL, *last = NULL;
    for (; p < end; p++)
      if (*p != PATTERN) {
        if (!first) first = p;
        last = p;
      }
    if (first) {
      snprintf(s->report, sizeof s->report,
               PLOVER_FAULT_MARK "%s%s wrote past the end of %s (%zu%s): bytes %zu to %zu changed",
               cur_what, entry ? entry : "?", names[b], g->len, len_note(b), (size_t)(first - g->dat), (size_t)(last - g->dat));
      return s->report;
    }
  }
  return NULL;
}

const char *plover_checked_call(plover_inst_state_t *s, const plover_step_t *steps, int n) {
  void *arg = s->abi1 ? (void *)&s->st.input : (void *)&s->st;
  const char *overrun = NULL;
  cur_state = s;
  cur_what = "entry ";
  cur_len = request_len;
  for (int i = 0; i < n && !overrun; i++) {
    cur_entry = steps[i].name;
    ((void (*)(void *, int, int))steps[i].fn)(arg, steps[i].grid, steps[i].block);
    overrun = scan(s, steps[i].name);
  }
  cur_state = NULL;
  return overrun;
}

const char *plover_checked_hook(plover_inst_state_t *s, void *hook, const char *name, void *last_error) {
  /* A hook sees every buffer at its full size: placed so again, whatever
   * the last request's lengths were (fini comes after requests). */
  s->st = s->base;
  plover_checked_place(s);
  cur_state = s;
  cur_what = "hook ";
  cur_entry = name;
  cur_len = hook_len;
  const char *err = plover_call_hook(hook, &s->st, last_error);
  const char *overrun = scan(s, name);
  cur_state = NULL;
  return overrun ? overrun : err;
}

/* ---- The fault handler: async-signal-safe, so no stdio. ----------------
 * Also called by a handler set after it, which took its signals over: a
 * tenant's worker's fatal-signal handler (worker/inside) names the program
 * the fault took, then calls this one for its report; that handler's own
 * SA_RESETHAND put the default action back, and it re-raises the signal.
 *
 * The report goes to stderr, the function's output, and to report_fd (a
 * worker's: wire.FatalFD), the one place the server takes it from: what
 * reaches stderr may be a bundle's echo of its client's bytes, or another
 * program's line in a tenant's worker. */
static int report_fd = -1;

struct line {
  char b[400];
  size_t n;
};

static void put(struct line *l, const char *s) {
  while (*s && l->n < sizeof l->b - 1) l->b[l->n++] = *s++;
}

static void put_num(struct line *l, size_t v) {
  char d[24];
  int i = 0;
  do d[i++] = (char)('0' + v % 10), v /= 10;
  while (v && i < (int)sizeof d);
  while (i > 0 && l->n < sizeof l->b - 1) l->b[l->n++] = d[--i];
}

static void on_fault(int sig, siginfo_t *si, void *ctx) {
  plover_inst_state_t *s = cur_state;
  if (!s) return; /* not a checked run: the default action (reset) kills */
  uint8_t *a = (uint8_t *)si->si_addr;
  const char *verb = "accessed";
#if defined(__x86_64__)
  /* The page fault's error code (bit 1 set for a write): SIGSEGV's only. */
  if (sig == SIGSEGV)
    verb = (((ucontext_t *)ctx)->uc_mcontext.gregs[REG_ERR] & 2) ? "wrote" : "read";
#else
  (void)sig;
  (void)ctx;
#endif
  size_t pg = page();
  for (int b = 0; b < 3; b++) {
    struct plover_guarded *g = &s->guard[b];
    uint8_t *end = g->body + g->body_len;
    int after = a >= end && a < end + pg, before = a >= g->body - pg && a < g->body;
    if (!after && !before) continue;
    struct line l = {.n = 0};
    put(&l, PLOVER_FAULT_MARK);
    put(&l, cur_what ? cur_what : "entry ");
    put(&l, cur_entry ? cur_entry : "?");
    put(&l, " ");
    put(&l, verb);
    if (after) {
      put(&l, " past the end of ");
      put(&l, names[b]);
      put(&l, ", at byte ");
      put_num(&l, (size_t)(a - g->dat));
    } else {
      put(&l, " before the start of ");
      put(&l, names[b]);
      put(&l, ", ");
      put_num(&l, (size_t)(g->dat - a));
      put(&l, " bytes before it");
    }
    put(&l, " (");
    put_num(&l, g->len);
    put(&l, len_note(b));
    put(&l, ")\n");
    ssize_t w = write(2, l.b, l.n);
    if (report_fd >= 0 && report_fd != 2) w = write(report_fd, l.b, l.n);
    (void)w;
    return; /* the handler is reset: the access faults again and kills */
  }
}

int plover_checked_install(int fd) {
  report_fd = fd;
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = on_fault;
  sa.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_RESETHAND;
  sigemptyset(&sa.sa_mask);
  if (sigaction(SIGSEGV, &sa, NULL) != 0) return -1;
  return sigaction(SIGBUS, &sa, NULL);
}
