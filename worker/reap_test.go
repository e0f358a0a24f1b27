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
// It waited with the reap for good before, holding its instance; the loss
// told once the reap is done is the reap's own.
func TestLossToldWhileTheReapHangs(t *testing.T) {
	defer func(w time.Duration) { reapWait = w }(reapWait)
	reapWait = 100 * time.Millisecond
	d := newDevice(t, 0)
	m := testkit.Manifest("echo")
	p := load(t, d, m)
	in := newInst(t, p, m)
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
	ran := make(chan error, 1)
	go func() {
		ran <- in.Run(&device.Run{Input: []byte("x"), Output: make([]byte, 8), Chain: []device.Step{{Entry: 0, Grid: 1, Block: 1}}})
	}()
	select {
	case err := <-ran:
		var pe *ProcessExit
		if !errors.As(err, &pe) || !strings.Contains(pe.Reason, "is not reaped") || pe.Killed {
			t.Fatalf("the run: %v; want its worker's loss, not reaped, not stopped by the server", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the run waited on its worker's reap for 30 s")
	}
	release()
	select {
	case <-w.done:
	case <-time.After(10 * time.Second):
		t.Fatal("the worker not reaped 10 s after its stage put returned")
	}
	if pe := w.exit("idle"); !strings.Contains(pe.Reason, "SIGKILL") {
		t.Errorf("the loss after the reap: %q, want the reap's (killed by SIGKILL)", pe.Reason)
	}
}
