package device_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/plover-run/plover/abi"
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
	dir := t.TempDir()
	src := filepath.Join(dir, "refuse.cu")
	if err := os.WriteFile(src, []byte(refuseAs), 0o644); err != nil {
		t.Fatal(err)
	}
	testkit.BuildLib(t, src, dir, "refuse.so")
	m := testkit.Manifest("refuse")
	m.Library, m.Chain = "refuse.so", []abi.Launch{{Kernel: "refuse_as", Grid: 1, Block: 1}}
	prog, err := device.NewHost(0).Load(context.Background(), device.ProgramSpec{Dir: dir, Manifest: m})
	if err != nil {
		t.Fatal(err)
	}
	defer prog.Close()
	const goroutines, runs = 8, 150
	var wg sync.WaitGroup
	errs := make(chan error, goroutines)
	for g := range goroutines {
		inst, err := prog.NewInstance(device.InstanceConfig{MaxInput: 64, Out: 8})
		if err != nil {
			t.Fatal(err)
		}
		defer inst.Close()
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
