package engine_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/bundle"
	"github.com/plover-run/plover/call"
	"github.com/plover-run/plover/device"
	"github.com/plover-run/plover/engine"
	"github.com/plover-run/plover/errdefs"
	"github.com/plover-run/plover/internal/testkit"
)

// workerLoss is a worker's device.Loss as the worker layer reports it: a
// crash of the program's own, or (collateral) its tenant's shared process
// ended by another program.
type workerLoss struct{ collateral, nowhere bool }

func (l workerLoss) Error() string {
	return fmt.Sprintf("worker process 1 died (collateral %v, while idle %v)", l.collateral, l.nowhere)
}
func (l workerLoss) RanNowhere() bool { return l.nowhere }
func (l workerLoss) ByServer() bool   { return false }
func (l workerLoss) Collateral() bool { return l.collateral }
func (l workerLoss) LogAttrs() []any  { return []any{"pid", 1} }

// lossDevice is the host device whose loads, entry lookups or runs fail
// with loss while its counts say so (-1: every one), as a worker process
// would that dies under them. It records the tenants its loads name.
type lossDevice struct {
	device.Device
	loss    workerLoss
	runLoss *workerLoss // the runs' loss, when not loss

	mu                     sync.Mutex
	failLoads, failEntries int
	failRuns               int
	loads, entries, runs   int
	tenants                []string
	// failInstances instances' creations fail with instErr.
	failInstances, instances int
	instErr                  error
	// faulted: failing runs met a device fault (faultLoss), the loss
	// with a kernel error.
	faulted bool
}

// fails counts one operation and reports whether it fails (n: how many
// more of its kind fail).
func (d *lossDevice) fails(n, count *int) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	*count++
	if *n == 0 {
		return false
	}
	if *n > 0 {
		*n--
	}
	return true
}

type lossProgram struct {
	device.Program
	d *lossDevice
}

type lossInstance struct {
	device.Instance
	d *lossDevice
}

func (d *lossDevice) Load(ctx context.Context, spec device.ProgramSpec) (device.Program, error) {
	d.mu.Lock()
	d.tenants = append(d.tenants, spec.Tenant)
	d.mu.Unlock()
	if d.fails(&d.failLoads, &d.loads) {
		return nil, d.loss
	}
	p, err := d.Device.Load(ctx, spec)
	if err != nil {
		return nil, err
	}
	return &lossProgram{Program: p, d: d}, nil
}

func (p *lossProgram) Entry(kernel string) (int32, error) {
	if p.d.fails(&p.d.failEntries, &p.d.entries) {
		return 0, p.d.loss
	}
	return p.Program.Entry(kernel)
}

func (p *lossProgram) NewInstance(cfg device.InstanceConfig) (device.Instance, error) {
	if p.d.fails(&p.d.failInstances, &p.d.instances) {
		return nil, p.d.instErr
	}
	i, err := p.Program.NewInstance(cfg)
	if err != nil {
		return nil, err
	}
	return &lossInstance{Instance: i, d: p.d}, nil
}

func (i *lossInstance) Run(r *device.Run) error {
	if i.d.fails(&i.d.failRuns, &i.d.runs) {
		if l := i.d.runLoss; l != nil {
			return *l
		}
		if i.d.faulted {
			return faultLoss{ke: &device.KernelError{Msg: "cuEventRecord: CUDA_ERROR_ILLEGAL_ADDRESS"}, loss: i.d.loss}
		}
		return i.d.loss
	}
	return i.Instance.Run(r)
}

// faultLoss is a run that met a sticky device fault, as a worker reports
// it: the chain's kernel error, with the worker lost by it.
type faultLoss struct {
	ke   *device.KernelError
	loss workerLoss
}

func (e faultLoss) Error() string   { return e.ke.Error() }
func (e faultLoss) Unwrap() []error { return []error{e.ke, e.loss} }

// lossEngine is an engine over d with echo deployed by tenant acme, and the
// engine's log.
func lossEngine(t *testing.T, d *lossDevice) (*engine.Engine, *testkit.LogBuffer) {
	t.Helper()
	var logs testkit.LogBuffer
	e := testkit.Engine(t, engine.Config{Devices: []device.Device{d}, Log: slog.New(slog.NewTextHandler(&logs, nil))})
	b, _, _, err := bundle.PackBytes(testkit.BundleDir(t, testkit.Manifest("echo"), nil))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.Control().DeployAs(context.Background(), "echo", "acme", bytes.NewReader(b), false); err != nil {
		t.Fatal(err)
	}
	return e, &logs
}

// A request whose program was lost with its tenant's shared worker by
// another function (a collateral loss) goes once more on a fresh program,
// whether the loss came in its run, in its override chain's lookup or in
// the load its request made; once only, however many of them lose it. A
// run that finds its fresh worker had died while idle (it ran nowhere) goes
// once more too, its load's retry spent or not. A crash of its own is not retried
// (the control). The version's tenant reaches every load.
func TestCollateralLossRunsOnceMore(t *testing.T) {
	tests := []struct {
		name                string
		collateral          bool
		loads, entries, run int  // operations that fail
		runIdle             bool // runs fail as a worker dead while idle would
		override            bool
		wantErr             bool
		wantLoads, wantRuns int
		wantLog             string
	}{
		{"run", true, 0, 0, 1, false, false, false, 2, 2, "lost with its tenant's worker"},
		{"run twice", true, 0, 0, 2, false, false, true, 2, 2, "lost with its tenant's worker"},
		{"lookup", true, 0, 1, 0, false, true, false, 2, 1, "lost with its tenant's worker"},
		{"load", true, 1, 0, 0, false, false, false, 2, 1, "lost with its tenant's worker"},
		{"load then run", true, 1, 0, 1, false, false, true, 2, 1, "lost with its tenant's worker"},
		{"load then an idle death", true, 1, 0, 1, true, false, false, 3, 2, "lost with its tenant's worker"},
		{"own crash", false, 0, 0, 1, false, false, true, 1, 1, "worker died"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := &lossDevice{Device: device.NewHost(0), loss: workerLoss{collateral: tt.collateral}, failLoads: tt.loads, failEntries: tt.entries, failRuns: tt.run}
			if tt.runIdle {
				d.runLoss = &workerLoss{nowhere: true}
			}
			e, logs := lossEngine(t, d)
			req := &call.Request{Input: []byte("x")}
			if tt.override {
				req.Override = &call.Override{Chain: []abi.Launch{{Kernel: "echo", Grid: 1, Block: 1}}, OutBytes: 1, TmpBytes: -1}
			}
			err := e.Invoke(context.Background(), "echo", req)
			switch {
			case tt.wantErr && errdefs.KindOf(err) != errdefs.KindWorkerCrashed:
				t.Fatalf("got %v, want the worker's crash", err)
			case !tt.wantErr && (err != nil || req.Output[0] != 'x'):
				t.Fatalf("got %v, output %q; want x", err, req.Output[:min(1, len(req.Output))])
			}
			d.mu.Lock()
			defer d.mu.Unlock()
			if d.loads != tt.wantLoads || d.runs != tt.wantRuns {
				t.Fatalf("%d loads and %d runs, want %d and %d", d.loads, d.runs, tt.wantLoads, tt.wantRuns)
			}
			for _, tn := range d.tenants {
				if tn != "acme" {
					t.Fatalf("loads named tenants %q, want acme", d.tenants)
				}
			}
			if !strings.Contains(logs.String(), tt.wantLog) {
				t.Fatalf("log lacks %q:\n%s", tt.wantLog, logs)
			}
		})
	}
}

// A run that met a sticky device fault in a tenant's worker, the context
// faulted by another function (its loss collateral), is retried once as
// any collateral loss, and if it is lost so again its client is told of
// the lost worker (worker_crashed), not of a kernel failure of its own
// with another function's error. A fault of its own is its kernel's
// failure, not retried (the control).
func TestCollateralFaultIsNotTheFunctionsKernelFailure(t *testing.T) {
	tests := []struct {
		name       string
		collateral bool
		runs       int  // that fault
		wantOK     bool // else wantKind
		wantKind   errdefs.Kind
		wantRuns   int
	}{
		{"collateral, then a fresh worker", true, 1, true, 0, 2},
		{"collateral twice", true, 2, false, errdefs.KindWorkerCrashed, 2},
		{"own", false, 1, false, errdefs.KindKernel, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := &lossDevice{Device: device.NewHost(0), loss: workerLoss{collateral: tt.collateral}, failRuns: tt.runs, faulted: true}
			e, logs := lossEngine(t, d)
			req := &call.Request{Input: []byte("x")}
			err := e.Invoke(context.Background(), "echo", req)
			switch {
			case tt.wantOK && (err != nil || req.Output[0] != 'x'):
				t.Fatalf("got %v; want x from the run once more", err)
			case !tt.wantOK && errdefs.KindOf(err) != tt.wantKind:
				t.Fatalf("got %v (%v), want %v", err, errdefs.KindOf(err), tt.wantKind)
			case tt.collateral && err != nil && strings.Contains(err.Error(), "ILLEGAL_ADDRESS"):
				t.Fatalf("got %v: another function's error", err)
			}
			d.mu.Lock()
			defer d.mu.Unlock()
			if d.runs != tt.wantRuns {
				t.Fatalf("%d runs, want %d", d.runs, tt.wantRuns)
			}
			if want := map[bool]string{true: "lost with its tenant's worker", false: "worker died"}[tt.collateral]; !strings.Contains(logs.String(), want) {
				t.Fatalf("log lacks %q:\n%s", want, logs)
			}
		})
	}
}

// Collateral losses are not the function's crashes: however many, it does
// not back off (its siblings' crashes must not fail it). Its own crashes
// back it off as before (the control).
func TestCollateralLossesDoNotBackOff(t *testing.T) {
	for _, collateral := range []bool{true, false} {
		t.Run(fmt.Sprintf("collateral=%v", collateral), func(t *testing.T) {
			d := &lossDevice{Device: device.NewHost(0), loss: workerLoss{collateral: collateral}, failRuns: -1}
			e, logs := lossEngine(t, d)
			losses := func() int {
				d.mu.Lock()
				defer d.mu.Unlock()
				return d.runs
			}
			for losses() < 5 {
				if err := e.Invoke(context.Background(), "echo", &call.Request{Input: []byte("x")}); errdefs.KindOf(err) != errdefs.KindWorkerCrashed {
					t.Fatalf("after %d losses: %v, want the worker's crash", losses(), err)
				}
			}
			before := losses()
			err := e.Invoke(context.Background(), "echo", &call.Request{Input: []byte("x")})
			backedOff := errdefs.KindOf(err) == errdefs.KindUnavailable && strings.Contains(err.Error(), "backing off")
			if backedOff == collateral || backedOff != (losses() == before) {
				t.Fatalf("after %d losses: %v (%d runs more); want backing off: %v\n%s", before, err, losses()-before, !collateral, logs)
			}
		})
	}
}

// The tenant a load names: the deploying token's; without one, with an
// auth file naming tenants, the function's own (never lumped with other
// tokens' unrecorded versions into one worker), and the one unnamed tenant
// without an auth file.
func TestLoadsNameTheTenant(t *testing.T) {
	tests := []struct {
		name   string
		named  bool
		deploy string // the deploying token's name
		label  string // a model repository's version folder
		want   string
	}{
		{"a token's", true, "acme", "", "acme"},
		{"unrecorded, tokens", true, "", "", "(function echo)"},
		{"model repository, tokens", true, "", "1", "(model repository)"},
		{"no auth file", false, "", "", ""},
		{"model repository, no auth file", false, "", "1", ""},
		{"a token's, no auth file", false, "acme", "", "acme"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d := &lossDevice{Device: device.NewHost(0)}
			e := testkit.Engine(t, engine.Config{Devices: []device.Device{d}, NamedTenants: tc.named})
			b, _, _, err := bundle.PackBytes(testkit.BundleDir(t, testkit.Manifest("echo"), nil))
			if err != nil {
				t.Fatal(err)
			}
			if tc.label != "" {
				_, err = e.Control().DeployLabeled(context.Background(), "echo", tc.label, false, bytes.NewReader(b))
			} else {
				_, err = e.Control().DeployAs(context.Background(), "echo", tc.deploy, bytes.NewReader(b), false)
			}
			if err != nil {
				t.Fatal(err)
			}
			req := &call.Request{Input: []byte("hi")}
			if err := e.Invoke(context.Background(), "echo", req); err != nil {
				t.Fatal(err)
			}
			d.mu.Lock()
			defer d.mu.Unlock()
			if len(d.tenants) != 1 || d.tenants[0] != tc.want {
				t.Errorf("loads named tenants %q, want [%q]", d.tenants, tc.want)
			}
		})
	}
}

// An instance's creation given up at its deadline: where its worker was
// stopped for it (ErrDeadline), the program is dropped and the next
// request loads afresh; where the call never started (ErrNotStarted: its
// time ran out behind a sibling's call in a tenant's worker), the program
// is intact, and the next request makes its instance on it, no load.
func TestInstanceDeadlineDropsOnlyAStoppedProgram(t *testing.T) {
	for _, tt := range []struct {
		name      string
		err       error
		wantLoads int
	}{
		{"worker stopped", fmt.Errorf("%w while creating an instance", device.ErrDeadline), 2},
		{"never started", fmt.Errorf("%w, waiting for the worker's control channel", device.ErrNotStarted), 1},
	} {
		t.Run(tt.name, func(t *testing.T) {
			d := &lossDevice{Device: device.NewHost(0), failInstances: 1, instErr: tt.err}
			e, _ := lossEngine(t, d)
			req := &call.Request{Input: []byte("x")}
			if err := e.Invoke(context.Background(), "echo", req); errdefs.KindOf(err) != errdefs.KindTimeout {
				t.Fatalf("first invoke: %v, want a timeout", err)
			}
			req = &call.Request{Input: []byte("x")}
			if err := e.Invoke(context.Background(), "echo", req); err != nil {
				t.Fatalf("second invoke: %v", err)
			}
			d.mu.Lock()
			defer d.mu.Unlock()
			if d.loads != tt.wantLoads {
				t.Errorf("%d loads, want %d", d.loads, tt.wantLoads)
			}
		})
	}
}
