/* A process whose children keep forking, as a bundle's process pool or a
 * shell loop does: FORKERS children each fork a child every 1 ms that lives
 * 30 ms (reaped by the kernel: SIGCHLD ignored). A process takes its nice
 * level from the thread that forked it, so renicing the tree is renicing a
 * moving set of processes. It says "R" on stdout once its forkers run, and
 * runs until killed (its process group with it). */
#include <signal.h>
#include <stdio.h>
#include <time.h>
#include <unistd.h>

#define FORKERS 8

static void nap(long us) {
  struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
  nanosleep(&ts, NULL);
}

static void forker(void) {
  signal(SIGCHLD, SIG_IGN);
  for (;;) {
    if (fork() == 0) {
      nap(30000);
      _exit(0);
    }
    nap(1000);
  }
}

int main(void) {
  for (int i = 0; i < FORKERS; i++) {
    pid_t pid = fork();
    if (pid < 0) return 1;
    if (pid == 0) forker();
  }
  if (write(1, "R", 1) != 1) return 1;
  for (;;) pause();
}
