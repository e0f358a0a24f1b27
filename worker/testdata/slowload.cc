// A bundle whose constructor takes SLOW_MS milliseconds (a cold load
// slower than a request's deadline), then echoes like kernels.cu. Built
// with -DCRASH its constructor then segfaults, with -DFAIL_LOAD its
// plover_load then fails: a load that outlasts its request's deadline
// and then fails. With -DSPIN_THREADS=N its constructor instead starts N
// threads that each use SLOW_MS milliseconds of CPU, and waits for them.
#include <pthread.h>
#include <string.h>
#include <time.h>

#include "plover.h"

PLOVER_BUNDLE("host");

#ifndef SLOW_MS
#define SLOW_MS 1000
#endif

#ifdef CRASH
// Not visible to the compiler as null, so the store is a real write to 0.
static int *volatile null_ptr = NULL;
#endif

#ifdef SPIN_THREADS
static void *spin(void *arg) {
  (void)arg;
  struct timespec t;
  do clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  while (t.tv_sec * 1000L + t.tv_nsec / 1000000L < SLOW_MS);
  return NULL;
}
#endif

__attribute__((constructor)) static void slow_load(void) {
#ifdef SPIN_THREADS
  pthread_t th[SPIN_THREADS];
  for (int i = 0; i < SPIN_THREADS; i++) pthread_create(&th[i], NULL, spin, NULL);
  for (int i = 0; i < SPIN_THREADS; i++) pthread_join(th[i], NULL);
#else
  struct timespec ts = {SLOW_MS / 1000, (SLOW_MS % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) != 0) {
  }
#endif
#ifdef CRASH
  *null_ptr = 1;
#endif
}

#ifdef FAIL_LOAD
PLOVER_EXPORT void plover_load(plover_state_t *s) { plover_fail(s, "the weights are corrupt"); }
#endif

PLOVER_ENTRY(echo) {
  (void)grid; (void)block;
  size_t n = s->input.len < s->out.len ? s->input.len : s->out.len;
  memcpy(s->out.dat, s->input.dat, n);
  memset(s->out.dat + n, 0, s->out.len - n);
}
