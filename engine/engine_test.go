package engine_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
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

func invoke(t *testing.T, e *engine.Engine, name string, in []byte) *call.Request {
	t.Helper()
	req := &call.Request{Input: in}
	if err := e.Invoke(context.Background(), name, req); err != nil {
		t.Fatalf("invoke %s: %v", name, err)
	}
	return req
}

func TestStartKinds(t *testing.T) {
	e := testkit.Engine(t, engine.Config{})
	m := testkit.Manifest("echo")
	m.Chain = append(m.Chain, abi.Launch{Kernel: "sleep_ms", Grid: 50, Block: 1})
	testkit.Deploy(t, e, testkit.BundleDir(t, m, nil))

	if r := invoke(t, e, "echo", []byte("a")); r.Start != call.Cold || r.Timing.Load <= 0 {
		t.Fatalf("first request: start %v load %v, want cold with load time", r.Start, r.Timing.Load)
	}
	if r := invoke(t, e, "echo", []byte("b")); r.Start != call.Hot || r.Timing.Load != 0 {
		t.Fatalf("second request: start %v load %v, want hot", r.Start, r.Timing.Load)
	}
	// Two at once: one reuses the idle instance, the other creates one.
	var wg sync.WaitGroup
	starts := make([]call.Start, 2)
	for i := range starts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			starts[i] = invoke(t, e, "echo", []byte("c")).Start
		}()
	}
	wg.Wait()
	if !(starts[0] == call.Hot && starts[1] == call.Warm || starts[0] == call.Warm && starts[1] == call.Hot) {
		t.Fatalf("concurrent starts = %v, want one hot and one warm", starts)
	}
	fi, err := e.Control().Function(context.Background(), "echo")
	if err != nil {
		t.Fatal(err)
	}
	if fi.Cold != 1 || fi.Hot != 2 || fi.Warm != 1 || fi.Idle != 2 || fi.Busy != 0 || !fi.Loaded {
		t.Fatalf("function info %+v", fi)
	}
}

func TestZeroTmp(t *testing.T) {
	for _, zero := range []bool{true, false} {
		e := testkit.Engine(t, engine.Config{MaxInstances: 1})
		m := testkit.Manifest("count")
		m.ZeroTmp = zero
		m.Chain = []abi.Launch{{Kernel: "count", Grid: 1, Block: 1}}
		testkit.Deploy(t, e, testkit.BundleDir(t, m, nil))
		for i := uint64(1); i <= 3; i++ {
			got := binary.LittleEndian.Uint64(invoke(t, e, "count", nil).Output)
			want := i
			if zero {
				want = 1
			}
			if got != want {
				t.Fatalf("zero_tmp=%v request %d: count %d, want %d", zero, i, got, want)
			}
		}
	}
}

func TestConstantsAndOverrides(t *testing.T) {
	e := testkit.Engine(t, engine.Config{})
	m := testkit.Manifest("addc")
	m.Constants = "c.bin"
	m.Chain = []abi.Launch{{Kernel: "add_constants", Grid: 1, Block: 1}}
	testkit.Deploy(t, e, testkit.BundleDir(t, m, bytes.Repeat([]byte{10}, 256)))
	out := invoke(t, e, "addc", []byte{1, 2, 3}).Output
	if len(out) != int(m.OutBytes) || !bytes.Equal(out[:3], []byte{11, 12, 13}) {
		t.Fatalf("add_constants output %v", out[:4])
	}
	tests := []struct {
		name string
		o    call.Override
		want []byte // prefix of output; nil = expect KindInvalid
		n    int
	}{
		{"chain", call.Override{Chain: []abi.Launch{{Kernel: "echo", Grid: 1, Block: 8}, {Kernel: "add_one", Grid: 1, Block: 1}}, OutBytes: -1, TmpBytes: -1}, []byte{2, 3, 4, 1}, 256},
		{"smaller out", call.Override{OutBytes: 2, TmpBytes: -1}, []byte{11, 12}, 2},
		{"unknown kernel", call.Override{Chain: []abi.Launch{{Kernel: "nope", Grid: 1, Block: 1}}, OutBytes: -1, TmpBytes: -1}, nil, 0},
		{"libc symbol", call.Override{Chain: []abi.Launch{{Kernel: "system", Grid: 1, Block: 1}}, OutBytes: -1, TmpBytes: -1}, nil, 0},
		{"out over manifest", call.Override{OutBytes: 257, TmpBytes: -1}, nil, 0},
		{"tmp over manifest", call.Override{OutBytes: -1, TmpBytes: 65}, nil, 0},
		{"bad block", call.Override{Chain: []abi.Launch{{Kernel: "echo", Grid: 1, Block: 0}}, OutBytes: -1, TmpBytes: -1}, nil, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := tt.o
			req := &call.Request{Input: []byte{1, 2, 3}, Override: &o}
			err := e.Invoke(context.Background(), "addc", req)
			if tt.want == nil {
				if errdefs.KindOf(err) != errdefs.KindInvalid {
					t.Fatalf("want KindInvalid, got %v", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(req.Output) != tt.n || !bytes.HasPrefix(req.Output, tt.want) {
				t.Fatalf("output %v (len %d), want prefix %v len %d", req.Output[:min(4, len(req.Output))], len(req.Output), tt.want, tt.n)
			}
		})
	}
}

func TestErrorsKinds(t *testing.T) {
	e := testkit.Engine(t, engine.Config{})
	m := testkit.Manifest("failing")
	m.Chain = []abi.Launch{{Kernel: "echo", Grid: 1, Block: 1}, {Kernel: "fail", Grid: 1, Block: 1}}
	testkit.Deploy(t, e, testkit.BundleDir(t, m, nil))
	ctx := context.Background()

	err := e.Invoke(ctx, "failing", &call.Request{Input: []byte("x")})
	var ke *device.KernelError
	if errdefs.KindOf(err) != errdefs.KindKernel || !errors.As(err, &ke) || ke.Msg != "fail kernel was asked to fail" {
		t.Fatalf("failing kernel: %v", err)
	}
	if n := strings.Count(err.Error(), "asked to fail"); n != 1 {
		t.Fatalf("error text names the cause %d times: %q", n, err)
	}
	// The instance stays usable and the error does not stick to it.
	ok := &call.Request{Input: []byte("y"), Override: &call.Override{Chain: []abi.Launch{{Kernel: "echo", Grid: 1, Block: 1}}, OutBytes: 1, TmpBytes: -1}}
	if err := e.Invoke(ctx, "failing", ok); err != nil || string(ok.Output) != "y" || ok.Start != call.Hot {
		t.Fatalf("after a failure: %v %q %v", err, ok.Output, ok.Start)
	}
	if err := e.Invoke(ctx, "nope", &call.Request{}); errdefs.KindOf(err) != errdefs.KindNotFound {
		t.Fatalf("unknown function: %v", err)
	}
	if err := e.Invoke(ctx, "../etc", &call.Request{}); errdefs.KindOf(err) != errdefs.KindNotFound {
		t.Fatalf("invalid name: %v", err)
	}
	big := make([]byte, testkit.Manifest("x").MaxInputBytes+1)
	if err := e.Invoke(ctx, "failing", &call.Request{Input: big}); errdefs.KindOf(err) != errdefs.KindTooLarge {
		t.Fatalf("input over max: %v", err)
	}
}

func TestRedeployFinishesInFlightOnOldVersion(t *testing.T) {
	host := device.NewHost(0)
	e := testkit.Engine(t, engine.Config{Devices: []device.Device{host}})
	m := testkit.Slow("fn", 700)
	v1 := testkit.Deploy(t, e, testkit.BundleDir(t, m, nil))

	done := make(chan *call.Request)
	go func() {
		req := &call.Request{Input: []byte{5}}
		if err := e.Invoke(context.Background(), "fn", req); err != nil {
			t.Error(err)
		}
		done <- req
	}()
	testkit.WaitFor(t, e, "fn", "the request running on v1", testkit.Busy(1, 0))
	m.Chain = []abi.Launch{{Kernel: "echo", Grid: 1, Block: 8}, {Kernel: "add_one", Grid: 1, Block: 1}}
	v2 := testkit.Deploy(t, e, testkit.BundleDir(t, m, nil))

	r2 := invoke(t, e, "fn", []byte{5})
	if r2.Version != v2.Version || r2.Output[0] != 6 {
		t.Fatalf("after redeploy: version %s output %d, want %s and 6", r2.Version, r2.Output[0], v2.Version)
	}
	r1 := <-done
	if r1.Version != v1.Version || r1.Output[0] != 5 {
		t.Fatalf("in-flight request: version %s output %d, want %s and 5", r1.Version, r1.Output[0], v1.Version)
	}
	// v1 is torn down: only v2's one instance holds device memory now.
	want := m.MaxInputBytes + m.TmpBytes + m.OutBytes
	if used := host.MemInfo().Used; used != want {
		t.Fatalf("device memory used %d, want %d (v1 not released?)", used, want)
	}
	if err := e.Control().Delete(context.Background(), "fn", false); err != nil {
		t.Fatal(err)
	}
	if used := host.MemInfo().Used; used != 0 {
		t.Fatalf("device memory used %d after delete, want 0", used)
	}
	if err := e.Invoke(context.Background(), "fn", &call.Request{}); errdefs.KindOf(err) != errdefs.KindNotFound {
		t.Fatalf("after delete: %v", err)
	}
}

func TestDeployRefusals(t *testing.T) {
	e := testkit.Engine(t, engine.Config{})
	ctx := context.Background()
	good := testkit.BundleDir(t, testkit.Manifest("fn"), nil)
	tests := []struct {
		name   string
		deploy string // name deployed under
		edit   func(m *abi.Manifest)
		want   errdefs.Kind
	}{
		{"name mismatch", "other", nil, errdefs.KindInvalid},
		{"missing kernel", "fn", func(m *abi.Manifest) { m.Chain[0].Kernel = "nope" }, errdefs.KindInvalid},
		{"cuda target on host", "fn", func(m *abi.Manifest) { m.Target = abi.TargetCUDA }, errdefs.KindInvalid},
		{"bad name", "Bad_Name", nil, errdefs.KindBadRequest},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := good
			if tt.edit != nil {
				m := testkit.Manifest("fn")
				tt.edit(m)
				dir = testkit.BundleDir(t, m, nil)
			}
			b, _, _, err := bundle.PackBytes(dir)
			if err != nil {
				t.Fatal(err)
			}
			_, err = e.Control().Deploy(ctx, tt.deploy, bytes.NewReader(b), false)
			if errdefs.KindOf(err) != tt.want {
				t.Fatalf("Deploy: %v (kind %v), want kind %v", err, errdefs.KindOf(err), tt.want)
			}
		})
	}
	if _, err := e.Control().Deploy(ctx, "fn", bytes.NewReader([]byte("garbage")), false); errdefs.KindOf(err) != errdefs.KindInvalid {
		t.Fatalf("garbage bundle: %v", err)
	}
	if fs, err := e.Control().Functions(ctx); err != nil || len(fs) != 0 {
		t.Fatalf("refused deploys left functions behind: %v %v", fs, err)
	}
}
