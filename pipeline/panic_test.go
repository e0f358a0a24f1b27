package pipeline_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/bundle"
	"github.com/plover-run/plover/call"
	"github.com/plover-run/plover/device"
	"github.com/plover-run/plover/engine"
	"github.com/plover-run/plover/errdefs"
	"github.com/plover-run/plover/internal/testkit"
	"github.com/plover-run/plover/netguard"
	"github.com/plover-run/plover/objectstore"
	"github.com/plover-run/plover/pipeline"
)

// A parallel step's branches past the first run on goroutines of their
// own, where nothing recovered a panic (a bug, in their run): the process
// ended. The panic is raised again in the request's goroutine, for its
// transport to recover (a 500); the pipeline serves the next request.
func TestPanicInAParallelBranchReachesTheRequest(t *testing.T) {
	dev := &testkit.PanicDevice{Device: device.NewHost(0), Function: "bug"}
	e := testkit.Engine(t, engine.Config{Devices: []device.Device{dev}})
	testkit.Deploy(t, e, testkit.BundleDir(t, testkit.Manifest("echo"), nil))
	testkit.Deploy(t, e, testkit.BundleDir(t, testkit.Manifest("bug"), nil))
	testkit.Deploy(t, e, pipelineDir(t, "p", map[string]any{"parallel": []string{"echo", "bug"}}))
	r := pipeline.New(e, nil)
	invoke := func(in []byte) (panicked any, err error) {
		defer func() { panicked = recover() }()
		return nil, r.Invoke(context.Background(), "p", &call.Request{Input: in})
	}
	p, err := invoke(testkit.PanicInput)
	if p == nil || !strings.Contains(fmt.Sprint(p), "a device bug") {
		t.Fatalf("a request whose second branch panicked: panic %v, err %v; want the device's panic", p, err)
	}
	if p, err := invoke([]byte("fine")); p != nil || err != nil {
		t.Fatalf("the next request: panic %v, err %v", p, err)
	}
	if closed := dev.Closed.Load(); closed != 1 {
		t.Errorf("%d instances closed, want the panicked run's", closed)
	}
	// Its transport answers the panic 500: plover ls counts it so.
	if fi, err := e.Control().Function(context.Background(), "p"); err != nil || fi.Requests != 2 || fi.Errors != 1 {
		t.Errorf("the pipeline's counts: %d requests, %d errors (%v), want 2 and 1", fi.Requests, fi.Errors, err)
	}
}

// A request that panics (its device's bug, raised again to its transport)
// gives back what it pinned: the function's version, or the pipeline's
// and its steps'. A pin kept held the version for the process's life: a
// redeploy never closed the old version's program, nor its device memory.
func TestAPanicGivesItsPinsBack(t *testing.T) {
	for _, tc := range []struct {
		name   string
		invoke string // what the request names
		steps  []any  // its pipeline's, if a pipeline
	}{
		{"a function", "bug", nil},
		{"a pipeline's step", "p", []any{"echo", "bug"}},
		{"a parallel branch", "p", []any{map[string]any{"parallel": []string{"echo", "bug"}}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dev := &testkit.PanicDevice{Device: device.NewHost(0), Function: "bug"}
			e := testkit.Engine(t, engine.Config{Devices: []device.Device{dev}})
			testkit.Deploy(t, e, testkit.BundleDir(t, testkit.Manifest("echo"), nil))
			bug := testkit.BundleDir(t, testkit.Manifest("bug"), nil)
			testkit.Deploy(t, e, bug)
			if tc.steps != nil {
				testkit.Deploy(t, e, pipelineDir(t, "p", tc.steps...))
			}
			r := pipeline.New(e, nil)
			func() {
				defer func() {
					if recover() == nil {
						t.Fatal("the request did not panic")
					}
				}()
				r.Invoke(context.Background(), tc.invoke, &call.Request{Input: testkit.PanicInput})
			}()
			closed := dev.ProgramsClosed.Load()
			b, _, _, err := bundle.PackBytes(bug)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := e.Control().Deploy(context.Background(), "bug", bytes.NewReader(b), true); err != nil {
				t.Fatal(err)
			}
			// The redeploy retires the version that ran: with nothing
			// holding it, its program closes.
			for end := time.Now().Add(10 * time.Second); dev.ProgramsClosed.Load() == closed; time.Sleep(5 * time.Millisecond) {
				if time.Now().After(end) {
					t.Fatal("the version the panicked request ran was never closed after a redeploy: its pin was kept")
				}
			}
		})
	}
}

// bugRecords is a store with a bug: reading the record of a function
// named "bug" panics.
type bugRecords struct{ objectstore.Store }

func (s bugRecords) GetTagged(ctx context.Context, key string) (io.ReadCloser, objectstore.Info, error) {
	if key == "functions/bug.json" {
		panic("a bug in the store")
	}
	return s.Store.GetTagged(ctx, key)
}

// A pipeline whose plan panics as it resolves a later step (a bug in the
// store's read of that step's record, raised again in the request's
// goroutine) gives back the pins it took before: the pipeline's and the
// earlier steps'. They held those versions for good.
func TestAPanicMakingAPlanGivesItsPinsBack(t *testing.T) {
	fs, err := objectstore.NewFS(filepath.Join(t.TempDir(), "store"))
	if err != nil {
		t.Fatal(err)
	}
	deployer := testkit.Engine(t, engine.Config{Store: fs})
	echo := testkit.BundleDir(t, testkit.Manifest("echo"), nil)
	testkit.Deploy(t, deployer, echo)
	testkit.Deploy(t, deployer, testkit.BundleDir(t, testkit.Manifest("bug"), nil))
	testkit.Deploy(t, deployer, pipelineDir(t, "p", "echo", "bug"))
	dev := &testkit.PanicDevice{Device: device.NewHost(0), Function: "none"}
	e := testkit.Engine(t, engine.Config{Store: bugRecords{fs}, Devices: []device.Device{dev}})
	r := pipeline.New(e, nil)
	if err := r.Invoke(context.Background(), "echo", &call.Request{Input: []byte("x")}); err != nil {
		t.Fatal(err) // echo's program loaded: something to close
	}
	func() {
		defer func() {
			if p := recover(); p == nil || !strings.Contains(fmt.Sprint(p), "a bug in the store") {
				t.Fatalf("planning p: panic %v, want the store's", p)
			}
		}()
		err := r.Invoke(context.Background(), "p", &call.Request{Input: []byte("x")})
		t.Errorf("planning p returned %v", err)
	}()
	b, _, _, err := bundle.PackBytes(echo)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.Control().Deploy(context.Background(), "echo", bytes.NewReader(b), true); err != nil {
		t.Fatal(err)
	}
	for end := time.Now().Add(10 * time.Second); dev.ProgramsClosed.Load() == 0; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatal("echo's version was never closed after a redeploy: the plan that panicked kept its pin")
		}
	}
}

// A pipeline record with no steps (an empty list, or none at all: a Go
// build leaves an empty list out), more steps than abi.MaxPipelineSteps,
// or a parallel step with no branches (deploys refuse each; written by
// hand or by another build) fails its requests and its users' with a 500
// naming it and why. Planning indexed its first step and panicked, and the
// pins taken before were kept; a record without the field was run as a
// function; 33 steps panicked every request in the step metrics (reviews
// found each).
func TestARecordWithNoStepsFailsItsRequests(t *testing.T) {
	many := `"steps":["echo"` + strings.Repeat(`,"echo"`, abi.MaxPipelineSteps) + `]`
	for _, tc := range []struct{ name, steps, want string }{
		{"an empty list", `"steps":[]`, "pipeline inner has no steps"},
		{"no list", ``, "pipeline inner has no steps"},
		{"a parallel step with no branches", `"steps":[{"parallel":[]}]`, "a parallel step with no branches"},
		{"more steps than a pipeline may have", many, "pipeline inner has 33 steps in its record, more than the 32"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "store")
			fs, err := objectstore.NewFS(dir)
			if err != nil {
				t.Fatal(err)
			}
			deployer := testkit.Engine(t, engine.Config{Store: fs})
			testkit.Deploy(t, deployer, testkit.BundleDir(t, testkit.Manifest("echo"), nil))
			testkit.Deploy(t, deployer, pipelineDir(t, "inner", "echo"))
			testkit.Deploy(t, deployer, pipelineDir(t, "outer", "echo", "inner"))
			path := filepath.Join(dir, "functions", "inner.json")
			raw, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			field := regexp.MustCompile(`,?"steps":\s*\[[^\]]*\]`)
			if tc.steps != "" {
				tc.steps = "," + tc.steps
			}
			emptied := field.ReplaceAll(raw, []byte(tc.steps))
			if bytes.Equal(emptied, raw) {
				t.Fatalf("no steps in inner's record:\n%s", raw)
			}
			if err := os.WriteFile(path, emptied, 0o644); err != nil {
				t.Fatal(err)
			}
			e := testkit.Engine(t, engine.Config{Store: fs})
			r := pipeline.New(e, nil)
			for _, name := range []string{"inner", "outer"} {
				err := r.Invoke(context.Background(), name, &call.Request{Input: []byte("x")})
				if errdefs.KindOf(err) != errdefs.KindInternal || !strings.Contains(err.Error(), tc.want) {
					t.Errorf("%s: %v, want a 500 saying %q", name, err, tc.want)
				}
			}
		})
	}
}

// A panic in the request's Gone check (a bug in its transport's) while it
// waits for room in --max-pipeline-memory was raised on the goroutine that
// polls it, where nothing recovered it: the process ended. It is raised on
// the request's goroutine, for its transport to recover, as soon as it
// happens; the request holds none of the budget, and the next is served.
func TestAGonePanicWhileWaitingForRoomReachesTheRequest(t *testing.T) {
	e := testkit.Engine(t, engine.Config{})
	testkit.Deploy(t, e, testkit.BundleDir(t, testkit.Manifest("a"), nil))
	testkit.Deploy(t, e, pipelineDir(t, "p", "a", "a"))
	mem := netguard.NewOrderedBudget(1 << 20)
	if err := mem.Acquire(context.Background(), 1<<20); err != nil { // others' requests hold it all
		t.Fatal(err)
	}
	r := pipeline.New(e, nil)
	r.Bound(mem)
	invoke := func(gone func() bool) (panicked any, err error) {
		defer func() { panicked = recover() }()
		return nil, r.Invoke(context.Background(), "p", &call.Request{Input: []byte("abcdefgh"),
			Deadline: time.Now().Add(30 * time.Second), Gone: gone})
	}
	start := time.Now()
	p, err := invoke(func() bool { panic("a bug in the transport's Gone check") })
	if pv, ok := p.(*errdefs.Panic); !ok || pv.Value != "a bug in the transport's Gone check" {
		t.Fatalf("a request whose Gone panicked while it waited: panic %v, err %v; want Gone's panic", p, err)
	}
	if took := time.Since(start); took > 3*time.Second {
		t.Errorf("the panic reached the request %v after it began waiting, want at once", took)
	}
	if got := mem.InUse(); got != 1<<20 {
		t.Errorf("%d bytes of the budget in use after the panic, want %d (the others' alone)", got, 1<<20)
	}
	mem.Release(1 << 20)
	if p, err := invoke(func() bool { return false }); p != nil || err != nil {
		t.Fatalf("the next request: panic %v, err %v", p, err)
	}
	if got := mem.InUse(); got != 0 {
		t.Errorf("%d bytes of the budget in use after the next request, want 0", got)
	}
}
