package engine_test

import (
	"bytes"
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"unsafe"

	"github.com/plover-run/plover/call"
	"github.com/plover-run/plover/device"
	"github.com/plover-run/plover/engine"
	"github.com/plover-run/plover/errdefs"
	"github.com/plover-run/plover/internal/testkit"
	"github.com/plover-run/plover/pipeline"
)

// lendDevice is the host device whose programs lend slots of ordinary
// memory, owned by the program that lent them or by stranger, as a
// worker's slot is after a redeploy by another tenant. Its programs run in
// worker process proc (nil: none).
type lendDevice struct {
	device.Device
	stranger device.Program
	proc     *workerProc
	closed   atomic.Int32 // programs closed
	panics   string       // "lend", "release" or "discard": that call panics (a bug)
}

// workerProc is a worker process: its pid may be a dead one's.
type workerProc struct{ pid int }

// strangerProgram is a worker's program of another version, in process
// proc.
type strangerProgram struct {
	device.Program
	proc *workerProc
}

type lendProgram struct {
	device.Program
	d *lendDevice
}

// Close counts the programs closed on the device (lendDevice.closed).
func (p *lendProgram) Close() error {
	p.d.closed.Add(1)
	return p.Program.Close()
}

// SameProcess is a worker's program's (worker.program's): the same
// process, whatever the pids.
func (p *lendProgram) SameProcess(o device.Program) bool {
	s, ok := o.(*strangerProgram)
	return ok && p.d.proc != nil && s.proc == p.d.proc
}

type lentSlot struct {
	mem   []byte
	maxIn int64
	dev   device.Device
	owner device.Program
}

func (s *lentSlot) Input() []byte         { return s.mem[:s.maxIn] }
func (s *lentSlot) Output() []byte        { return s.mem[s.maxIn:] }
func (s *lentSlot) Device() device.Device { return s.dev }
func (s *lentSlot) Release() {
	if d, ok := s.dev.(*lendDevice); ok && d.panics == "release" {
		panic("a bug in the slot's release")
	}
}

func (s *lentSlot) Discard() {
	if d, ok := s.dev.(*lendDevice); ok && d.panics == "discard" {
		panic("a bug in the slot's discard")
	}
}
func (s *lentSlot) Owner() device.Program { return s.owner }

func (d *lendDevice) Load(ctx context.Context, spec device.ProgramSpec) (device.Program, error) {
	p, err := d.Device.Load(ctx, spec)
	if err != nil {
		return nil, err
	}
	return &lendProgram{p, d}, nil
}

func (p *lendProgram) Lend(maxIn, out int64) (device.Slot, bool) {
	if p.d.panics == "lend" {
		panic("a bug in Lend")
	}
	owner := device.Program(p)
	if p.d.stranger != nil {
		owner = p.d.stranger
	}
	return &lentSlot{mem: make([]byte, maxIn+out), maxIn: maxIn, dev: p.d, owner: owner}, true
}

// lentEcho is an engine on d running function echo, loaded, and a slot
// its program lent (owned as d says), released when the test ends.
func lentEcho(t *testing.T, d *lendDevice) (*engine.Engine, call.Landing) {
	t.Helper()
	e := testkit.Engine(t, engine.Config{Devices: []device.Device{d}})
	testkit.Deploy(t, e, testkit.BundleDir(t, testkit.Manifest("echo"), nil))
	if err := e.Invoke(context.Background(), "echo", &call.Request{Input: []byte("load")}); err != nil {
		t.Fatal(err)
	}
	s := e.Land("echo")
	if s == nil {
		t.Fatal("no slot lent")
	}
	t.Cleanup(s.Release)
	return e, s
}

// A body read into a slot its instance's own program lent is run on in
// place (the output lands in the slot); one another program lent is not:
// its memory may be another process's (a tenant's worker), and the
// output goes to memory of the server's. When that program does not run
// the request's version (the function was redeployed, perhaps by another
// tenant, between the body's read and the run), its process may have
// rewritten the body meanwhile: the request fails, retryable, naming the
// redeploy, rather than run on what that process left. A slot of the very
// process the request runs in (a tenant's worker that reloaded the
// version) is not refused; one of a dead worker whose pid the running
// worker has now is.
func TestOutputLandsOnlyInItsProgramsSlot(t *testing.T) {
	running := &workerProc{pid: 1 << 22}
	for _, tc := range []struct {
		name     string
		stranger device.Program
		inPlace  bool
		refused  bool
	}{
		{"own program's slot", nil, true, false},
		{"a worker's slot of another version", &strangerProgram{proc: &workerProc{pid: 1<<22 + 1}}, false, true},
		{"a slot of another version, no worker's", &lendProgram{}, false, true},
		{"a slot of another program of the running worker", &strangerProgram{proc: running}, false, false},
		{"a slot of a dead worker whose pid the running one reuses", &strangerProgram{proc: &workerProc{pid: running.pid}}, false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, s := lentEcho(t, &lendDevice{Device: device.NewHost(0), stranger: tc.stranger, proc: running})
			n := copy(s.Input(), "hello")
			req := &call.Request{Input: s.Input()[:n], Landing: s}
			err := e.Invoke(context.Background(), "echo", req)
			if tc.refused {
				if errdefs.KindOf(err) != errdefs.KindUnavailable || !strings.Contains(err.Error(), "redeployed") {
					t.Fatalf("the request: %v (output %.20q); want a 503 naming the redeploy", err, req.Output)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.HasPrefix(req.Output, []byte("hello")) {
				t.Fatalf("output %q", req.Output)
			}
			in := unsafe.SliceData(req.Output) == unsafe.SliceData(s.Output())
			if in != tc.inPlace {
				t.Errorf("output in the slot: %v, want %v", in, tc.inPlace)
			}
		})
	}
}

// A body landed in a slot of the function the name was, which a redeploy
// made a batching function or a pipeline (neither is lent a slot, so the
// landing is the old version's), is refused as the unbatched path refuses
// a foreign slot: the old worker may have rewritten it meanwhile. Before,
// both ran on what that worker left (a read-only review's probe: the
// batch answered 667 for 7 rewritten to 666, the pipeline "EVIL!").
func TestABodyLandedBeforeARedeployIsRefused(t *testing.T) {
	for _, tc := range []struct {
		name   string
		deploy func(t *testing.T, e *engine.Engine)
		invoke func(e *engine.Engine, req *call.Request) error
	}{
		{"now batching", func(t *testing.T, e *engine.Engine) {
			testkit.Deploy(t, e, batchBundle(t, testkit.BatchManifest("echo", 4, "")))
		}, func(e *engine.Engine, req *call.Request) error { return e.Invoke(context.Background(), "echo", req) }},
		{"now a pipeline", func(t *testing.T, e *engine.Engine) {
			testkit.Deploy(t, e, testkit.BundleDir(t, testkit.Manifest("echo2"), nil))
			testkit.Deploy(t, e, testkit.PipelineDir(t, "echo", "echo2"))
		}, func(e *engine.Engine, req *call.Request) error {
			return pipeline.New(e, nil).Invoke(context.Background(), "echo", req)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, s := lentEcho(t, &lendDevice{Device: device.NewHost(0), stranger: &strangerProgram{proc: &workerProc{pid: 1<<22 + 1}},
				proc: &workerProc{pid: 1 << 22}})
			n := copy(s.Input(), item(7, 0))
			tc.deploy(t, e)
			req := &call.Request{Input: s.Input()[:n], Landing: s}
			err := tc.invoke(e, req)
			if errdefs.KindOf(err) != errdefs.KindUnavailable || !strings.Contains(err.Error(), "redeployed") {
				t.Fatalf("the request: %v (output %q); want a 503 naming the redeploy", err, req.Output)
			}
		})
	}
}

// A redeploy, or a delete, between a body's landing in a slot of its
// worker and its run costs the request nothing: it runs on the version it
// landed for, in place, as a request in flight finishes on the version it
// started on, and that version goes once the landing is released. Before,
// the run resolved the name again, met the slot of the version before,
// and answered 503 (an S3 switch under load lost 1 request in 5,133).
// Through the engine and through the request path's runner alike.
func TestABodyLandedBeforeARedeployRunsOnItsVersion(t *testing.T) {
	changes := []struct {
		name   string
		change func(t *testing.T, e *engine.Engine)
	}{
		{"redeployed", func(t *testing.T, e *engine.Engine) {
			m := testkit.Manifest("echo")
			m.TmpBytes++ // another bundle, another version
			testkit.Deploy(t, e, testkit.BundleDir(t, m, nil))
		}},
		{"now batching", func(t *testing.T, e *engine.Engine) {
			testkit.Deploy(t, e, batchBundle(t, testkit.BatchManifest("echo", 4, "")))
		}},
		{"now a pipeline", func(t *testing.T, e *engine.Engine) {
			testkit.Deploy(t, e, testkit.BundleDir(t, testkit.Manifest("echo2"), nil))
			testkit.Deploy(t, e, testkit.PipelineDir(t, "echo", "echo2"))
		}},
		{"deleted", func(t *testing.T, e *engine.Engine) {
			if err := e.Control().Delete(context.Background(), "echo", true); err != nil {
				t.Fatal(err)
			}
		}},
	}
	paths := []struct {
		name   string
		invoke func(e *engine.Engine, req *call.Request) error
	}{
		{"engine", func(e *engine.Engine, req *call.Request) error { return e.Invoke(context.Background(), "echo", req) }},
		{"runner", func(e *engine.Engine, req *call.Request) error {
			return pipeline.New(e, nil).Invoke(context.Background(), "echo", req)
		}},
	}
	for _, ch := range changes {
		for _, path := range paths {
			t.Run(ch.name+"/"+path.name, func(t *testing.T) {
				d := &lendDevice{Device: device.NewHost(0)}
				e := testkit.Engine(t, engine.Config{Devices: []device.Device{d}})
				v1 := testkit.Deploy(t, e, testkit.BundleDir(t, testkit.Manifest("echo"), nil))
				if err := e.Invoke(context.Background(), "echo", &call.Request{Input: []byte("load")}); err != nil {
					t.Fatal(err)
				}
				s := e.Land("echo")
				if s == nil {
					t.Fatal("no slot lent")
				}
				released := false
				defer func() {
					if !released {
						s.Release()
					}
				}()
				n := copy(s.Input(), "hello")
				ch.change(t, e)
				req := &call.Request{Input: s.Input()[:n], Landing: s}
				if err := path.invoke(e, req); err != nil {
					t.Fatalf("the request: %v", err)
				}
				if !bytes.HasPrefix(req.Output, []byte("hello")) || req.Version != v1.Version {
					t.Fatalf("output %q of version %s; want hello... of the version landed for, %s", req.Output, req.Version, v1.Version)
				}
				if unsafe.SliceData(req.Output) != unsafe.SliceData(s.Output()) {
					t.Error("the output did not land in the slot")
				}
				if c := d.closed.Load(); c != 0 {
					t.Fatalf("%d programs closed while the landing holds its version", c)
				}
				released = true
				s.Release()
				s.Release() // a second release drops no second reference
				if c := d.closed.Load(); c != 1 {
					t.Fatalf("%d programs closed after the landing's release; want the old version's", c)
				}
			})
		}
	}
}

// A landing holds its version until it is released, also where giving the
// slot back, or lending it, panics (a bug the caller recovers: httpapi
// does): the reference is dropped all the same, and the version goes
// after a redeploy. Before, a panic there held it for good (a read-only
// review's probe: 0 programs closed after the redeploy).
func TestALandingsPanicDropsItsVersion(t *testing.T) {
	for _, where := range []string{"lend", "release", "discard"} {
		t.Run(where, func(t *testing.T) {
			d := &lendDevice{Device: device.NewHost(0)}
			e := testkit.Engine(t, engine.Config{Devices: []device.Device{d}})
			testkit.Deploy(t, e, testkit.BundleDir(t, testkit.Manifest("echo"), nil))
			if err := e.Invoke(context.Background(), "echo", &call.Request{Input: []byte("load")}); err != nil {
				t.Fatal(err)
			}
			d.panics = where
			func() {
				defer func() {
					if recover() == nil {
						t.Fatalf("%s did not panic", where)
					}
				}()
				l := e.Land("echo")
				if where == "discard" {
					l.Discard()
				} else {
					l.Release()
				}
			}()
			m := testkit.Manifest("echo")
			m.TmpBytes++ // another version
			testkit.Deploy(t, e, testkit.BundleDir(t, m, nil))
			if c := d.closed.Load(); c != 1 {
				t.Fatalf("%d programs closed after a redeploy; want the old version's: its reference was kept", c)
			}
		})
	}
}
