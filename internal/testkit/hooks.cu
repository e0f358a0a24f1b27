// ABI 2 lifecycle hooks for Plover's tests (host target). plover_load
// "decodes" the constants in place (each byte inverted) and shares a pointer;
// each instance counts its requests in memory plover_instance_init made.
// -DFAIL_LOAD and -DFAIL_INIT make those hooks fail; -DCRASH_LOAD makes
// plover_load segfault and -DHANG_INIT makes plover_instance_init hang (a
// hostile bundle's hooks), -DHANG_FINI plover_instance_fini;
// -DSLOW_INIT_MS=n, -DSLOW_FINI_MS=n and -DSLOW_UNLOAD_MS=n make
// plover_instance_init, _fini and plover_unload take n ms; -DSAY_INIT
// makes plover_instance_init say on stderr that it begins;
// -DEMPTY_INIT_MESSAGE makes plover_instance_init send a message of no
// bytes on the worker's control channel (fd 3), ahead of the init's reply.
#include <signal.h>
#include <stdio.h>
#ifdef EMPTY_INIT_MESSAGE
#include <sys/socket.h>
#endif
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "plover_kernel.h"

PLOVER_BUNDLE(PLOVER_TARGET);

typedef struct {
  uint64_t requests;
} instance_t;

static int program_tag;

// Hook calls, for tests: load, instance init, instance fini, unload.
extern "C" {
__attribute__((visibility("default"))) long long hooks_calls[4] = {0, 0, 0, 0};
}

PLOVER_EXPORT void plover_load(plover_state_t *s) {
  hooks_calls[0]++;
#ifdef CRASH_LOAD
  raise(SIGSEGV);
#endif
#ifdef FAIL_LOAD
  plover_fail(s, "the weights are corrupt");
  return;
#endif
  for (size_t i = 0; i < s->constant.len; i++) s->constant.dat[i] ^= 0xff;
  s->program = &program_tag;
}

PLOVER_EXPORT void plover_instance_init(plover_state_t *s) {
  hooks_calls[1]++;
#ifdef SAY_INIT
  fprintf(stderr, "plover_instance_init begins\n");
#endif
#ifdef HANG_INIT
  for (;;) pause();
#endif
#ifdef EMPTY_INIT_MESSAGE
  send(3, "", 0, MSG_DONTWAIT);
#endif
#ifdef SLOW_INIT_MS
  usleep(SLOW_INIT_MS * 1000);
#endif
#ifdef FAIL_INIT
  plover_fail(s, "no handle for this instance");
  return;
#endif
  s->instance = calloc(1, sizeof(instance_t));
  if (s->instance == NULL) plover_fail(s, "out of memory");
}

PLOVER_EXPORT void plover_instance_fini(plover_state_t *s) {
  hooks_calls[2]++;
#ifdef HANG_FINI
  for (;;) pause();
#endif
#ifdef SLOW_FINI_MS
  usleep(SLOW_FINI_MS * 1000);
#endif
  free(s->instance);
}

PLOVER_EXPORT void plover_unload(plover_state_t *s) {
#ifdef SLOW_UNLOAD_MS
  usleep(SLOW_UNLOAD_MS * 1000);
#endif
  if (s->program == &program_tag) hooks_calls[3]++;
}

// report: out = the decoded constants, this instance's request count (u64),
// 1 if s->program is what plover_load left; out.len lowered to just that.
PLOVER_ENTRY(report) {
  (void)grid; (void)block;
  instance_t *in = (instance_t *)s->instance;
  size_t n = s->constant.len;
  if (n + 9 > s->out.len) {
    plover_fail(s, "out too small");
    return;
  }
  in->requests++;
  memcpy(s->out.dat, s->constant.dat, n);
  memcpy(s->out.dat + n, &in->requests, 8);
  s->out.dat[n + 8] = s->program == &program_tag;
  s->out.len = n + 9;
}
