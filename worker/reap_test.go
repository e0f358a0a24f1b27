package worker

import (
	"errors"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/plover-run/plover/device"
	"github.com/plover-run/plover/internal/testkit"
)

// A run that finds its worker gone is told so within end's bounds where
// the worker's reap does not end (in production a process of it stuck in
// the kernel; here a stage put the test holds, which the reap waits for).
// It waited with the reap for good before, holding its instance. In a
// tenant's worker the loss is no sibling's (collateral): with no blame
// found it counts against every program in it. A later loss of the same
// worker is told at once, not after the same wait again. The loss told
// once the reap is done is the reap's own.
func TestLossToldWhileTheReapHangs(t *testing.T) {
	defer func(r, e time.Duration) { reapWait, endWait = r, e }(reapWait, endWait)
	for _, tenant := range []bool{false, true} {
		t.Run(map[bool]string{false: "function scope", true: "tenant scope"}[tenant], func(t *testing.T) {
			reapWait, endWait = 100*time.Millisecond, 100*time.Millisecond
			m := testkit.Manifest("echo")
			var p device.Program
			if tenant {
				p = loadFor(t, tenantDevice(t), "t", "", m, nil)
			} else {
				p = load(t, newDevice(t, 0), m)
			}
			in, in2 := newInst(t, p, m), newInst(t, p, m)
			w := p.(*program).p
			w.mu.Lock() // as inStage adds one
			w.stagers.Add(1)
			w.mu.Unlock()
			var once sync.Once
			release := func() { once.Do(w.stagers.Done) }
			defer release()
			if err := syscall.Kill(w.pid, syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			run := func(in device.Instance) *ProcessExit {
				t.Helper()
				ran := make(chan error, 1)
				go func() {
					ran <- in.Run(&device.Run{Input: []byte("x"), Output: make([]byte, 8), Chain: []device.Step{{Entry: 0, Grid: 1, Block: 1}}})
				}()
				select {
				case err := <-ran:
					var pe *ProcessExit
					if !errors.As(err, &pe) || !strings.Contains(pe.Reason, "is not reaped") || pe.Killed || pe.Shared {
						t.Fatalf("the run: %v (%+v); want its worker's loss, not reaped, neither stopped by the server nor a sibling's", err, pe)
					}
					return pe
				case <-time.After(30 * time.Second):
					t.Fatal("the run waited on its worker's reap for 30 s")
				}
				return nil
			}
			run(in)
			endWait = time.Minute // a second wait would pass the run's 30 s
			run(in2)
			release()
			select {
			case <-w.done:
			case <-time.After(10 * time.Second):
				t.Fatal("the worker not reaped 10 s after its stage put returned")
			}
			if pe := w.exit("idle"); !strings.Contains(pe.Reason, "SIGKILL") {
				t.Errorf("the loss after the reap: %q, want the reap's (killed by SIGKILL)", pe.Reason)
			}
		})
	}
}
