package device

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// A run that meets a sticky error before its chain launched (its first
// driver calls) launched nothing that could have made it: it is refused as
// a run on a device already poisoned (ErrUnhealthy, no KernelError), not
// failed as a kernel of its own. A tenant's worker names the program at
// fault by the KernelError: before, a bystander whose run began as another
// faulted could be named in its place (worker's
// TestTenantCUDAFaultNamesItsProgram, about one run in thirty).
func TestFakeFaultMetBeforeTheChainIsNotTheRunsOwn(t *testing.T) {
	e := fakeEnv(t)
	e.ordinal = 1 // device 0 stays healthy for the other tests
	g := e.fresh(t, 0, nil)
	hold := filepath.Join(t.TempDir(), "hold")
	t.Setenv("FAKEBUNDLE_HOLD", hold)
	chain := []Step{e.step(t, "pl_load", 1, 32), e.step(t, "pl_store", 1, 32)}
	culprit := newInst(t, g, e, InstanceConfig{MaxInput: 8, Tmp: 8, Out: 8})
	bystander := newInst(t, g, e, InstanceConfig{MaxInput: 8, Tmp: 8, Out: 8})
	mustRun(t, bystander, &Run{Output: make([]byte, 8), Chain: chain, TmpLen: 8})

	done := make(chan error, 1)
	go func() {
		// Faults the context, then holds the run in host code: the driver's
		// error is there, the device not yet marked (the run has not returned).
		done <- culprit.Run(&Run{Output: make([]byte, 8), TmpLen: 8,
			Chain: []Step{e.step(t, "pl_fault", 1, 1), e.step(t, "pl_hold", 60000, 1)}})
	}()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(time.Millisecond) {
		if _, err := os.Stat(hold); err == nil {
			break
		}
		if time.Now().After(deadline) {
			os.Remove(hold)
			t.Fatalf("the faulting run did not reach pl_hold in 30 s: %v", <-done)
		}
	}
	if h := g.Health(); h != nil {
		os.Remove(hold)
		t.Fatalf("the device is marked before the bystander met the fault (%v): the test proves nothing", h)
	}
	err := bystander.Run(&Run{Output: make([]byte, 8), Chain: chain, TmpLen: 8})
	var ke *KernelError
	if !errors.Is(err, ErrUnhealthy) || errors.As(err, &ke) {
		t.Errorf("the bystander's run: %v, want ErrUnhealthy and no KernelError (it launched nothing)", err)
	}
	if h := g.Health(); !errors.Is(h, ErrUnhealthy) {
		t.Errorf("health once the bystander met the fault: %v, want unhealthy", h)
	}
	os.Remove(hold)
	err = <-done
	if !errors.As(err, &ke) || !errors.Is(err, ErrUnhealthy) {
		t.Errorf("the faulting run: %v, want its KernelError and ErrUnhealthy", err)
	}
}
