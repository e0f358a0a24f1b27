// A bundle for the tests of programs leaving a tenant's worker
// (tenant_leave_test.go). Its plover_instance_fini and plover_unload print
// a line naming it ("fini: WHO", "unload: WHO"; -DWHO=\"name\"). With
// -DCRASH_UNLOAD its plover_unload writes to address 0 instead: on the
// worker's control thread, which the fatal-signal handler marks with the
// program being unloaded; with -DHANG_UNLOAD it never returns. forge writes its input as one line on
// descriptor block (a fatal-signal mark the test composes, naming a
// program of its choice: on 2, stderr, as a bundle echoing its client's
// bytes would; on 5, the mark's own pipe, as only the bundle itself can),
// then starts a thread of its own that writes to address 0 grid
// milliseconds later (that thread runs no program: the handler adds no
// mark of its own); with grid < 0 it writes the line alone. runs writes how many runs this copy of the library
// has made, kept in a static (8 bytes, little-endian on the test's hosts).
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "plover.h"

PLOVER_BUNDLE("host");

#ifndef WHO
#define WHO "leaving"
#endif

static int *volatile null_ptr = NULL;

PLOVER_ENTRY(echo) {
  (void)grid; (void)block;
  size_t n = s->input.len < s->out.len ? s->input.len : s->out.len;
  memcpy(s->out.dat, s->input.dat, n);
  s->out.len = n;
}

static unsigned long long runs_made;

PLOVER_ENTRY(runs) {
  (void)grid; (void)block;
  runs_made++;
  memcpy(s->out.dat, &runs_made, sizeof runs_made);
  s->out.len = sizeof runs_made;
}

static long later_ms;

static void *crash_later(void *) {
  struct timespec ts = {later_ms / 1000, (later_ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) != 0) {
  }
  *null_ptr = 1;
  return NULL;
}

PLOVER_ENTRY(forge) {
  char line[256];
  size_t n = s->input.len < sizeof line - 1 ? s->input.len : sizeof line - 1;
  memcpy(line, s->input.dat, n);
  line[n++] = '\n';
  ssize_t r = write(block, line, n);
  (void)r;
  s->out.len = 0;
  if (grid < 0) return;
  later_ms = grid;
  pthread_t th;
  pthread_create(&th, NULL, crash_later, NULL);
  pthread_detach(th);
}

PLOVER_EXPORT void plover_instance_fini(plover_state_t *s) {
  (void)s;
  printf("fini: %s\n", WHO);
  fflush(stdout);
}

PLOVER_EXPORT void plover_unload(plover_state_t *s) {
  (void)s;
#ifdef CRASH_UNLOAD
  *null_ptr = 1;
#endif
#ifdef HANG_UNLOAD
  for (;;)
    pause();
#endif
  printf("unload: %s\n", WHO);
  fflush(stdout);
}
