package pipeline_test

import (
	"bytes"
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/plover-run/plover/call"
	"github.com/plover-run/plover/device"
	"github.com/plover-run/plover/engine"
	"github.com/plover-run/plover/internal/testkit"
	"github.com/plover-run/plover/pipeline"
)

// A parallel step's branch that panics, first or not, fails the request:
// its panic reaches the request's caller only once every sibling ended,
// and a sibling takes no further step. Before the fix the first branch ran
// in the request's goroutine unrecovered: its panic unwound the request at
// once while its sibling still ran ("bug first": watch running when the
// caller got the panic); and no branch's panic set the run failed, so a
// sibling took its next step ("bug second": tail served 1).
func TestBranchPanicWaitsForSiblingsAndStopsThem(t *testing.T) {
	for _, tc := range []struct {
		name     string
		branches []string
	}{
		{"bug first", []string{"bug", "inner"}},
		{"bug second", []string{"inner", "bug"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			wd := newWatchDevice()
			e := testkit.Engine(t, engine.Config{Devices: []device.Device{wd}, Timeout: 30 * time.Second})
			for _, n := range []string{"bug", "watch", "tail"} {
				testkit.Deploy(t, e, testkit.BundleDir(t, testkit.Manifest(n), nil))
			}
			testkit.Deploy(t, e, pipelineDir(t, "inner", "watch", "tail"))
			testkit.Deploy(t, e, pipelineDir(t, "p", map[string]any{"parallel": tc.branches}))
			r := pipeline.New(e, nil)
			var running int32
			panicked := func() (p any) {
				defer func() { p, running = recover(), wd.running.Load() }()
				r.Invoke(context.Background(), "p", &call.Request{Input: testkit.PanicInput})
				return nil
			}()
			if panicked == nil {
				t.Fatal("the request whose branch panicked did not panic")
			}
			if running != 0 {
				t.Errorf("the panic reached the request's caller while its sibling branch's step still ran")
			}
			for wd.running.Load() > 0 {
				time.Sleep(5 * time.Millisecond) // polls observed state (before the fix): watch ended
			}
			fi, err := e.Control().Function(context.Background(), "tail")
			if err != nil {
				t.Fatal(err)
			}
			if fi.Requests != 0 {
				t.Errorf("the sibling branch took its next step after the panic: tail served %d requests", fi.Requests)
			}
		})
	}
}

// watchDevice wraps a PanicDevice whose function "bug" has the bug. A run
// of the function "watch" holds its input for a while and counts whether
// it changed under it; bug's run starts only once watch's has, so that its
// panic comes while watch runs.
type watchDevice struct {
	device.Device
	started               chan struct{}
	changed, ran, running atomic.Int32
}

func newWatchDevice() *watchDevice {
	return &watchDevice{
		Device:  &testkit.PanicDevice{Device: device.NewHost(0), Function: "bug"},
		started: make(chan struct{}, 1),
	}
}

type watchProgram struct {
	device.Program
	d    *watchDevice
	name string
}

type watchInstance struct {
	device.Instance
	d    *watchDevice
	name string
}

func (d *watchDevice) Load(ctx context.Context, spec device.ProgramSpec) (device.Program, error) {
	p, err := d.Device.Load(ctx, spec)
	if err != nil {
		return nil, err
	}
	return &watchProgram{p, d, spec.Manifest.Name}, nil
}

func (p *watchProgram) NewInstance(cfg device.InstanceConfig) (device.Instance, error) {
	i, err := p.Program.NewInstance(cfg)
	if err != nil {
		return nil, err
	}
	return &watchInstance{i, p.d, p.name}, nil
}

func (i *watchInstance) Run(r *device.Run) error {
	switch i.name {
	case "bug":
		<-i.d.started
	case "watch":
		i.d.running.Add(1)
		defer i.d.running.Add(-1)
		i.d.started <- struct{}{}
		snap := bytes.Clone(r.Input)
		time.Sleep(300 * time.Millisecond) // a long run, for others to come meanwhile
		if !bytes.Equal(snap, r.Input) {
			i.d.changed.Add(1)
		}
		i.d.ran.Add(1)
	}
	return i.Instance.Run(r)
}

// Before the fix, the first branch's panic unwound seq, whose deferred
// putBuf handed the stage's input (a pooled buffer, still read by the
// sibling branch) to the next request: another tenant's bytes reached the
// sibling's function (in 2 of 5 rounds, as the reviewer found).
func TestBranchPanicKeepsSiblingsInput(t *testing.T) {
	wd := newWatchDevice()
	e := testkit.Engine(t, engine.Config{Devices: []device.Device{wd}, Timeout: 30 * time.Second})
	for _, n := range []string{"echo", "bug", "watch", "tail"} {
		testkit.Deploy(t, e, testkit.BundleDir(t, testkit.Manifest(n), nil))
	}
	// p's parallel step reads echo's output: a pooled buffer.
	testkit.Deploy(t, e, pipelineDir(t, "p", "echo", map[string]any{"parallel": []string{"bug", "watch"}}))
	testkit.Deploy(t, e, pipelineDir(t, "q", "echo", "tail"))
	r := pipeline.New(e, nil)
	if err := r.Invoke(context.Background(), "q", &call.Request{Input: []byte("warm")}); err != nil {
		t.Fatal(err)
	}
	const rounds = 5
	for range rounds {
		func() {
			defer func() { recover() }()
			r.Invoke(context.Background(), "p", &call.Request{Input: testkit.PanicInput})
		}()
		// Another request through a pipeline of the same runner, its
		// middle output in a pooled buffer.
		for i := range 20 {
			r.Invoke(context.Background(), "q", &call.Request{Input: bytes.Repeat([]byte{byte('A' + i)}, 200)})
		}
		for wd.running.Load() > 0 {
			time.Sleep(5 * time.Millisecond) // polls observed state: watch's run ended
		}
	}
	if n := wd.changed.Load(); n > 0 {
		t.Errorf("a sibling branch's input was rewritten by another request while it ran, in %d of its %d runs", n, wd.ran.Load())
	}
}
