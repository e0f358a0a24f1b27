package worker

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/plover-run/plover/internal/testkit"
)

// entryForger is a bundle that answers its worker's entry lookups itself:
// its constructor puts a socket of its own where the worker reads its
// control channel (fd 3) and relays every other message. It vouches for
// any name 300 times, then answers with 2 bytes, too short for an entry
// reply.
const entryForger = `
#include <pthread.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include "plover_kernel.h"
PLOVER_BUNDLE(PLOVER_TARGET);
static int real, fake, answered;
static void *up(void *x) {
  (void)x;
  static char b[1 << 20];
  ssize_t n;
  while ((n = recv(fake, b, sizeof b, 0)) > 0) send(real, b, (size_t)n, 0);
  return 0;
}
static void *down(void *x) {
  (void)x;
  static char b[1 << 20];
  ssize_t n;
  while ((n = recv(real, b, sizeof b, 0)) > 0) {
    if (b[0] == 'E') {
      char rep[5] = {0, 0, 0, 0, 0};
      send(real, rep, ++answered > 300 ? 2 : 5, 0);
      continue;
    }
    send(fake, b, (size_t)n, 0);
  }
  return 0;
}
__attribute__((constructor)) static void forge(void) {
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_SEQPACKET, 0, sv) != 0) return;
  real = dup(3);
  dup2(sv[0], 3);
  fake = sv[1];
  pthread_t a, b;
  pthread_create(&a, 0, up, 0);
  pthread_create(&b, 0, down, 0);
}
PLOVER_ENTRY(noop) { (void)grid; (void)block; (void)s; }
`

// The entry points a program keeps resolved are bounded, and a reply
// that does not decode ends its worker: the names are clients' (a chain
// override's kernel), and a worker running bundle code may vouch for any,
// so that each request naming a new one grew the server's memory (a
// review: 20,000 names, 2.7 MiB, bounded by nothing); a malformed reply
// was an invalid-input error naming no function, the worker serving on.
func TestAWorkerVouchingForAnyEntryGrowsNothing(t *testing.T) {
	d := newDevice(t, 0)
	src := filepath.Join(t.TempDir(), "forger.cu")
	if err := os.WriteFile(src, []byte(entryForger), 0o644); err != nil {
		t.Fatal(err)
	}
	p := loadSource(t, d, src, testkit.OutputManifest("forger", "noop", 1, 1)).(*program)
	for i := range 300 {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_, err := p.EntryContext(ctx, fmt.Sprintf("k%0120d", i))
		cancel()
		if err != nil {
			t.Fatalf("lookup %d: %v", i, err)
		}
	}
	p.mu.Lock()
	kept := len(p.entries)
	p.mu.Unlock()
	if kept > maxEntries {
		t.Errorf("the program keeps %d entry names a worker vouched for, want at most %d", kept, maxEntries)
	}
	_, err := p.EntryContext(context.Background(), "malformed")
	if lost, _ := collateral(err); !lost {
		t.Errorf("a malformed entry reply: %v, want the worker's loss", err)
	}
	select {
	case <-p.p.done:
	case <-time.After(10 * time.Second):
		t.Fatal("the worker that sent a malformed reply is alive 10 s on")
	}
}
