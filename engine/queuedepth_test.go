package engine_test

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/plover-run/plover/call"
	"github.com/plover-run/plover/engine"
	"github.com/plover-run/plover/internal/testkit"
)

// queueDepth is plover_queue_depth for fn in reg.
func queueDepth(t *testing.T, reg *prometheus.Registry, fn string) float64 {
	t.Helper()
	m := functionMetric(t, reg, "plover_queue_depth", fn)
	if m == nil {
		t.Fatalf("no plover_queue_depth for %s", fn)
	}
	return m.GetGauge().GetValue()
}

// A function's versions share its flow on a device's scheduler: with a
// version a pipeline pinned loaded beside the current one, the requests
// waiting for the device were counted once per version (plover ls's
// queue and plover_queue_depth twice what waited), whichever version they
// were for.
func TestQueueDepthCountsEachWaitingRunOnce(t *testing.T) {
	// The hog's run holds the device (one run at a time) while fn's
	// requests wait; its mark says it is on the device, not about to be.
	mark := filepath.Join(t.TempDir(), "ran")
	hogDir := batchBundle(t, testkit.BatchManifest("hog", 4, ""), `-DRUN_MARK="`+mark+`"`)
	m := testkit.Manifest("fn")
	m.MaxInstances = 4
	v1Dir := testkit.BundleDir(t, m, nil)
	m.Chain = append(m.Chain, m.Chain[0]) // another bundle: a second version
	v2Dir := testkit.BundleDir(t, m, nil)
	for _, tt := range []struct {
		name             string
		pinned           bool // v1, pinned, loaded beside v2, the current one
		onPinned, onCurr int  // requests waiting for the device on each
	}{
		{"current only", false, 0, 2},
		{"pinned loaded, current's waiting", true, 0, 2},
		{"pinned loaded, pinned's waiting", true, 2, 0},
		{"both waiting", true, 1, 1},
	} {
		t.Run(tt.name, func(t *testing.T) {
			e := testkit.Engine(t, engine.Config{Sched: engine.SchedConfig{MaxRuns: 1, NoReserve: true}})
			reg := prometheus.NewPedanticRegistry()
			reg.MustRegister(e.Collector())
			ctx := context.Background()
			testkit.Deploy(t, e, hogDir)
			v1 := testkit.Deploy(t, e, v1Dir)
			testkit.Deploy(t, e, v2Dir)
			pin := func() engine.Pin {
				p, err := e.PinVersion(ctx, "fn", v1.Version, time.Time{})
				if err != nil {
					t.Fatal(err)
				}
				return p
			}
			if tt.pinned {
				p := pin()
				err := p.Invoke(ctx, &call.Request{Input: []byte{1}}) // loads v1
				p.Release()
				if err != nil {
					t.Fatal(err)
				}
			}
			if err := e.Invoke(ctx, "fn", &call.Request{Input: []byte{1}}); err != nil { // loads v2
				t.Fatal(err)
			}

			if err := os.Remove(mark); err != nil && !errors.Is(err, fs.ErrNotExist) {
				t.Fatal(err)
			}
			hog := invokeAsync(e, "hog", item(1, 2000), time.Time{}) // long enough for fn's requests to queue on a busy machine
			for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
				if _, err := os.Stat(mark); err == nil {
					break
				}
				if time.Now().After(deadline) {
					t.Fatal("the hog never ran")
				}
			}
			n := tt.onPinned + tt.onCurr
			done := make(chan error, n)
			for range tt.onPinned {
				p := pin()
				go func() {
					defer p.Release()
					done <- p.Invoke(ctx, &call.Request{Input: []byte{1}})
				}()
			}
			for range tt.onCurr {
				go func() { done <- e.Invoke(ctx, "fn", &call.Request{Input: []byte{1}}) }()
			}
			// The scheduler's own count, each run once.
			for deadline := time.Now().Add(10 * time.Second); e.DeviceFlowWaiting("fn") != n; time.Sleep(time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatalf("%d runs waiting in fn's flow, want %d", e.DeviceFlowWaiting("fn"), n)
				}
			}
			fi := info(t, e, "fn")
			got := fmt.Sprintf("queue %d, plover_queue_depth %v", fi.Queue, queueDepth(t, reg, "fn"))
			if want := fmt.Sprintf("queue %d, plover_queue_depth %d", n, n); got != want {
				t.Errorf("%s, want %s: the runs waiting for the device, each once", got, want)
			}
			if r := <-hog; r.err != nil {
				t.Fatal(r.err)
			}
			for range n {
				if err := <-done; err != nil {
					t.Fatal(err)
				}
			}
		})
	}
}
