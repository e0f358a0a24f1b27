package device

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// A run or hook that meets a sticky error before its own code ran (a
// run's first driver calls, before its chain launched; an instance's
// buffers; a program hook's stream) launched nothing that could have made
// it: it is refused as a call on a device already poisoned (ErrUnhealthy,
// no KernelError, not OwnFault), not failed as a fault of its own. A
// tenant's worker names the program at fault by OwnFault: before, a
// bystander whose run began as another faulted could be named in its
// place (worker's TestTenantCUDAFaultNamesItsProgram, about one run in
// thirty), and one whose instance or load began then always was.
func TestFakeFaultMetBeforeItsOwnCodeIsNotItsOwn(t *testing.T) {
	chainOf := func(t *testing.T, e *bundleEnv) []Step {
		return []Step{e.step(t, "pl_load", 1, 32), e.step(t, "pl_store", 1, 32)}
	}
	for _, tc := range []struct {
		name string
		// prepare readies the bystander on a healthy device; the call
		// it returns is made once the culprit faulted.
		prepare func(t *testing.T, g *GPU, e *bundleEnv) func() error
	}{
		{"run", func(t *testing.T, g *GPU, e *bundleEnv) func() error {
			in := newInst(t, g, e, InstanceConfig{MaxInput: 8, Tmp: 8, Out: 8})
			mustRun(t, in, &Run{Output: make([]byte, 8), Chain: chainOf(t, e), TmpLen: 8})
			return func() error { return in.Run(&Run{Output: make([]byte, 8), Chain: chainOf(t, e), TmpLen: 8}) }
		}},
		{"creating an instance", func(t *testing.T, g *GPU, e *bundleEnv) func() error {
			return func() error {
				in, err := g.NewInstance(InstanceConfig{MaxInput: 8, Tmp: 8, Out: 8, Entries: e.ents})
				if err == nil {
					in.Close()
				}
				return err
			}
		}},
		{"plover_load", func(t *testing.T, g *GPU, e *bundleEnv) func() error {
			return func() error { _, err := g.programHook(e.ents, hookLoad, nil, nil); return err }
		}},
		{"closing an instance", func(t *testing.T, g *GPU, e *bundleEnv) func() error {
			in, err := g.NewInstance(InstanceConfig{MaxInput: 8, Tmp: 8, Out: 8, Entries: e.ents})
			if err != nil {
				t.Fatal(err)
			}
			// CloseFault says only a fault of the fini's own; the
			// device's, then, is what the close met.
			return func() error {
				if err := CloseFault(in); err != nil {
					return err
				}
				return g.Health()
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := fakeEnv(t)
			e.ordinal = 1 // device 0 stays healthy for the other tests
			g := e.fresh(t, 0, nil)
			hold := filepath.Join(t.TempDir(), "hold")
			t.Setenv("FAKEBUNDLE_HOLD", hold)
			culprit := newInst(t, g, e, InstanceConfig{MaxInput: 8, Tmp: 8, Out: 8})
			bystander := tc.prepare(t, g, e)

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
			err := bystander()
			var ke *KernelError
			if !errors.Is(err, ErrUnhealthy) || errors.As(err, &ke) || OwnFault(err) {
				t.Errorf("the bystander's %s: %v, want ErrUnhealthy, no KernelError, not its own fault (it ran nothing)", tc.name, err)
			}
			if h := g.Health(); !errors.Is(h, ErrUnhealthy) {
				t.Errorf("health once the bystander met the fault: %v, want unhealthy", h)
			}
			os.Remove(hold)
			err = <-done
			if !errors.As(err, &ke) || !errors.Is(err, ErrUnhealthy) || !OwnFault(err) {
				t.Errorf("the faulting run: %v, want its KernelError, ErrUnhealthy, its own fault", err)
			}
		})
	}
}

// A hook that faults the device once it ran met the fault as its own, as a
// chain that launched does (OwnFault, with its KernelError and
// ErrUnhealthy), where its failure is returned and where it is otherwise
// ignored (plover_instance_fini: CloseFault).
func TestFakeFaultInAHookIsItsOwn(t *testing.T) {
	for _, tc := range []struct {
		hook string
		call func(t *testing.T, g *GPU, e *bundleEnv) error
	}{
		{"plover_load", func(t *testing.T, g *GPU, e *bundleEnv) error {
			c, err := g.LoadConstants(bytes.NewReader(make([]byte, 15)), 15) // 15: the fake bundle's plover_load faults
			if err != nil {
				t.Fatal(err)
			}
			defer c.Free()
			_, err = g.programHook(e.ents, hookLoad, c, nil)
			return err
		}},
		{"plover_instance_init", func(t *testing.T, g *GPU, e *bundleEnv) error {
			in, err := g.NewInstance(InstanceConfig{MaxInput: 8, Tmp: 13, Out: 8, Entries: e.ents}) // 13: its init faults
			if err == nil {
				in.Close()
			}
			return err
		}},
		{"plover_instance_fini", func(t *testing.T, g *GPU, e *bundleEnv) error {
			in, err := g.NewInstance(InstanceConfig{MaxInput: 8, Tmp: 14, Out: 8, Entries: e.ents}) // 14: its fini faults
			if err != nil {
				t.Fatal(err)
			}
			return CloseFault(in)
		}},
	} {
		t.Run(tc.hook, func(t *testing.T) {
			e := fakeEnv(t)
			e.ordinal = 1
			g := e.fresh(t, 0, nil)
			err := tc.call(t, g, e)
			var ke *KernelError
			if !OwnFault(err) || !errors.As(err, &ke) || !errors.Is(err, ErrUnhealthy) {
				t.Errorf("%s faulting the device: %v, want its own fault (KernelError, ErrUnhealthy)", tc.hook, err)
			}
		})
	}
}
