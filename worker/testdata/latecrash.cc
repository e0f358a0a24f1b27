// A bundle that ends its process from a thread of its own, outside its
// runs (no run of it in flight, no fatal-signal mark): exit_later and
// segv_later start a thread that sleeps grid milliseconds, then calls
// exit(3) or writes to address 0; the entry itself returns at once.
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "plover.h"

PLOVER_BUNDLE("host");

static int *volatile null_ptr = NULL;

struct later {
  long ms;
  int segv;
};

static void *end_later(void *arg) {
  struct later *l = (struct later *)arg;
  struct timespec ts = {l->ms / 1000, (l->ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) != 0) {
  }
  if (l->segv) *null_ptr = 1;
  exit(3);
  return NULL;
}

static void start(long ms, int segv) {
  static struct later l;
  l.ms = ms;
  l.segv = segv;
  pthread_t th;
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
  pthread_create(&th, &attr, end_later, &l);
  pthread_attr_destroy(&attr);
}

PLOVER_ENTRY(exit_later) {
  (void)block; (void)s;
  start(grid, 0);
}

PLOVER_ENTRY(segv_later) {
  (void)block; (void)s;
  start(grid, 1);
}
