package pipeline_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/plover-run/plover/call"
	"github.com/plover-run/plover/device"
	"github.com/plover-run/plover/engine"
	"github.com/plover-run/plover/internal/testkit"
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
}
