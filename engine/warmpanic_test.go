package engine_test

import (
	"bytes"
	"context"
	"log/slog"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/plover-run/plover/api"
	"github.com/plover-run/plover/bundle"
	"github.com/plover-run/plover/call"
	"github.com/plover-run/plover/device"
	"github.com/plover-run/plover/engine"
	"github.com/plover-run/plover/internal/testkit"
	"github.com/plover-run/plover/objectstore"
)

// A deploy whose pre-warm panics in the device's Go code (Health, as a
// transport recovers it) gives back the slot the warm took: with
// max_instances 1 the next request runs. Before, the slot stayed held with
// no instance: every request waited out its deadline, and the reaper,
// reading an instance being made, never topped the function up.
func TestPrewarmPanicGivesBackItsSlot(t *testing.T) {
	dev := &testkit.PanicDevice{Device: device.NewHost(0)}
	e := testkit.Engine(t, engine.Config{Devices: []device.Device{dev}, Timeout: 2 * time.Second})
	m := testkit.Manifest("a")
	m.MinInstances, m.MaxInstances = 1, 1
	raw, _, _, err := bundle.PackBytes(testkit.BundleDir(t, m, nil))
	if err != nil {
		t.Fatal(err)
	}
	dev.HealthBug.Store(true)
	func() {
		defer func() {
			if recover() == nil {
				t.Fatal("the deploy's pre-warm did not panic")
			}
		}()
		e.Control().Deploy(context.Background(), "a", bytes.NewReader(raw), false)
	}()
	if err := e.Invoke(context.Background(), "a", &call.Request{Input: []byte{1}}); err != nil {
		t.Fatalf("a request after the panicked pre-warm: %v", err)
	}
	if !e.BreakIdle("a") {
		t.Fatal("the request left no idle instance")
	}
	e.Reap(time.Now().Add(time.Minute))
	testkit.WaitFor(t, e, "a", "its top-up to min_instances 1", idle(1))
}

// idle is a testkit.WaitFor condition: n instances idle.
func idle(n int) func(api.FunctionInfo) bool {
	return func(fi api.FunctionInfo) bool { return fi.Idle == n }
}

// A top-up whose instance's making panics in the device's Go code (Health,
// on the reaper's top-up goroutine, which nothing above recovers) is
// logged with its function's name and counted as a failed top-up; the
// process goes on, and the next top-up makes the instance. Before, the
// panic ended the process.
func TestTopUpPanicIsLoggedNotFatal(t *testing.T) {
	dev := &testkit.PanicDevice{Device: device.NewHost(0)}
	logs := &testkit.LogBuffer{}
	e := testkit.Engine(t, engine.Config{Devices: []device.Device{dev}, Log: slog.New(slog.NewTextHandler(logs, nil))})
	m := testkit.Manifest("a")
	m.MinInstances = 1
	testkit.Deploy(t, e, testkit.BundleDir(t, m, nil))
	if !e.BreakIdle("a") {
		t.Fatal("a has no idle instance after its pre-warm")
	}
	dev.HealthBug.Store(true)
	t0 := time.Now()
	e.Reap(t0)
	waitUntil(t, "the panicked top-up counted as failed", func() bool { return !e.ToppingUp("a") && e.TopUpFails("a") == 1 })
	if !strings.Contains(logs.String(), `msg="topping up to min_instances panicked" function=a`) {
		t.Errorf("no log line names the function whose top-up panicked:\n%s", logs)
	}
	e.Reap(t0.Add(time.Minute)) // past the doubled wait
	testkit.WaitFor(t, e, "a", "its top-up after the panic", idle(1))
}

// closeBugDevice is a host device whose function bug's next instance or
// program Close (armed) panics once closed, as a device's Go code might;
// it counts the Closes.
type closeBugDevice struct {
	device.Device
	instBug, progBug        atomic.Bool
	instClosed, progsClosed atomic.Int32
}

type closeBugProgram struct {
	device.Program
	d   *closeBugDevice
	bug bool
}

type closeBugInstance struct {
	device.Instance
	p *closeBugProgram
}

func (d *closeBugDevice) Load(ctx context.Context, spec device.ProgramSpec) (device.Program, error) {
	p, err := d.Device.Load(ctx, spec)
	if err != nil {
		return nil, err
	}
	return &closeBugProgram{Program: p, d: d, bug: spec.Manifest.Name == "bug"}, nil
}

func (p *closeBugProgram) NewInstance(cfg device.InstanceConfig) (device.Instance, error) {
	in, err := p.Program.NewInstance(cfg)
	if err != nil {
		return nil, err
	}
	return &closeBugInstance{Instance: in, p: p}, nil
}

func (p *closeBugProgram) Close() error {
	p.d.progsClosed.Add(1)
	err := p.Program.Close()
	if p.bug && p.d.progBug.CompareAndSwap(true, false) {
		panic("a device bug closing a program")
	}
	return err
}

func (i *closeBugInstance) Close() {
	i.p.d.instClosed.Add(1)
	i.Instance.Close()
	if i.p.bug && i.p.d.instBug.CompareAndSwap(true, false) {
		panic("a device bug closing an instance")
	}
}

// A reap whose Close of an idle instance, or of a program it unloads,
// panics in the device's Go code is logged with the function's name, and
// leaves nothing unclosed: the function's other idle instance is closed,
// its bundle let go in the cache, the other function reaped. Before, the
// panic ended the process (the reaper's goroutine has nothing above it).
func TestReapSurvivesClosePanics(t *testing.T) {
	for _, tc := range []struct {
		name string
		arm  func(d *closeBugDevice)
	}{
		{"an instance's Close", func(d *closeBugDevice) { d.instBug.Store(true) }},
		{"a program's Close", func(d *closeBugDevice) { d.progBug.Store(true) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dev := &closeBugDevice{Device: device.NewHost(0)}
			cache, err := bundle.NewCache(t.TempDir(), 0, 0)
			if err != nil {
				t.Fatal(err)
			}
			logs := &testkit.LogBuffer{}
			e := testkit.Engine(t, engine.Config{Devices: []device.Device{dev}, Cache: cache, Log: slog.New(slog.NewTextHandler(logs, nil))})
			bug, other := testkit.Slow("bug", 100), testkit.Manifest("other")
			bug.IdleTTL, other.IdleTTL = "1ms", "1ms"
			testkit.Deploy(t, e, testkit.BundleDir(t, bug, nil))
			testkit.Deploy(t, e, testkit.BundleDir(t, other, nil))
			twoInstances(t, e, "bug")
			invoke(t, e, "other", []byte{1})
			tc.arm(dev)
			for range 2 { // an instance's panic cuts its version's pass: the next unloads it
				e.Reap(time.Now().Add(time.Hour))
			}
			if !strings.Contains(logs.String(), `msg="reaping panicked" function=bug`) {
				t.Errorf("no log line names the function whose reap panicked:\n%s", logs)
			}
			for _, name := range []string{"bug", "other"} {
				if fi := info(t, e, name); fi.Loaded || fi.Idle != 0 {
					t.Errorf("%s after the reaps: loaded %v, %d idle", name, fi.Loaded, fi.Idle)
				}
			}
			if n, p, u := dev.instClosed.Load(), dev.progsClosed.Load(), cache.Stats().InUse; n != 3 || p != 2 || u != 0 {
				t.Errorf("%d instances and %d programs closed, %d bundles in use; want 3, 2 and 0", n, p, u)
			}
		})
	}
}

// twoInstances leaves name, a slow function, with two idle instances:
// a second request sent while the first runs makes the second.
func twoInstances(t *testing.T, e *engine.Engine, name string) {
	t.Helper()
	first := make(chan error, 1)
	go func() { first <- e.Invoke(context.Background(), name, &call.Request{Input: []byte{1}}) }()
	testkit.WaitFor(t, e, name, "its first run", testkit.Busy(1, 0))
	invoke(t, e, name, []byte{1})
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	if fi := info(t, e, name); fi.Idle != 2 {
		t.Fatalf("%s has %d idle instances, want 2", name, fi.Idle)
	}
}

// waitUntil polls cond (observed state) for up to 10 s.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("waited 10 s for %s", what)
		}
	}
}

// A server start's pre-warm (Prewarm, on a goroutine of the server's own)
// whose warm of one function panics in the device's Go code says so in
// its error and its log, with the function's name, and warms the other
// functions. Before, the panic ended the process.
func TestPrewarmAtStartSurvivesAPanic(t *testing.T) {
	store, err := objectstore.NewFS(filepath.Join(t.TempDir(), "store"))
	if err != nil {
		t.Fatal(err)
	}
	a := testkit.Engine(t, engine.Config{Store: store})
	for _, name := range []string{"one", "two"} {
		m := testkit.Manifest(name)
		m.MinInstances = 1
		testkit.Deploy(t, a, testkit.BundleDir(t, m, nil))
	}
	dev := &testkit.PanicDevice{Device: device.NewHost(0)}
	logs := &testkit.LogBuffer{}
	b := testkit.Engine(t, engine.Config{Store: store, Devices: []device.Device{dev}, Log: slog.New(slog.NewTextHandler(logs, nil))})
	dev.HealthBug.Store(true) // the first warm's
	err = noPanic(t, "Prewarm", func() error { return b.Prewarm(context.Background()) })
	if err == nil || !strings.Contains(err.Error(), "panicked") {
		t.Fatalf("Prewarm: %v, want the panic said", err)
	}
	if !strings.Contains(logs.String(), `msg="pre-warming at start panicked" function=`) {
		t.Errorf("no log line names the function whose pre-warm panicked:\n%s", logs)
	}
	if n := info(t, b, "one").Idle + info(t, b, "two").Idle; n != 1 {
		t.Errorf("%d instances warmed, want the function that did not panic warmed", n)
	}
}

// noPanic is f's error, the test failed where f panics (what: what f
// runs, for the failure).
func noPanic(t *testing.T, what string, f func() error) error {
	t.Helper()
	defer func() {
		if p := recover(); p != nil {
			t.Fatalf("%s panicked: %v", what, p)
		}
	}()
	return f()
}
