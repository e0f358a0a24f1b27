package worker

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/plover-run/plover/device"
	"github.com/plover-run/plover/funclog"
	"github.com/plover-run/plover/internal/testkit"
)

// slowSpec builds testdata/slowload.cc with args as function name of
// tenant t.
func slowSpec(t *testing.T, name string, args ...string) device.ProgramSpec {
	t.Helper()
	dir := t.TempDir()
	m := testkit.Manifest(name)
	m.Library = "slowload.so"
	testkit.BuildLib(t, filepath.Join("testdata", "slowload.cc"), dir, m.Library, args...)
	testkit.WriteManifest(t, dir, m)
	return device.ProgramSpec{Dir: dir, Manifest: m, Tenant: "t"}
}

// loadLate loads spec for a request that gives up after 100 ms, which its
// load outlasts, and returns the late load it leaves listed.
func loadLate(t *testing.T, d *Device, spec device.ProgramSpec) *lateLoad {
	t.Helper()
	// The request's 100 ms go to the load alone: the tenant's worker is
	// started first with no deadline and held (a ref, as a load under way
	// holds one) until the late load is listed, which holds its own.
	// Started by the request, a worker took longer than 100 ms where the
	// machine was loaded or the test built with -race, and one whose start
	// runs out is killed: no late load, three times over.
	w, err := d.placeTenant(context.Background(), spec)
	if err != nil {
		t.Fatalf("start %q's worker: %v", spec.Tenant, err)
	}
	defer func() {
		if d.releaseTenant(w) { // the hold was the worker's last ref (no late load came)
			w.kill("a test's hold on it ended")
		}
	}()
	for try := 1; ; try++ {
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		p, err := d.Load(ctx, spec)
		cancel()
		if !errors.Is(err, device.ErrDeadline) {
			if p != nil {
				p.Close()
			}
			t.Fatalf("load of %s: %v, want ErrDeadline (its load outlasts the request)", spec.Manifest.Name, err)
		}
		d.mu.Lock()
		l := d.late[lateKey(spec)]
		d.mu.Unlock()
		if l != nil {
			return l
		}
		if try == 3 {
			t.Fatalf("the load of %s given up at its deadline left no late load (%d tries; the last: %v)", spec.Manifest.Name, try, err)
		}
	}
}

// awaitClosed waits up to 10 s for c, what naming it.
func awaitClosed(t *testing.T, c <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-c:
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: not within 10 s", what)
	}
}

// A late load (its request gave up at its deadline, the load went on)
// that fails is told to the function's next load, once, as the load's own
// failure would have been: a crash as the worker's loss (not collateral),
// a failed plover_load as its KernelError, a worker lost after the load
// (every program blamed) as that loss. The engine counts each of them
// (a crash, a hook failure) and backs the function off; told nothing,
// each request saw only its deadline, and a function whose load crashed
// its tenant's worker did so at every request, its siblings losing the
// worker each time. The load after the one told starts afresh.
func TestLateLoadFailureIsReported(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		// after, if set, runs once the late load has ended.
		after       func(l *lateLoad)
		siblingLost bool
		want        func(error) bool
	}{
		{name: "constructor crash", args: []string{"-DCRASH"}, siblingLost: true, want: func(err error) bool {
			var pe *ProcessExit
			return errors.As(err, &pe) && !pe.Collateral() && strings.Contains(pe.Reason, "SIGSEGV")
		}},
		{name: "plover_load fails", args: []string{"-DFAIL_LOAD"}, want: func(err error) bool {
			var ke *device.KernelError
			return errors.As(err, &ke) && strings.Contains(ke.Msg, "the weights are corrupt")
		}},
		{name: "worker lost after the load", after: func(l *lateLoad) { l.g.p.kill("a test: as a memory limit would") }, siblingLost: true, want: func(err error) bool {
			l, ok := device.AsLoss(err)
			return ok && !l.Collateral() && l.ByServer()
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := tenantDevice(t)
			ms := testkit.Manifest("sibling")
			sib := loadFor(t, d, "t", "", ms, nil).(*program)
			spec := slowSpec(t, "slow", append([]string{"-DSLOW_MS=300"}, tc.args...)...)
			l := loadLate(t, d, spec)
			awaitClosed(t, l.done, "the late load's end")
			if tc.after != nil {
				tc.after(l)
			}
			if tc.siblingLost {
				awaitClosed(t, sib.Exited(), "the tenant's worker's end")
			} else {
				echoes(t, sib, ms)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
			defer cancel()
			p, err := d.Load(ctx, spec)
			if p != nil {
				p.Close()
			}
			if !tc.want(err) || errors.Is(err, device.ErrDeadline) {
				t.Fatalf("the next load: %v; want the late load's failure", err)
			}
			if next := loadLate(t, d, spec); next == l {
				t.Fatal("the failure was told, and left to be told again")
			}
		})
	}
}

// A late load put back by a request that waited on it and gave up, while
// another load of the same key was listed meanwhile (two versions of one
// bundle, one request for each), displaces nothing: one of the two is
// dropped, unloaded as its load ends, the other unloaded once unclaimed.
// Put back over the other, the other's program was never unloaded, and
// with it its tenant's worker never ended.
func TestLateLoadDisplacedIsUnloaded(t *testing.T) {
	d := tenantDevice(t)
	d.lateKeep = 100 * time.Millisecond
	ms := testkit.Manifest("sibling")
	sib := loadFor(t, d, "t", "", ms, nil).(*program)
	spec := slowSpec(t, "slow", "-DSLOW_MS=1500")
	first := loadLate(t, d, spec)
	// A request that takes the first over and waits for it.
	ctx, cancel := context.WithCancel(context.Background())
	waited := make(chan error, 1)
	go func() {
		p, err := d.Load(ctx, spec)
		if p != nil {
			p.Close()
		}
		waited <- err
	}()
	waitFor(t, "the first late load taken over", func() bool {
		d.mu.Lock()
		defer d.mu.Unlock()
		return d.late[lateKey(spec)] == nil
	})
	// Another request finds none, loads afresh and gives up too.
	second := loadLate(t, d, spec)
	cancel()
	if err := <-waited; !errors.Is(err, device.ErrDeadline) {
		t.Fatalf("the request waiting on the first: %v, want ErrDeadline (the first load still going on)", err)
	}
	awaitClosed(t, first.done, "the first late load's end")
	awaitClosed(t, second.done, "the second late load's end")
	waitFor(t, "both late programs unloaded", func() bool {
		sib.p.mu.Lock()
		defer sib.p.mu.Unlock()
		return len(sib.p.tenant.progs) == 1
	})
	echoes(t, sib, ms)
	if got := d.used.Load(); got != 0 {
		t.Errorf("ledger %d bytes after the late programs' unload, want 0", got)
	}
}

// A late load is its function's, in the life of its name it was loaded
// in: a function deleted and deployed again with the same bundle, for the
// same tenant, within lateKeep does not take over the deleted one's late
// load, whose program prints to the deleted function's output (dropped:
// its life is over), nor is it told the deleted one's failure as its own
// (counted as its crash, backed off). It loads afresh.
func TestLateLoadOfADeletedFunctionIsNotTakenOver(t *testing.T) {
	t.Run("its program", func(t *testing.T) {
		d := tenantDevice(t)
		logs := funclog.New(nil)
		spec := slowSpec(t, "slow", "-DSLOW_MS=300")
		spec.Output = logs.Sink("slow")
		l := loadLate(t, d, spec)
		awaitClosed(t, l.done, "the late load's end")
		logs.Forget("slow") // deleted, and deployed again
		spec.Output = logs.Sink("slow")
		p, err := d.Load(context.Background(), spec)
		if err != nil {
			t.Fatalf("the new function's load: %v", err)
		}
		defer p.Close()
		if g := p.(*program); g == l.g || g.out != spec.Output {
			t.Fatalf("the new function's load took over the deleted one's late load (its output the deleted function's: %v)", g.out != spec.Output)
		}
	})
	t.Run("its failure", func(t *testing.T) {
		d := tenantDevice(t)
		logs := funclog.New(nil)
		spec := slowSpec(t, "slow", "-DSLOW_MS=300", "-DFAIL_LOAD")
		spec.Output = logs.Sink("slow")
		l := loadLate(t, d, spec)
		awaitClosed(t, l.done, "the late load's end")
		logs.Forget("slow")
		spec.Output = logs.Sink("slow")
		p, err := d.Load(context.Background(), spec)
		if p != nil {
			p.Close()
		}
		if err == nil || strings.Contains(err.Error(), "an earlier request's load") {
			t.Fatalf("the new function's load: %v; want its own load's failure, not the deleted function's", err)
		}
	})
}

// takeLate compares the late load's output with the spec's to tell two
// lives of a name apart. Before, it did so with !=, which panics on two
// outputs holding values that do not compare, under the device's lock,
// released by no defer: every later load, start and reaping on the device
// hung.
func TestTakeLateWithOutputsThatDoNotCompare(t *testing.T) {
	d := newDevice(t, 0)
	spec := device.ProgramSpec{Dir: t.TempDir(), Manifest: testkit.Manifest("f"), Tenant: "t", Output: anyOutput{[]int{1}}}
	l := &lateLoad{key: lateKey(spec), out: anyOutput{[]int{1}}, done: make(chan struct{})}
	d.mu.Lock()
	d.late[l.key] = l
	d.mu.Unlock()
	func() {
		defer func() {
			if v := recover(); v != nil {
				t.Errorf("takeLate panicked: %v", v)
			}
		}()
		if _, ok, err := d.takeLate(context.Background(), spec); ok || err != nil {
			t.Errorf("takeLate: ok %v, %v; want a fresh load", ok, err)
		}
	}()
	if !d.mu.TryLock() {
		d.mu.Unlock() // the one the panic left: the cleanup's Close takes it
		t.Fatal("the device's lock was left held")
	}
	dropped := l.dropped
	d.mu.Unlock()
	if !dropped {
		t.Error("a late load whose output is not the spec's was not dropped")
	}
}
