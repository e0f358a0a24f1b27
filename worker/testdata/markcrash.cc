// Crashes a tenant's worker must still name the program of: partial_segv
// writes part of a line on stderr ("computing... " grid times; stderr is
// unbuffered: written now, no newline) and then writes to address 0, so
// that the fatal-signal mark lands on a line already begun; crash_at_unload arms plover_unload to write to
// address 0 when the program is unloaded (its last reference dropped by
// whichever of the worker's threads drops it); echo copies in to out.
#include <stdio.h>
#include <string.h>

#include "plover.h"

PLOVER_BUNDLE("host");

static int *volatile null_ptr = NULL;
static volatile int armed;

PLOVER_ENTRY(partial_segv) {
  (void)block; (void)s;
  for (int i = 0; i < grid; i++) fputs("computing... ", stderr);
  *null_ptr = 1;
}

PLOVER_ENTRY(crash_at_unload) {
  (void)grid; (void)block; (void)s;
  armed = 1;
}

PLOVER_ENTRY(echo) {
  (void)grid; (void)block;
  size_t n = s->input.len < s->out.len ? s->input.len : s->out.len;
  memcpy(s->out.dat, s->input.dat, n);
  s->out.len = n;
}

PLOVER_EXPORT void plover_unload(plover_state_t *s) {
  (void)s;
  if (armed) *null_ptr = 1;
}
