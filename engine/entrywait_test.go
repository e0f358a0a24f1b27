package engine_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/call"
	"github.com/plover-run/plover/device"
	"github.com/plover-run/plover/engine"
	"github.com/plover-run/plover/errdefs"
	"github.com/plover-run/plover/internal/testkit"
)

// busyDevice is the host device whose programs' entry lookups wait, as a
// tenant's worker's do behind a sibling's load, for a control channel
// that stays busy: until the lookup's context ends, then ErrNotStarted.
// It records the lookups' deadlines and counts loads.
type busyDevice struct {
	device.Device
	mu        sync.Mutex
	deadlines []time.Time
	loads     int
}

type busyProgram struct {
	device.Program
	d *busyDevice
}

func (d *busyDevice) Load(ctx context.Context, spec device.ProgramSpec) (device.Program, error) {
	p, err := d.Device.Load(ctx, spec)
	if err != nil {
		return nil, err
	}
	d.mu.Lock()
	d.loads++
	d.mu.Unlock()
	return &busyProgram{p, d}, nil
}

func (p *busyProgram) EntryContext(ctx context.Context, kernel string) (int32, error) {
	dl, _ := ctx.Deadline()
	p.d.mu.Lock()
	p.d.deadlines = append(p.d.deadlines, dl)
	p.d.mu.Unlock()
	<-ctx.Done()
	return 0, fmt.Errorf("%w, waiting for the worker's control channel (resolving an entry point)", device.ErrNotStarted)
}

// A chain override's lookup waits for its worker's control channel until
// the request's deadline (the lookup's context carries it), and a wait that
// ends there fails the request as a timeout saying the lookup never
// started, not as a chain that ran past its deadline; the program is
// intact (no load again).
func TestEntryWaitEndsAtTheRequestsDeadline(t *testing.T) {
	d := &busyDevice{Device: device.NewHost(0)}
	e := testkit.Engine(t, engine.Config{Devices: []device.Device{d}})
	testkit.Deploy(t, e, testkit.BundleDir(t, testkit.Manifest("echo"), nil))
	if err := e.Invoke(context.Background(), "echo", &call.Request{Input: []byte("load")}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(300 * time.Millisecond)
	req := &call.Request{Input: []byte("x"), Deadline: deadline,
		Override: &call.Override{Chain: []abi.Launch{{Kernel: "echo", Grid: 1, Block: 1}}, OutBytes: -1, TmpBytes: -1}}
	err := e.Invoke(context.Background(), "echo", req)
	if late := time.Since(deadline); late > time.Second {
		t.Errorf("the request returned %v past its deadline", late)
	}
	if errdefs.KindOf(err) != errdefs.KindTimeout || !strings.Contains(err.Error(), "chain[0].kernel could be looked up") ||
		!strings.Contains(err.Error(), "waiting for the worker's control channel") || strings.Contains(err.Error(), "while its chain was running") {
		t.Errorf("the request: %v; want a timeout saying the lookup waited for the control channel", err)
	}
	if err := e.Invoke(context.Background(), "echo", &call.Request{Input: []byte("after")}); err != nil {
		t.Fatal(err)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(d.deadlines) != 1 || !d.deadlines[0].Equal(deadline) {
		t.Errorf("the lookups' deadlines: %v, want [%v] (the request's)", d.deadlines, deadline)
	}
	if d.loads != 1 {
		t.Errorf("%d loads, want 1: the program is intact", d.loads)
	}
}

// A lookup whose wait ends because the client went (its context
// cancelled, as a gRPC client's cancel is) says so, a 499, not that the
// request's deadline passed.
func TestEntryWaitEndedByTheClientIsGone(t *testing.T) {
	d := &busyDevice{Device: device.NewHost(0)}
	e := testkit.Engine(t, engine.Config{Devices: []device.Device{d}})
	testkit.Deploy(t, e, testkit.BundleDir(t, testkit.Manifest("echo"), nil))
	if err := e.Invoke(context.Background(), "echo", &call.Request{Input: []byte("load")}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	req := &call.Request{Input: []byte("x"), Deadline: time.Now().Add(time.Minute),
		Override: &call.Override{Chain: []abi.Launch{{Kernel: "echo", Grid: 1, Block: 1}}, OutBytes: -1, TmpBytes: -1}}
	done := make(chan error, 1)
	go func() { done <- e.Invoke(ctx, "echo", req) }()
	for { // the lookup is waiting: then the client goes
		d.mu.Lock()
		n := len(d.deadlines)
		d.mu.Unlock()
		if n > 0 {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	cancel()
	err := <-done
	if errdefs.KindOf(err) != errdefs.KindGone || !strings.Contains(err.Error(), "the client went away before chain[0].kernel") {
		t.Errorf("the request: %v (kind %v); want the client gone, not a deadline", err, errdefs.KindOf(err))
	}
}

// slowLookupDevice is the host device whose programs' entry lookups take
// a while before they answer, as a tenant's worker's do behind a
// sibling's load.
type slowLookupDevice struct {
	device.Device
	wait time.Duration
}

type slowLookupProgram struct {
	device.Program
	wait time.Duration
}

func (d *slowLookupDevice) Load(ctx context.Context, spec device.ProgramSpec) (device.Program, error) {
	p, err := d.Device.Load(ctx, spec)
	if err != nil {
		return nil, err
	}
	return &slowLookupProgram{p, d.wait}, nil
}

func (p *slowLookupProgram) EntryContext(ctx context.Context, kernel string) (int32, error) {
	select {
	case <-time.After(p.wait): // the fake's own pace, not the test's wait
	case <-ctx.Done():
	}
	return p.Program.Entry(kernel)
}

// A chain override's run is admitted once its entries are looked up: a
// lookup that waited is no device time. Admitted with the clock read
// before the lookup, the run's billing floor (its wall time over the
// device's runs) charged it a 1 s lookup's share: 250 ms of device time
// for a run of microseconds, on a device of 4 runs.
func TestAChainLookupsWaitIsNotBilled(t *testing.T) {
	const wait = time.Second
	d := &slowLookupDevice{Device: device.NewHost(0), wait: wait}
	e := testkit.Engine(t, engine.Config{Devices: []device.Device{d}, Sched: engine.SchedConfig{MaxRuns: 4}})
	testkit.Deploy(t, e, testkit.BundleDir(t, testkit.Manifest("echo"), nil))
	req := &call.Request{Input: []byte("x"), Override: &call.Override{Chain: []abi.Launch{{Kernel: "echo", Grid: 1, Block: 1}}, OutBytes: -1, TmpBytes: -1}}
	t0 := time.Now()
	if err := e.Invoke(context.Background(), "echo", req); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(t0); took < wait {
		t.Fatalf("the request took %v, less than its lookup's %v: the lookup did not wait", took, wait)
	}
	fi, err := e.Control().Function(context.Background(), "echo")
	if err != nil {
		t.Fatal(err)
	}
	if billed := time.Duration(fi.DeviceSeconds * float64(time.Second)); billed > wait/20 {
		t.Errorf("device time billed %v for a run of %v after a lookup of %v: the lookup's wait was billed", billed, req.Timing.Kernels, wait)
	}
}
