/* overrun.cu: entries that write past (or before) a buffer, for checked
 * mode (device/checked_test.go, cli/plover/checked_test.go). block names
 * the buffer (0 in, 1 tmp, 2 out), grid the bytes written starting at its
 * end (negative: before its start). overrun_kernel does the same from a
 * simulated CUDA kernel, one byte per thread. */
#include "plover_kernel.h"

#include <stdio.h>
#include <stdlib.h>

PLOVER_BUNDLE(PLOVER_TARGET);

static plover_buf_t *buffer(plover_state_t *s, int which) {
  return which == 0 ? &s->input : which == 1 ? &s->tmp : &s->out;
}

PLOVER_ENTRY(overrun) {
  plover_buf_t *b = buffer(s, block);
  volatile uint8_t *p = b->dat;
  if (grid >= 0)
    for (int i = 0; i < grid; i++) p[b->len + i] = 0xAB;
  else
    for (int i = -1; i >= grid; i--) p[i] = 0xAB;
}

/* overread: returns grid bytes read from the end of buffer block on: a
 * read past the end, which checked mode catches only at the guard page. */
PLOVER_ENTRY(overread) {
  plover_buf_t *b = buffer(s, block);
  const volatile uint8_t *p = b->dat + b->len;
  size_t n = grid < 0 ? 0 : (size_t)grid;
  if (n > s->out.len) n = s->out.len;
  for (size_t i = 0; i < n; i++) s->out.dat[i] = p[i];
  s->out.len = n;
}

__global__ void scribble(uint8_t *end) { end[threadIdx.x] = 0xAB; }

PLOVER_ENTRY(overrun_kernel) {
  plover_buf_t *b = buffer(s, block);
  if (grid > 0) PLOVER_LAUNCH(scribble, 1, grid, s, b->dat + b->len);
}

/* plover_instance_init and _fini write past a buffer as overrun does, as
 * $PLOVER_OVERRUN_INIT and _FINI say ("buffer bytes"); unset, nothing. */
static void hook_overrun(plover_state_t *s, const char *var) {
  const char *e = getenv(var);
  int which, n;
  if (!e || sscanf(e, "%d %d", &which, &n) != 2) return;
  plover_buf_t *b = buffer(s, which);
  volatile uint8_t *p = b->dat;
  for (int i = 0; i < n; i++) p[b->len + i] = 0xAB;
}

PLOVER_EXPORT void plover_instance_init(plover_state_t *s) { hook_overrun(s, "PLOVER_OVERRUN_INIT"); }
PLOVER_EXPORT void plover_instance_fini(plover_state_t *s) { hook_overrun(s, "PLOVER_OVERRUN_FINI"); }

/* fill: writes every byte of out and tmp and echoes in, the well-behaved
 * neighbour of the entries above. */
PLOVER_ENTRY(fill) {
  (void)grid, (void)block;
  memset(s->tmp.dat, 7, s->tmp.len);
  for (size_t i = 0; i < s->out.len; i++) s->out.dat[i] = i < s->input.len ? s->input.dat[i] : 0xEE;
}

/* tmp_write and tmp_read: tmp as state kept across requests. tmp_write
 * sets tmp[i] = i % 251 + 1 for i < tmp.len; tmp_read returns the first
 * min(tmp.len, out.len) bytes of tmp. */
PLOVER_ENTRY(tmp_write) {
  for (size_t i = 0; i < s->tmp.len; i++) s->tmp.dat[i] = (uint8_t)(i % 251 + 1);
}

PLOVER_ENTRY(tmp_read) {
  size_t n = s->tmp.len < s->out.len ? s->tmp.len : s->out.len;
  memcpy(s->out.dat, s->tmp.dat, n);
  s->out.len = n;
}

/* echo: out = in (memcpy), for checked mode's cost against in place. */
PLOVER_ENTRY(echo) {
  (void)grid, (void)block;
  size_t n = s->input.len < s->out.len ? s->input.len : s->out.len;
  memcpy(s->out.dat, s->input.dat, n);
  s->out.len = n;
}
