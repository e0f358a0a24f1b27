package engine_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/plover-run/plover/call"
	"github.com/plover-run/plover/device"
	"github.com/plover-run/plover/engine"
	"github.com/plover-run/plover/errdefs"
	"github.com/plover-run/plover/internal/testkit"
)

// faulty is a device whose Health fails once fault is set: a request then
// finds the idle instance its first request left and cannot have it.
type faulty struct {
	device.Device
	fault atomic.Bool
}

func (d *faulty) Health() error {
	if d.fault.Load() {
		return errors.New("a fault after the first request")
	}
	return d.Device.Health()
}

// A request whose run never reached an instance (here its device faulted
// before the instance could be taken) fails 503 and is no start: a
// batching function's counted one (hot, and a run of one in
// plover_batch_size), although nothing of it ran, where an unbatched
// function's request failing the same way counts none.
func TestARequestThatNeverRanIsNoStart(t *testing.T) {
	for _, tt := range []struct {
		name   string
		bundle func(t *testing.T) string
		input  []byte
	}{
		{"unbatched", func(t *testing.T) string { return testkit.BundleDir(t, testkit.Manifest("fn"), nil) }, []byte{1}},
		{"batched", func(t *testing.T) string { return batchBundle(t, testkit.BatchManifest("fn", 4, "")) }, item(1, 0)},
	} {
		t.Run(tt.name, func(t *testing.T) {
			dev := &faulty{Device: device.NewHost(0)}
			e := testkit.Engine(t, engine.Config{Devices: []device.Device{dev}})
			reg := prometheus.NewPedanticRegistry()
			reg.MustRegister(e.Collector())
			testkit.Deploy(t, e, tt.bundle(t))
			if err := e.Invoke(context.Background(), "fn", &call.Request{Input: tt.input}); err != nil {
				t.Fatalf("the first request: %v", err)
			}
			starts := func() int64 {
				fi := info(t, e, "fn")
				return fi.Cold + fi.Warm + fi.Hot
			}
			if n := starts(); n != 1 {
				t.Fatalf("after one request that ran: %d starts", n)
			}
			runs, _, _ := batchSizeCount(t, reg, "fn")

			dev.fault.Store(true)
			req := &call.Request{Input: tt.input, Deadline: time.Now().Add(10 * time.Second)}
			if err := e.Invoke(context.Background(), "fn", req); errdefs.KindOf(err) != errdefs.KindUnavailable {
				t.Fatalf("a request on the faulted device: %v, want unavailable", err)
			}
			if n := starts(); n != 1 {
				t.Errorf("a request that never reached an instance counted as a start: %d starts, want 1", n)
			}
			if n, _, _ := batchSizeCount(t, reg, "fn"); n != runs {
				t.Errorf("plover_batch_size counts %d runs, want %d: a batch that never ran counted", n, runs)
			}
			if req.BatchSize != 0 {
				t.Errorf("BatchSize %d for a request whose batch never ran, want 0", req.BatchSize)
			}
		})
	}
}
