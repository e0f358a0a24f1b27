// A library whose ELF constructor crashes: it passes every static check at
// deploy (a valid PLOVER_BUNDLE and an echo entry) but takes down whatever
// process dlopens it, with SIGSEGV, before any kernel runs. Built with g++ -x
// c++ for the host target (testkit.BuildLib); see isolation_test.go.
#include <string.h>

#include "plover.h"

PLOVER_BUNDLE("host");

// Not visible to the compiler as null, so the store is a real write to 0.
static int *volatile ctor_null = NULL;

#ifdef PLOVER_CTOR_HANG
// Built with -DPLOVER_CTOR_HANG: the constructor never returns instead.
#include <unistd.h>
__attribute__((constructor)) static void hang_on_load(void) {
  for (;;) pause();
}
#elif defined(PLOVER_CTOR_ESCAPE)
// Built with -DPLOVER_CTOR_ESCAPE: the constructor first forks a child that
// leaves the process group (setsid; where the worker's seccomp filter
// refuses that, setpgid into a group of its own), names itself "plover-escaped" (so that
// a test can find it and end it) and keeps every inherited descriptor, the
// worker's channels included, open for 20 s; then it crashes, once the child
// says it has left: the server kills the worker's group when the worker
// dies, and a child slow to be scheduled went with it (the test found no
// child in about half its runs right after another test ended workers).
#include <sys/prctl.h>
#include <unistd.h>
__attribute__((constructor)) static void escape_then_crash(void) {
  int left[2];
  if (pipe(left) != 0) *ctor_null = 1;
  pid_t pid = fork();
  if (pid == 0) {
    if (setsid() < 0) setpgid(0, 0);
    prctl(PR_SET_NAME, "plover-escaped", 0, 0, 0);
    char c = 1;
    if (write(left[1], &c, 1) != 1) _exit(1);
    sleep(20);
    _exit(0);
  }
  close(left[1]);  // a child that dies first ends the read
  char c;
  if (pid > 0 && read(left[0], &c, 1) < 0) {
  }
  *ctor_null = 1;
}
#else
__attribute__((constructor)) static void crash_on_load(void) { *ctor_null = 1; }
#endif

// echo: never reached, since loading the library already crashed.
PLOVER_ENTRY(echo) {
  (void)grid; (void)block;
  size_t n = s->input.len < s->out.len ? s->input.len : s->out.len;
  memcpy(s->out.dat, s->input.dat, n);
  memset(s->out.dat + n, 0, s->out.len - n);
}
