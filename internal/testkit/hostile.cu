// Hostile kernels for the worker-isolation tests (cli/plover/isolation_test.go).
// Built with g++ -x c++ for the host target (testkit.BuildLib). Each entry
// misbehaves in one way a user's library could: it crashes, exits, never
// returns, corrupts memory, closes or steals file descriptors, leaves threads
// behind, or reads what it should not (the environment, the server's files,
// another function's memory). With `plover serve --isolation process` every
// one of them must stay inside its own worker process.
//
// grid and block are unused unless an entry says otherwise; out is always
// written in full (the runtime returns every byte of it).
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sched.h>
#include <sys/ipc.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "plover.h"

PLOVER_BUNDLE("host");  // host-only: these kernels make system calls

extern char **environ;

// ---- helpers ---------------------------------------------------------------

// put writes the NUL-terminated text into out and zeroes the rest.
static void put(plover_state_t *s, const char *text) {
  size_t n = strlen(text);
  if (n > s->out.len) n = s->out.len;
  memcpy(s->out.dat, text, n);
  memset(s->out.dat + n, 0, s->out.len - n);
}

static int64_t mono_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

// sleep_ms_full sleeps ms milliseconds even across signal interruptions.
static void sleep_ms_full(int64_t ms) {
  int64_t end = mono_ms() + ms;
  for (int64_t left = ms; left > 0; left = end - mono_ms()) {
    struct timespec ts = {(time_t)(left / 1000), (long)(left % 1000) * 1000000L};
    nanosleep(&ts, NULL);
  }
}

static const char *errno_name(int e) {
  switch (e) {
    case EPERM: return "EPERM";
    case ENOENT: return "ENOENT";
    case EIO: return "EIO";
    case EBADF: return "EBADF";
    case ENOMEM: return "ENOMEM";
    case EACCES: return "EACCES";
    case EFAULT: return "EFAULT";
    case ENOTDIR: return "ENOTDIR";
    case EISDIR: return "EISDIR";
    case EINVAL: return "EINVAL";
    case ENFILE: return "ENFILE";
    case EMFILE: return "EMFILE";
    case EROFS: return "EROFS";
    case ENAMETOOLONG: return "ENAMETOOLONG";
    case ENOSYS: return "ENOSYS";
    case ELOOP: return "ELOOP";
    case ENXIO: return "ENXIO";
    case ESRCH: return "ESRCH";
    default: return NULL;
  }
}

// put_err writes "ERR <errno name>" (or "ERR errno=N") into out.
static void put_err(plover_state_t *s, int e) {
  char msg[64];
  const char *name = errno_name(e);
  if (name != NULL)
    snprintf(msg, sizeof msg, "ERR %s", name);
  else
    snprintf(msg, sizeof msg, "ERR errno=%d", e);
  put(s, msg);
}

// leave_group takes the calling process out of its worker's process group:
// into a session of its own where setsid is allowed, else (a worker's
// seccomp filter refuses it) into a process group of its own in the
// worker's session. Either way killing the worker's group misses it.
static void leave_group(void) {
  if (setsid() < 0) setpgid(0, 0);
}

// input_name is the input as a process name (PR_SET_NAME's 15 bytes at
// most, NUL-terminated): a test finds the processes by /proc/PID/comm.
static void input_name(plover_state_t *s, char name[16]) {
  memset(name, 0, 16);
  size_t n = s->input.len < 15 ? s->input.len : 15;
  memcpy(name, s->input.dat, n);
}

// touch_mib maps and touches n MiB, or returns NULL. Only system calls:
// a forked child of a threaded process may use no more.
static char *touch_mib(size_t n) {
  size_t size = n << 20;
  char *p = (char *)mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return NULL;
  for (size_t i = 0; i < size; i += 4096) p[i] = 1;
  return p;
}

// A null pointer the compiler cannot see through, so the store below is a
// real write to address 0 (not folded into a trap instruction).
static int *volatile null_ptr = NULL;

// ---- the well-behaved one --------------------------------------------------

// echo: out[0:len(input)] = input, the rest of out zeroed (as kernels.cu).
PLOVER_ENTRY(echo) {
  (void)grid; (void)block;
  size_t n = s->input.len < s->out.len ? s->input.len : s->out.len;
  memcpy(s->out.dat, s->input.dat, n);
  memset(s->out.dat + n, 0, s->out.len - n);
}

// ---- crashes and exits -------------------------------------------------------

// segv: writes to address 0 (SIGSEGV).
PLOVER_ENTRY(segv) {
  (void)grid; (void)block; (void)s;
  *null_ptr = 1;
}

// abort_now: abort() (SIGABRT).
PLOVER_ENTRY(abort_now) {
  (void)grid; (void)block; (void)s;
  abort();
}

// exit_zero: exit(0) from the middle of a request: a clean-looking exit
// status that is still a dead worker.
PLOVER_ENTRY(exit_zero) {
  (void)grid; (void)block; (void)s;
  exit(0);
}

// sigterm_self: sends SIGTERM to its own process, then waits up to 5 s for
// it to take effect (delivery is asynchronous when another thread takes it)
// before returning "survived".
PLOVER_ENTRY(sigterm_self) {
  (void)grid; (void)block;
  kill(getpid(), SIGTERM);
  sleep_ms_full(5000);
  put(s, "survived SIGTERM");
}

// overflow_out: memset 1 MiB starting right past the end of out, then keeps
// writing one byte per page further on until something faults. A heap
// overflow that happens to land in mapped memory corrupts the process
// silently; walking on guarantees the worker dies (an unmapped or read-only
// page always comes), so the outcome is deterministic.
PLOVER_ENTRY(overflow_out) {
  (void)grid; (void)block;
  volatile uint8_t *p = s->out.dat + s->out.len;
  memset((void *)p, 0xAB, 1 << 20);
  p += 1 << 20;
  for (size_t i = 0; i < ((size_t)1 << 22); i++, p += 4096) *p = 0xAB;  // 16 GiB of pages
  abort();  // unreachable in practice: nothing is mapped that contiguously
}

// ---- never returning -------------------------------------------------------

// spin: an infinite busy loop.
PLOVER_ENTRY(spin) {
  (void)grid; (void)block; (void)s;
  volatile unsigned long n = 0;
  for (;;) n++;
}

// sleep_long: sleeps 10 s, then echoes.
PLOVER_ENTRY(sleep_long) {
  sleep_ms_full(10000);
  echo(s, grid, block);
}

// ---- file descriptors and processes -----------------------------------------

// close_fds: closes fds 3..1023 (whatever the worker talks to the server
// over), then returns normally.
PLOVER_ENTRY(close_fds) {
  (void)grid; (void)block;
  for (int fd = 3; fd < 1024; fd++) close(fd);
  put(s, "closed fds 3..1023");
}

// ring_twice: echoes its input, and first writes a forged "done" message (a
// success status, everything else zero, as long as a run's reply or
// longer) on every SOCK_SEQPACKET descriptor it has: the worker's channels
// to the server. A server that took it for the run's reply would answer
// this request early and the next one with this one's output.
// ring_n sends a forged message of size bytes (128 at most) on every
// SOCK_SEQPACKET descriptor in [from, to): a success status, then index
// (read as a kernel lookup's answer, or the low half of a run's copy-in
// time), then zeros.
static int ring_n(int from, int to, uint32_t index, size_t size) {
  char forged[128] = {0};
  memcpy(forged + 1, &index, sizeof index);
  if (size > sizeof forged) size = sizeof forged;
  int rung = 0;
  for (int fd = from; fd < to; fd++) {
    int type = 0;
    socklen_t len = sizeof type;
    if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &len) == 0 && type == SOCK_SEQPACKET &&
        send(fd, forged, size, MSG_DONTWAIT) == (ssize_t)size)
      rung++;
  }
  return rung;
}

// A run reply's header is 69 bytes (worker/wire ReplyHeader, protocol
// 15): a forged reply of fewer is read as malformed, not as a reply out of
// turn, which is what ring_twice is for.
static const size_t forged_reply = 128;

static void echo_or(plover_state_t *s, int rung) {
  size_t n = s->input.len < s->out.len ? s->input.len : s->out.len;
  memcpy(s->out.dat, s->input.dat, n);
  memset(s->out.dat + n, 0, s->out.len - n);
  if (rung == 0) put(s, "no channel to ring");
}

PLOVER_ENTRY(ring_twice) {
  (void)grid; (void)block;
  echo_or(s, ring_n(3, 1024, 0, forged_reply));
}

// ring_control: the same on fd 3 alone, the worker's control channel, where
// the server's next call (a kernel lookup, a new instance) would read it as
// that call's reply: a lookup would get kernel 0x7fffffff.
PLOVER_ENTRY(ring_control) {
  (void)grid; (void)block;
  echo_or(s, ring_n(3, 4, 0x7fffffff, 64));
}

// ring_short: the same as ring_twice on every channel but the control
// channel (fd 3), with a message of 5 bytes, too short to be a run's
// reply: the server must end the worker for its run at once, as for a
// reply out of turn, not wait for a death that does not come.
PLOVER_ENTRY(ring_short) {
  (void)grid; (void)block;
  echo_or(s, ring_n(4, 1024, 0, 5));
}

// ring_empty: the same with a message of no bytes, which a read takes
// for the channel's end unless it looks: the server must end the worker
// for its run at once, as for a short reply, not wait for a death.
PLOVER_ENTRY(ring_empty) {
  (void)grid; (void)block;
  echo_or(s, ring_n(4, 1024, 0, 0));
}

static const char fake_http[] =
    "HTTP/1.1 200 OK\r\n"
    "Content-Type: application/json\r\n"
    "Content-Length: 37\r\n"
    "Connection: close\r\n"
    "\r\n"
    "{\"status\":\"hijacked by fork_accept\"}\n";

// steal_connections is the forked child of fork_accept. For `seconds` it
// accepts on every listening socket it inherited among fds 3..1023 and
// answers each connection with a fake 200 healthz. After its first full scan
// it writes one byte to ready_fd, so the parent returns only once the child is
// actively stealing. It never touches Go or the runtime: signal dispositions
// are reset (the parent's handlers are the worker's), and it ends with _exit.
static void steal_connections(int ready_fd, int seconds) {
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, NULL);
  for (int sig = 1; sig < 32; sig++) signal(sig, SIG_DFL);
  signal(SIGPIPE, SIG_IGN);
  alarm((unsigned)seconds + 2);  // backstop: a blocking accept cannot keep it alive
  int64_t end = mono_ms() + (int64_t)seconds * 1000;
  int fds[1024];
  int nfds = 0, stolen = 0;
  int64_t rescan = 0;
  int signalled = 0;
  while (mono_ms() < end) {
    if (mono_ms() >= rescan) {
      nfds = 0;
      for (int fd = 3; fd < 1024; fd++) {
        if (fd == ready_fd) continue;
        int on = 0;
        socklen_t l = sizeof on;
        if (getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &on, &l) == 0 && on) fds[nfds++] = fd;
      }
      rescan = mono_ms() + 200;
      if (!signalled) {
        char b = (char)(nfds > 255 ? 255 : nfds);
        if (write(ready_fd, &b, 1) < 0) { /* the parent gave up waiting */ }
        close(ready_fd);
        signalled = 1;
      }
    }
    struct pollfd pfd[1024];
    for (int i = 0; i < nfds; i++) {
      pfd[i].fd = fds[i];
      pfd[i].events = POLLIN;
      pfd[i].revents = 0;
    }
    if (nfds == 0) {
      sleep_ms_full(50);
      continue;
    }
    if (poll(pfd, (nfds_t)nfds, 50) <= 0) continue;
    for (int i = 0; i < nfds; i++) {
      if (!(pfd[i].revents & POLLIN)) continue;
      int c = accept(pfd[i].fd, NULL, NULL);  // may block if the owner won the race; alarm ends that
      if (c < 0) continue;
      stolen++;
      char req[4096];
      struct pollfd rp = {c, POLLIN, 0};
      if (poll(&rp, 1, 200) > 0) {
        ssize_t r = recv(c, req, sizeof req, MSG_DONTWAIT);
        (void)r;
      }
      ssize_t w = send(c, fake_http, sizeof fake_http - 1, MSG_NOSIGNAL);
      (void)w;
      close(c);
    }
  }
  _exit(stolen > 0 ? 3 : 0);
}

// fork_accept: fork()s; the child steals connections for `grid` seconds (10
// when grid < 2) as above and then exits by itself; the parent waits (up to
// 2 s) until the child has made its first scan and returns normally, writing
// "forked <child pid> listeners=<n>" into out.
PLOVER_ENTRY(fork_accept) {
  (void)block;
  int seconds = grid >= 2 && grid <= 60 ? grid : 10;
  int p[2];
  if (pipe(p) != 0) { put_err(s, errno); return; }
  pid_t pid = fork();
  if (pid < 0) { put_err(s, errno); close(p[0]); close(p[1]); return; }
  if (pid == 0) {
    close(p[0]);
    steal_connections(p[1], seconds);
  }
  close(p[1]);
  int listeners = -1;
  struct pollfd rp = {p[0], POLLIN, 0};
  if (poll(&rp, 1, 2000) > 0) {
    unsigned char b;
    if (read(p[0], &b, 1) == 1) listeners = b;
  }
  close(p[0]);
  char msg[96];
  snprintf(msg, sizeof msg, "forked %d listeners=%d", (int)pid, listeners);
  put(s, msg);
}

static void *spin_forever(void *arg) {
  (void)arg;
  volatile unsigned long n = 0;
  for (;;) n++;
  return NULL;
}

// The first NSpid of /proc/self/status: our pid as seen from the namespace
// that mounted /proc (getpid() if that line is missing).
static long outer_pid(void) {
  long pid = (long)getpid();
  FILE *f = fopen("/proc/self/status", "r");
  if (f == NULL) return pid;
  char line[256];
  while (fgets(line, sizeof line, f) != NULL) {
    if (strncmp(line, "NSpid:", 6) == 0) {
      long v = strtol(line + 6, NULL, 10);
      if (v > 0) pid = v;
      break;
    }
  }
  fclose(f);
  return pid;
}

// threads: starts 4 detached threads that spin forever and returns, writing
// "<pid>" (this process's pid) into out.
PLOVER_ENTRY(threads) {
  (void)grid; (void)block;
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
  int started = 0;
  for (int i = 0; i < 4; i++) {
    pthread_t th;
    if (pthread_create(&th, &attr, spin_forever, NULL) == 0) started++;
  }
  pthread_attr_destroy(&attr);
  char msg[64];
  snprintf(msg, sizeof msg, "%ld", outer_pid());
  put(s, msg);
  if (started != 4) plover_fail(s, "threads: pthread_create failed");
}

// spawn_spinner: starts a process that spins forever and returns, writing
// "spawned". grid 1: its child, never waited for; grid 2: its grandchild,
// orphaned at once (the child exits and is reaped here), as a daemon's.
PLOVER_ENTRY(spawn_spinner) {
  (void)block;
  pid_t c = fork();
  if (c < 0) { plover_fail(s, "spawn_spinner: fork failed"); return; }
  if (c == 0) {
    if (grid == 2 && fork() != 0) _exit(0);
    spin_forever(NULL);
  }
  if (grid == 2) {
    while (waitpid(c, NULL, 0) < 0 && errno == EINTR) {}
  }
  put(s, "spawned");
}

// watch_reap: leaves a process (out of its group: leave_group) that spins until
// its worker's pid is free (reaped: kill() says ESRCH; a zombie still
// holds it), then says so on stdout, and stays: the pid could be another
// process's by then, which the seccomp reach filter would let it set
// limits on. Writes "watching PID" (that process's) once it runs.
PLOVER_ENTRY(watch_reap) {
  (void)grid; (void)block;
  pid_t worker = getpid();
  int ready[2];
  if (pipe(ready) != 0) { plover_fail(s, "watch_reap: pipe failed"); return; }
  pid_t c = fork();
  if (c < 0) { plover_fail(s, "watch_reap: fork failed"); return; }
  if (c == 0) {
    leave_group();
    close(ready[0]);
    close(ready[1]);
    while (kill(worker, 0) == 0 || errno != ESRCH) {}
    printf("watch_reap: worker %ld reaped while its stray ran\n", (long)worker);
    fflush(stdout);
    for (;;) pause();
  }
  close(ready[1]);
  char b;
  while (read(ready[0], &b, 1) < 0 && errno == EINTR) {}
  close(ready[0]);
  char msg[64];
  snprintf(msg, sizeof msg, "watching %ld", (long)c); // as its namespace numbers it
  put(s, msg);
}

// clone_parent: makes a child that waits forever with clone(CLONE_PARENT),
// so that it would be the server's, out of its worker's tree; writes
// "clone_parent: refused E..." or "clone_parent: child PID".
static char clone_parent_stack[1 << 16];
static int clone_parent_wait(void *arg) {
  (void)arg;
  for (;;) pause();
  return 0;
}

PLOVER_ENTRY(clone_parent) {
  (void)grid; (void)block;
  char msg[64];
  int c = clone(clone_parent_wait, clone_parent_stack + sizeof clone_parent_stack, CLONE_PARENT, NULL);
  if (c < 0) snprintf(msg, sizeof msg, "clone_parent: refused %s", errno == EPERM ? "EPERM" : strerror(errno));
  else snprintf(msg, sizeof msg, "clone_parent: child %d", c);
  put(s, msg);
}

// child_errno reaps child c, which exits with the errno of the call it
// made (0 for none), and returns that errno, or -1 if c did not exit.
static int child_errno(pid_t c) {
  int st = 0;
  while (waitpid(c, &st, 0) < 0 && errno == EINTR) {}
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

// new_session: a child that calls setsid(), which would put it in a
// scheduling group of its own where the kernel schedules sessions as
// groups (autogroups, at nice 0: out of its worker's weight); writes
// "new_session: OK" or "new_session: E...".
PLOVER_ENTRY(new_session) {
  (void)grid; (void)block;
  pid_t c = fork();
  if (c < 0) { plover_fail(s, "new_session: fork failed"); return; }
  if (c == 0) _exit(setsid() < 0 ? errno : 0);
  int e = child_errno(c);
  if (e < 0) { plover_fail(s, "new_session: the child did not exit"); return; }
  const char *name = errno_name(e);
  char msg[64];
  if (e == 0) snprintf(msg, sizeof msg, "new_session: OK");
  else if (name != NULL) snprintf(msg, sizeof msg, "new_session: %s", name);
  else snprintf(msg, sizeof msg, "new_session: errno=%d", e);
  put(s, msg);
}

// namespaces: asks for a user and a network namespace of its own, where a
// process holds every capability, CAP_NET_ADMIN over its network among
// them (nf_tables, tc, xfrm: the kernel's code most often found exploitable
// by an unprivileged process), by unshare in a forked child (the kernel
// refuses unshare(CLONE_NEWUSER) to a process of more than one thread, as
// a worker is) and by a clone into them. Writes "unshare=OK clone=OK", an
// errno's name in place of OK where a call failed.
PLOVER_ENTRY(namespaces) {
  (void)grid; (void)block;
  const long flags = CLONE_NEWUSER | CLONE_NEWNET;
  pid_t c = fork();
  if (c < 0) { plover_fail(s, "namespaces: fork failed"); return; }
  if (c == 0) _exit(unshare((int)flags) < 0 ? errno : 0);
  int unshared = child_errno(c);
  // A raw clone, fork's way: the child only exits.
  long d = syscall(SYS_clone, flags | SIGCHLD, 0, 0, 0, 0);
  if (d == 0) _exit(0);
  int cloned = d < 0 ? errno : child_errno((pid_t)d);
  auto name = [](int e) -> const char * {
    const char *n = e == 0 ? "OK" : e > 0 ? strerrorname_np(e) : NULL;
    return n != NULL ? n : "?";
  };
  char msg[64];
  snprintf(msg, sizeof msg, "unshare=%s clone=%s", name(unshared), name(cloned));
  put(s, msg);
}

// helpers: computes on 4 threads of its own, 20 ms of CPU each, joins them
// and echoes the input: the calling thread does almost none of the work.
static void *burn_20ms(void *arg) {
  (void)arg;
  struct timespec ts;
  volatile unsigned x = 1;
  do {
    for (int i = 0; i < 10000; i++) x = x * 1664525u + 1013904223u;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  } while (ts.tv_sec == 0 && ts.tv_nsec < 20000000);
  return NULL;
}

PLOVER_ENTRY(helpers) {
  (void)grid; (void)block;
  pthread_t th[4];
  int started = 0;
  for (int i = 0; i < 4; i++)
    if (pthread_create(&th[started], NULL, burn_20ms, NULL) == 0) started++;
  for (int i = 0; i < started; i++) pthread_join(th[i], NULL);
  size_t n = s->input.len < s->out.len ? s->input.len : s->out.len;
  memcpy(s->out.dat, s->input.dat, n);
  if (started != 4) plover_fail(s, "helpers: pthread_create failed");
}

// daemonize: the classic daemon's double fork. The child leaves its
// worker's process group (leave_group: a session of its own where the
// worker's seccomp filter is off, else a process group of its own; killing
// the worker's group misses it either way) and forks again; the grandchild, orphaned at once, takes the input as
// its name (PR_SET_NAME, 15 bytes at most: a test finds it by
// /proc/PID/comm), closes every descriptor but stdio, prints
// "daemon <pid as the server sees it>" on stdout (the function's log) and
// sleeps for ever. Writes "daemonized" once the child exited.
PLOVER_ENTRY(daemonize) {
  (void)grid; (void)block;
  char name[16];
  input_name(s, name);
  pid_t c = fork();
  if (c < 0) { plover_fail(s, "daemonize: fork failed"); return; }
  if (c == 0) {
    leave_group();
    pid_t g = fork();
    if (g != 0) _exit(g < 0 ? 1 : 0);
    prctl(PR_SET_NAME, name, 0, 0, 0);
    for (int fd = 3; fd < 1024; fd++) close(fd);
    printf("daemon %ld\n", outer_pid());
    fflush(stdout);
    for (;;) pause();
  }
  int st = 0;
  while (waitpid(c, &st, 0) < 0 && errno == EINTR) {}
  if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
    plover_fail(s, "daemonize: the second fork failed");
    return;
  }
  put(s, "daemonized");
}

// ---- reading what it should not --------------------------------------------

// env: the process environment, one NAME=value per line, truncated to out.
PLOVER_ENTRY(env) {
  (void)grid; (void)block;
  size_t n = 0;
  for (char **e = environ; e != NULL && *e != NULL && n < s->out.len; e++) {
    size_t l = strlen(*e);
    if (l > s->out.len - n) l = s->out.len - n;
    memcpy(s->out.dat + n, *e, l);
    n += l;
    if (n < s->out.len) s->out.dat[n++] = '\n';
  }
  memset(s->out.dat + n, 0, s->out.len - n);
}

// read_file: input is a path (trailing NULs ignored); out gets the file's
// first out.len bytes, or "ERR <errno name>".
PLOVER_ENTRY(read_file) {
  (void)grid; (void)block;
  char path[4096];
  size_t n = s->input.len;
  while (n > 0 && s->input.dat[n - 1] == 0) n--;
  if (n == 0 || n >= sizeof path || memchr(s->input.dat, 0, n) != NULL) { put_err(s, EINVAL); return; }
  memcpy(path, s->input.dat, n);
  path[n] = 0;
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) { put_err(s, errno); return; }
  size_t got = 0;
  while (got < s->out.len) {
    ssize_t r = read(fd, s->out.dat + got, s->out.len - got);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) { int e = errno; close(fd); put_err(s, e); return; }
    if (r == 0) break;
    got += (size_t)r;
  }
  close(fd);
  memset(s->out.dat + got, 0, s->out.len - got);
}

// The marker memscan looks for is the input with every byte XORed with
// 0x5A, so no copy of the request itself (in the worker's receive buffers,
// the input buffer, shared memory with the server) contains the marker.
#define MEMSCAN_KEY 0x5A

struct skip_range {
  const uint8_t *lo, *hi;
};

static int overlaps(uintptr_t a, uintptr_t b, const struct skip_range *skip, int nskip) {
  for (int i = 0; i < nskip; i++)
    if (a < (uintptr_t)skip[i].hi && (uintptr_t)skip[i].lo < b) return 1;
  return 0;
}

// find_in scans [lo, hi) read through fd (/proc/self/mem), or directly when
// fd < 0, for needle; it returns the address found or 0. chunk is the read
// buffer (its own range is among skip).
static uintptr_t find_in(int fd, uintptr_t lo, uintptr_t hi, const uint8_t *needle, size_t nlen,
                         uint8_t *chunk, size_t chunk_len, const struct skip_range *skip, int nskip) {
  for (uintptr_t at = lo; at < hi;) {
    size_t want = hi - at < chunk_len ? (size_t)(hi - at) : chunk_len;
    const uint8_t *buf;
    if (fd >= 0) {
      ssize_t r = pread(fd, chunk, want, (off_t)at);
      if (r <= 0) {  // an unreadable page (guard, vvar): skip one page
        at = (at + 4096) & ~(uintptr_t)4095;
        continue;
      }
      want = (size_t)r;
      buf = chunk;
    } else {
      buf = (const uint8_t *)at;
    }
    for (const uint8_t *p = buf; want >= nlen && p <= buf + want - nlen;) {
      const uint8_t *q = (const uint8_t *)memmem(p, (size_t)(buf + want - p), needle, nlen);
      if (q == NULL) break;
      uintptr_t addr = at + (uintptr_t)(q - buf);
      if (!overlaps(addr, addr + nlen, skip, nskip)) return addr;
      p = q + 1;
    }
    if (at + want >= hi) break;
    at += want > nlen ? want - nlen + 1 : want;  // overlap so a match across chunks is seen
  }
  return 0;
}

// memscan: decodes the marker from the input (XOR 0x5A, at least 8 bytes)
// and scans every readable mapping of this process for it, skipping the
// input buffer, its own decoded copy and its read buffer. Writes "FOUND" or
// "NOTFOUND" (or "ERR ..." when /proc/self/maps cannot be read). With grid
// == 2 it first plants a copy of the marker in a heap buffer it does not
// skip: a self-test that must answer FOUND. Every copy it made is wiped
// before it returns.
PLOVER_ENTRY(memscan) {
  (void)block;
  size_t nlen = s->input.len;
  if (nlen < 8 || nlen > 4096) { put_err(s, EINVAL); return; }
  const size_t chunk_len = 1 << 20;
  uint8_t *needle = (uint8_t *)malloc(nlen);
  uint8_t *chunk = (uint8_t *)malloc(chunk_len);
  uint8_t *planted = NULL;
  if (needle == NULL || chunk == NULL) { free(needle); free(chunk); put_err(s, ENOMEM); return; }
  for (size_t i = 0; i < nlen; i++) needle[i] = (uint8_t)(s->input.dat[i] ^ MEMSCAN_KEY);
  if (grid == 2) {
    planted = (uint8_t *)malloc(nlen + 64);
    if (planted != NULL) memcpy(planted + 32, needle, nlen);
    __asm__ volatile("" : : "r"(planted) : "memory");  // keep the planted copy
  }
  struct skip_range skip[3] = {
      {s->input.dat, s->input.dat + s->input.len},
      {needle, needle + nlen},
      {chunk, chunk + chunk_len},
  };
  FILE *maps = fopen("/proc/self/maps", "r");
  if (maps == NULL) {
    int e = errno;
    free(needle); free(chunk); free(planted);
    put_err(s, e);
    return;
  }
  int mem = open("/proc/self/mem", O_RDONLY | O_CLOEXEC);
  uintptr_t found = 0;
  char line[512];
  while (found == 0 && fgets(line, sizeof line, maps) != NULL) {
    unsigned long lo, hi;
    char perms[8] = {0};
    if (sscanf(line, "%lx-%lx %7s", &lo, &hi, perms) != 3) continue;
    if (perms[0] != 'r') continue;
    if (strstr(line, "[vvar") != NULL || strstr(line, "[vsyscall]") != NULL) continue;
    if (mem < 0) {
      // No /proc/self/mem: read only private anonymous writable memory directly
      // (heaps, stacks, thread arenas); file mappings hold no request data.
      int anon = strchr(line, '/') == NULL;
      if (!(anon && perms[1] == 'w' && perms[3] == 'p')) continue;
    }
    found = find_in(mem, (uintptr_t)lo, (uintptr_t)hi, needle, nlen, chunk, chunk_len, skip, 3);
  }
  fclose(maps);
  if (mem >= 0) close(mem);
  // Wipe every copy of the marker before freeing it: freed heap memory keeps
  // its bytes, and a later memscan in this worker must not find them.
  explicit_bzero(needle, nlen);
  explicit_bzero(chunk, chunk_len);
  if (planted != NULL) explicit_bzero(planted, nlen + 64);
  free(needle);
  free(chunk);
  free(planted);
  put(s, found ? "FOUND" : "NOTFOUND");
}

// ---- reaching other processes -------------------------------------------------

// signal_pid: the input is a decimal pid; sends it SIGKILL and writes "OK",
// or "ERR <errno name>" when the kernel refuses.
PLOVER_ENTRY(signal_pid) {
  (void)grid; (void)block;
  char buf[32] = {0};
  size_t n = s->input.len < sizeof buf - 1 ? s->input.len : sizeof buf - 1;
  memcpy(buf, s->input.dat, n);
  long pid = strtol(buf, NULL, 10);
  if (pid <= 1) { put(s, "ERR bad pid"); return; }
  if (kill((pid_t)pid, SIGKILL) == 0) { put(s, "OK"); return; }
  char msg[64];
  snprintf(msg, sizeof msg, "ERR %s", strerrorname_np(errno));
  put(s, msg);
}

// poke: the input is "<op> <pid>"; reaches another process without a
// signal, by what the kernel allows a process of the same uid: op "cpu"
// sets its RLIMIT_CPU to 1 s (the kernel then kills it by SIGXCPU, then
// SIGKILL, as soon as it has used 1 s of CPU), "nice" its nice level to 19,
// "cpus" its CPU affinity to CPU 0 alone, "sched" its policy to
// SCHED_IDLE, "schedattr" its nice level to 19 by sched_setattr, "ioprio"
// its I/O class to idle (each acts on one thread: pid may be any thread's
// id). Writes "OK", or "ERR <errno
// name>" when the kernel refuses. Op "pgrp", from a child (a worker leads
// its session, and setpgid on a session leader fails whatever the target),
// joins the process group whose id is pid (a worker's is its pid) and sets
// that group's nice level to 19. Op "autogroup" sets the nice level of
// pid's autogroup (its session's group, where the kernel schedules
// sessions as groups) to 0, which the kernel allows any process that may
// write the file: a worker weighed at 10 there would take the server's
// weight back; "myautogroup" does it to its own (pid ignored).
PLOVER_ENTRY(poke) {
  (void)grid; (void)block;
  char buf[64] = {0};
  size_t n = s->input.len < sizeof buf - 1 ? s->input.len : sizeof buf - 1;
  memcpy(buf, s->input.dat, n);
  char op[16] = {0};
  long pid = 0;
  if (sscanf(buf, "%15s %ld", op, &pid) != 2 || pid <= 1) { put(s, "ERR bad input"); return; }
  int rc = -1;
  if (strcmp(op, "cpu") == 0) {
    struct rlimit lim = {1, 2};
    rc = prlimit((pid_t)pid, RLIMIT_CPU, &lim, NULL);
  } else if (strcmp(op, "nice") == 0) {
    rc = setpriority(PRIO_PROCESS, (id_t)pid, 19);
  } else if (strcmp(op, "pgrp") == 0) {
    int fds[2];
    if (pipe(fds) != 0) { put(s, "ERR pipe"); return; }
    pid_t c = fork();
    if (c == 0) {
      int e = 0;
      if (setpgid(0, (pid_t)pid) != 0 || setpriority(PRIO_PGRP, 0, 19) != 0) e = errno;
      if (write(fds[1], &e, sizeof e) != (ssize_t)sizeof e) _exit(1);
      _exit(0);
    }
    close(fds[1]);
    int e = -1;
    if (c < 0 || read(fds[0], &e, sizeof e) != (ssize_t)sizeof e) e = c < 0 ? errno : EIO;
    close(fds[0]);
    if (c > 0) waitpid(c, NULL, 0);
    errno = e;
    rc = e == 0 ? 0 : -1;
  } else if (strcmp(op, "autogroup") == 0 || strcmp(op, "myautogroup") == 0) {
    char path[64];
    if (strcmp(op, "autogroup") == 0) snprintf(path, sizeof path, "/proc/%ld/autogroup", pid);
    else snprintf(path, sizeof path, "/proc/self/autogroup");
    int fd = open(path, O_WRONLY);
    rc = fd < 0 ? -1 : (write(fd, "0", 1) == 1 ? 0 : -1);
    if (fd >= 0) { int e = errno; close(fd); errno = e; }
  } else if (strcmp(op, "cpus") == 0) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(0, &set);
    rc = sched_setaffinity((pid_t)pid, sizeof set, &set);
  } else if (strcmp(op, "sched") == 0) {
    struct sched_param sp = {0};
    rc = sched_setscheduler((pid_t)pid, SCHED_IDLE, &sp);
  } else if (strcmp(op, "schedattr") == 0) {
    // struct sched_attr's first fields (linux/sched/types.h): SCHED_OTHER
    // at nice 19, around setpriority.
    struct { uint32_t size, policy; uint64_t flags; int32_t nice; uint32_t prio; uint64_t rt, dl, period; } attr = {0};
    attr.size = sizeof attr;
    attr.nice = 19;
    rc = (int)syscall(SYS_sched_setattr, (pid_t)pid, &attr, 0);
  } else if (strcmp(op, "ioprio") == 0) {
    rc = (int)syscall(SYS_ioprio_set, 1 /* IOPRIO_WHO_PROCESS */, (int)pid, 3 << 13 /* IOPRIO_CLASS_IDLE */);
  } else {
    put(s, "ERR bad op");
    return;
  }
  if (rc == 0) { put(s, "OK"); return; }
  char msg[64];
  snprintf(msg, sizeof msg, "ERR %s", strerrorname_np(errno));
  put(s, msg);
}

// in4_input reads the input, "a.b.c.d:port", into sa; on a bad one it
// writes "ERR bad address" and returns -1.
static int in4_input(plover_state_t *s, struct sockaddr_in *sa) {
  char buf[64] = {0};
  size_t n = s->input.len < sizeof buf - 1 ? s->input.len : sizeof buf - 1;
  memcpy(buf, s->input.dat, n);
  char *colon = strchr(buf, ':');
  if (colon == NULL) { put(s, "ERR bad address"); return -1; }
  *colon = 0;
  memset(sa, 0, sizeof *sa);
  sa->sin_family = AF_INET;
  sa->sin_port = htons((uint16_t)atoi(colon + 1));
  if (inet_pton(AF_INET, buf, &sa->sin_addr) != 1) { put(s, "ERR bad address"); return -1; }
  return 0;
}

// put_errname writes "ERR <errno name>" of e (any errno glibc names).
static void put_errname(plover_state_t *s, int e) {
  char msg[64];
  snprintf(msg, sizeof msg, "ERR %s", strerrorname_np(e));
  put(s, msg);
}

// connect_tcp: the input is "a.b.c.d:port"; connects and writes "OK", or
// "ERR <errno name>".
PLOVER_ENTRY(connect_tcp) {
  (void)grid; (void)block;
  struct sockaddr_in sa;
  if (in4_input(s, &sa) < 0) return;
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) { put_errname(s, errno); return; }
  int rc = connect(fd, (struct sockaddr *)&sa, sizeof sa);
  int e = errno;
  close(fd);
  if (rc == 0) put(s, "OK");
  else put_errname(s, e);
}

// send_udp: the input is "a.b.c.d:port"; sends the datagram "plover-udp"
// there and writes "OK", or "ERR <errno name>" of the call that failed.
PLOVER_ENTRY(send_udp) {
  (void)grid; (void)block;
  struct sockaddr_in sa;
  if (in4_input(s, &sa) < 0) return;
  int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) { put_errname(s, errno); return; }
  static const char dgram[] = "plover-udp";
  ssize_t n = sendto(fd, dgram, sizeof dgram - 1, 0, (struct sockaddr *)&sa, sizeof sa);
  int e = errno;
  close(fd);
  if (n == (ssize_t)(sizeof dgram - 1)) put(s, "OK");
  else if (n < 0) put_errname(s, e);
  else put(s, "ERR short send");
}

// whoami: writes this worker's pid (as its parent sees it).
PLOVER_ENTRY(whoami) {
  (void)grid; (void)block;
  char msg[32];
  snprintf(msg, sizeof msg, "%ld", outer_pid());
  put(s, msg);
}

// fork_holder forks a child named name that maps and touches mib MiB and
// holds it for ever (*child: its pid). It returns 1 once the child holds
// it all, 0 if the child died first (not reaped), -1 if it could not fork.
static int fork_holder(const char *name, size_t mib, pid_t *child) {
  int ready[2];
  if (pipe(ready) != 0) return -1;
  pid_t c = fork();
  if (c < 0) {
    close(ready[0]);
    close(ready[1]);
    return -1;
  }
  if (c == 0) {
    // Only system calls after a fork in a threaded process: no malloc.
    close(ready[0]);
    prctl(PR_SET_NAME, name, 0, 0, 0);
    if (touch_mib(mib) == NULL) _exit(1);
    char b = 1;
    while (write(ready[1], &b, 1) < 0 && errno == EINTR) {}
    for (;;) pause();
  }
  *child = c;
  close(ready[1]);
  char b;
  ssize_t r;
  while ((r = read(ready[0], &b, 1)) < 0 && errno == EINTR) {}
  close(ready[0]);
  return r == 1;
}

// fork_hog: forks a child, named by the input (PR_SET_NAME, 15 bytes at
// most: a test finds it by /proc/PID/comm), that maps and touches `grid`
// MiB and holds it for ever: memory outside the worker process, which its
// resident-memory check does not see. Writes "held" once the child holds
// it all, or "killed by signal N" if the child died first (reaped here).
PLOVER_ENTRY(fork_hog) {
  (void)block;
  char name[16];
  input_name(s, name);
  pid_t c;
  int held = fork_holder(name, (size_t)grid, &c);
  if (held < 0) { plover_fail(s, "fork_hog: pipe or fork failed"); return; }
  if (held) { put(s, "held"); return; }
  int st = 0;
  while (waitpid(c, &st, 0) < 0 && errno == EINTR) {}
  char msg[64];
  snprintf(msg, sizeof msg, "killed by signal %d", WIFSIGNALED(st) ? WTERMSIG(st) : 0);
  put(s, msg);
}

// fork_swarm: forks `grid` children, named by the input (PR_SET_NAME, 15
// bytes at most), one after the other, each of which maps and touches
// `block` MiB and holds it for ever: processes each smaller than the
// server, whose sum is not. Once each child holds its memory or died (the
// OOM killer), it maps and touches as much as all of them itself, and
// writes "survived: H held, D died" should it get that far: under a memory
// limit below that the kernel's OOM killer ends it first, or whatever else
// it picks.
PLOVER_ENTRY(fork_swarm) {
  char name[16];
  input_name(s, name);
  int held = 0;
  for (int i = 0; i < grid; i++) {
    pid_t c;
    int r = fork_holder(name, (size_t)block, &c);
    if (r < 0) { plover_fail(s, "fork_swarm: pipe or fork failed"); return; }
    held += r;
  }
  if (touch_mib((size_t)grid * (size_t)block) == NULL) { plover_fail(s, "fork_swarm: mmap failed"); return; }
  char msg[64];
  snprintf(msg, sizeof msg, "survived: %d held, %d died", held, grid - held);
  put(s, msg);
}

// hide_memory: writes `grid` MiB into a memfd it keeps open and never maps:
// memory the worker holds outside its VmRSS. Writes "hidden" once it all
// is, then keeps it for the worker's life.
PLOVER_ENTRY(hide_memory) {
  (void)block;
  int fd = (int)syscall(SYS_memfd_create, "hide_memory", 0);
  if (fd < 0) { plover_fail(s, "hide_memory: memfd_create failed"); return; }
  static char chunk[1 << 16];
  memset(chunk, 1, sizeof chunk);
  for (size_t left = (size_t)grid << 20; left > 0;) {
    ssize_t w = write(fd, chunk, left < sizeof chunk ? left : sizeof chunk);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) { plover_fail(s, "hide_memory: write failed"); return; }
    left -= (size_t)w;
  }
  put(s, "hidden");
}

// hog_memory: allocates and touches `grid` MiB, holds it for 10 × `block`
// milliseconds, then frees it.
PLOVER_ENTRY(hog_memory) {
  size_t n = (size_t)grid << 20;
  char *p = (char *)malloc(n);
  if (p == NULL) { plover_fail(s, "hog_memory: malloc failed"); return; }
  for (size_t i = 0; i < n; i += 4096) p[i] = (char)i;
  long ms = 10L * block;
  struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
  free(p);
  put(s, "held");
}

// ipc: asks for each kind of object the kernel keeps for the node rather
// than the process, which one tenant's worker could leave for another's to
// find (System V shared memory, queues and semaphores, a POSIX message
// queue, the uid's keyrings), and for the calls a filter cannot read
// (clone3, io_uring). Writes "NAME=OK" or "NAME=<errno name>" for each,
// space-separated; anything it made is removed at once.
PLOVER_ENTRY(ipc) {
  (void)grid; (void)block;
  const key_t key = 0x706c76;  // a fixed key: what a second tenant would guess
  char msg[512] = {0};
  size_t at = 0;
  auto note = [&](const char *name, long rc) {
    const char *e = rc >= 0 ? "OK" : strerrorname_np(errno);
    at += (size_t)snprintf(msg + at, sizeof msg - at, "%s%s=%s", at ? " " : "", name, e ? e : "?");
  };
  long rc = syscall(SYS_shmget, key, 4096, IPC_CREAT | 0666);
  note("shmget", rc);
  if (rc >= 0) syscall(SYS_shmctl, rc, IPC_RMID, NULL);
  rc = syscall(SYS_msgget, key, IPC_CREAT | 0666);
  note("msgget", rc);
  if (rc >= 0) syscall(SYS_msgctl, rc, IPC_RMID, NULL);
  rc = syscall(SYS_semget, key, 1, IPC_CREAT | 0666);
  note("semget", rc);
  if (rc >= 0) syscall(SYS_semctl, rc, 0, IPC_RMID, 0);
  rc = syscall(SYS_mq_open, "plover-ipc", O_RDWR | O_CREAT, 0666, NULL);
  note("mq_open", rc);
  if (rc >= 0) { close((int)rc); syscall(SYS_mq_unlink, "plover-ipc"); }
  rc = syscall(SYS_add_key, "user", "plover-ipc", "note", 4, -4 /* KEY_SPEC_USER_KEYRING */);
  note("add_key", rc);
  if (rc >= 0) syscall(SYS_keyctl, 21 /* KEYCTL_INVALIDATE */, rc);
  rc = syscall(SYS_keyctl, 0 /* KEYCTL_GET_KEYRING_ID */, -4, 0);
  note("keyctl", rc);
  rc = syscall(SYS_request_key, "user", "plover-ipc", NULL, 0);
  note("request_key", rc);
  rc = syscall(SYS_io_uring_setup, 1, NULL);  // EFAULT where it is let through
  note("io_uring_setup", rc);
  rc = syscall(SYS_clone3, NULL, 0);  // EINVAL where it is let through
  note("clone3", rc);
  put(s, msg);
}
