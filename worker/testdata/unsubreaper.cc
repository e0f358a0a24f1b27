// A bundle for TestABundleCannotClearItsWorkersSubreaperFlag
// (strays_test.go). unsubreaper clears its worker's child-subreaper flag,
// then double-forks a grandchild that spins for ever: with the flag
// cleared the grandchild is orphaned to the next subreaper up, the
// server, out of the worker's tree. It writes "unsubreaper: prctl OK" or
// "... prctl E<errno>", then " grandchild PID".
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "plover.h"

PLOVER_BUNDLE("host");

static void put(plover_state_t *s, const char *text) {
  size_t n = strlen(text);
  if (n > s->out.len) n = s->out.len;
  memcpy(s->out.dat, text, n);
  memset(s->out.dat + n, 0, s->out.len - n);
}

PLOVER_ENTRY(unsubreaper) {
  (void)grid; (void)block;
  int rc = prctl(PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0);
  const char *said = rc == 0 ? "OK" : errno == EPERM ? "EPERM" : strerror(errno);
  int fds[2];
  if (pipe(fds) != 0) { plover_fail(s, "unsubreaper: pipe failed"); return; }
  pid_t c = fork();
  if (c < 0) { plover_fail(s, "unsubreaper: fork failed"); return; }
  if (c == 0) {
    close(fds[0]);
    pid_t g = fork();
    if (g == 0) {
      close(fds[1]);
      for (volatile unsigned long i = 0;; i++) {}
    }
    if (write(fds[1], &g, sizeof g) != (ssize_t)sizeof g) _exit(1);
    _exit(0);
  }
  close(fds[1]);
  pid_t g = -1;
  while (read(fds[0], &g, sizeof g) < 0 && errno == EINTR) {}
  close(fds[0]);
  waitpid(c, NULL, 0);
  char msg[64];
  snprintf(msg, sizeof msg, "unsubreaper: prctl %s grandchild %d", said, (int)g);
  put(s, msg);
}
