/* A process whose threads keep making threads, as a bundle's pools and the
 * Go runtime do: SPAWNERS threads each start a thread every 500 us that
 * lives 10 ms. A new thread takes its nice level from the thread that made
 * it, so renicing the process is renicing a moving set of threads. It says
 * "R" on stdout once its spawners run, and runs until killed. */
#include <pthread.h>
#include <stdio.h>
#include <time.h>
#include <unistd.h>

#define SPAWNERS 32

static void nap(long us) {
  struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
  nanosleep(&ts, NULL);
}

static void *child(void *arg) {
  (void)arg;
  nap(10000);
  return NULL;
}

static void *spawner(void *arg) {
  (void)arg;
  pthread_attr_t at;
  pthread_attr_init(&at);
  pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
  pthread_attr_setstacksize(&at, 64 << 10);
  for (;;) {
    pthread_t t;
    pthread_create(&t, &at, child, NULL);
    nap(500);
  }
  return NULL;
}

int main(void) {
  for (int i = 0; i < SPAWNERS; i++) {
    pthread_t t;
    if (pthread_create(&t, NULL, spawner, NULL) != 0) return 1;
  }
  if (write(1, "R", 1) != 1) return 1;
  for (;;) pause();
}
