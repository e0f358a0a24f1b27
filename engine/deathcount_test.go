package engine_test

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/plover-run/plover/call"
	"github.com/plover-run/plover/device"
	"github.com/plover-run/plover/engine"
	"github.com/plover-run/plover/errdefs"
	"github.com/plover-run/plover/internal/testkit"
)

// dyingDevice's programs live in a "process" that dies in every run: the
// run ends the process (its Exited closes, as a worker's does when its
// process is reaped) and, once the engine's exit watcher has begun to
// abandon the program (the armed channel), fails with the loss.
type dyingDevice struct {
	device.Device
	mu      sync.Mutex
	noticed chan struct{} // closed by the abandon hook: the watcher is abandoning
	runs    atomic.Int32
}

type dyingProgram struct {
	device.Program
	d      *dyingDevice
	exited chan struct{}
	once   sync.Once
}

type dyingInstance struct {
	device.Instance
	p *dyingProgram
}

type dyingLoss struct{}

func (dyingLoss) Error() string                 { return "worker process was killed by signal SIGSEGV (a stand-in)" }
func (dyingLoss) RanNowhere() bool              { return false }
func (dyingLoss) ByServer() bool                { return false }
func (dyingLoss) Collateral() bool              { return false }
func (dyingLoss) LogAttrs() []any               { return []any{"reason", "a stand-in's death"} }
func (p *dyingProgram) Exited() <-chan struct{} { return p.exited }
func (p *dyingProgram) Death() device.Loss      { return dyingLoss{} }

func (d *dyingDevice) Load(ctx context.Context, spec device.ProgramSpec) (device.Program, error) {
	p, err := d.Device.Load(ctx, spec)
	if err != nil {
		return nil, err
	}
	return &dyingProgram{Program: p, d: d, exited: make(chan struct{})}, nil
}

func (p *dyingProgram) NewInstance(cfg device.InstanceConfig) (device.Instance, error) {
	in, err := p.Program.NewInstance(cfg)
	if err != nil {
		return nil, err
	}
	return &dyingInstance{Instance: in, p: p}, nil
}

func (in *dyingInstance) Run(r *device.Run) error {
	in.p.d.runs.Add(1)
	in.p.d.mu.Lock()
	noticed := in.p.d.noticed
	in.p.d.mu.Unlock()
	in.p.once.Do(func() { close(in.p.exited) })
	select { // the watcher abandons the program first
	case <-noticed:
	case <-time.After(10 * time.Second): // the test fails on its own wait
	}
	return dyingLoss{}
}

// A worker's death is seen twice, by the request whose run met it and by
// the engine's exit watcher, and counted once, by whichever abandons the
// program first. The request answers its client only once the death is
// counted: while the watcher, first, is held as it abandons (under the
// pool's lock: the request waits for it), the request does not answer;
// when it answers, its crash is counted; and after crashLimit (5) crashes
// the sixth request is backed off, not run. Counted after the pool's lock,
// the request answered while the watcher had yet to count (this test: "the
// request answered before its worker's death was counted"), and in CI a
// client's sixth request crashed a sixth worker
// (TestIsolationProcess/backoff).
func TestARequestAnswersAfterItsWorkersDeathIsCounted(t *testing.T) {
	d := &dyingDevice{Device: device.NewHost(0)}
	e := testkit.Engine(t, engine.Config{Devices: []device.Device{d}})
	testkit.Deploy(t, e, testkit.BundleDir(t, testkit.Manifest("crashy"), nil))
	var release chan struct{}
	defer engine.SetAbandonHook(func() {
		d.mu.Lock()
		noticed, rel := d.noticed, release
		d.mu.Unlock()
		select {
		case <-noticed: // a run past the fifth crash (a regression): told below
		default:
			close(noticed)
		}
		<-rel
	})()
	for i := 1; i <= 5; i++ {
		d.mu.Lock()
		d.noticed, release = make(chan struct{}), make(chan struct{})
		noticed, rel := d.noticed, release
		d.mu.Unlock()
		answered := make(chan error, 1)
		go func() { answered <- e.Invoke(context.Background(), "crashy", &call.Request{Input: []byte("x")}) }()
		select {
		case <-noticed:
		case <-time.After(10 * time.Second):
			t.Fatalf("crash %d: the exit watcher never abandoned the dead program", i)
		}
		select {
		case err := <-answered:
			close(rel)
			t.Fatalf("crash %d: the request answered before its worker's death was counted (%v)", i, err)
		case <-time.After(100 * time.Millisecond):
		}
		close(rel)
		if err := <-answered; errdefs.KindOf(err) != errdefs.KindWorkerCrashed {
			t.Fatalf("crash %d: %v (kind %v), want the worker's crash", i, err, errdefs.KindOf(err))
		}
		// Counted as it answered (the fifth: backed off, the count reset).
		if n, want := e.CrashesCounted("crashy"), int32(i%5); n != want {
			t.Errorf("crash %d answered with %d crashes counted, want %d", i, n, want)
		}
	}
	runs := d.runs.Load()
	err := e.Invoke(context.Background(), "crashy", &call.Request{Input: []byte("x")})
	if errdefs.KindOf(err) != errdefs.KindUnavailable || !strings.Contains(err.Error(), "backing off") {
		t.Fatalf("after 5 crashes: %v, want the back-off", err)
	}
	if n := d.runs.Load(); n != runs {
		t.Errorf("the backed-off request ran (%d runs, %d before it)", n, runs)
	}
}
