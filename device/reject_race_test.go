package device_test

import (
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/plover-run/plover/device"
	"github.com/plover-run/plover/internal/testkit"
)

// refuseAs spins about 100 us (past the Go runtime's 20 us, after which a
// goroutine in a cgo call loses its processor) and refuses its input with
// the input as the message: plover_reject copies it into its thread's
// storage.
const refuseAs = `#include <string.h>
#include <time.h>
#include "plover_kernel.h"
PLOVER_BUNDLE(PLOVER_TARGET);
PLOVER_ENTRY(refuse_as) {
  (void)grid; (void)block;
  struct timespec t0, t;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  do clock_gettime(CLOCK_MONOTONIC, &t);
  while ((t.tv_sec - t0.tv_sec) * 1000000000L + (t.tv_nsec - t0.tv_nsec) < 100000);
  char msg[64];
  size_t n = s->input.len < sizeof msg - 1 ? s->input.len : sizeof msg - 1;
  memcpy(msg, s->input.dat, n);
  msg[n] = 0;
  plover_reject(s, msg);
}
`

// Each run's refusal names its own input, however many goroutines run the
// bundle at once: the message is in the calling thread's storage, and a
// goroutine that came back from its call on another thread read whatever
// the next call on the first had left there.
func TestRefusalsAreTheirOwnRuns(t *testing.T) {
	prog := loadSource(t, "refuse", refuseAs, "refuse_as", buildHost)
	const goroutines, runs = 8, 150
	var wg sync.WaitGroup
	errs := make(chan error, goroutines)
	for g := range goroutines {
		inst := testkit.HostInstance(t, prog, 64, 8)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := range runs {
				want := fmt.Sprintf("goroutine %d run %d", g, k)
				err := inst.Run(&device.Run{Input: []byte(want), Output: make([]byte, 8), Chain: []device.Step{{Entry: 0, Grid: 1, Block: 1}}})
				var ke *device.KernelError
				if !errors.As(err, &ke) || !ke.Rejected || ke.Msg != want {
					errs <- fmt.Errorf("run %q: %v, want its own refusal", want, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}
