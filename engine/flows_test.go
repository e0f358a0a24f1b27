package engine_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/call"
	"github.com/plover-run/plover/engine"
	"github.com/plover-run/plover/internal/testkit"
	"github.com/plover-run/plover/ioshare"
	"github.com/plover-run/plover/pipeline"
	"github.com/plover-run/plover/sched"
)

// The engine's use of the device schedulers: whose share and priority a
// function's flow has, and who pays for a pipeline's bytes.

// A function's device flow has its current version's share and priority.
// A version a pipeline step pins that is not current set the flow to its
// own when its program loaded (Engine.flow, called at every placement), so
// from then on the current version's runs were scheduled with the pinned
// one's share and class, on that device, until the current one loaded
// again. A rollback to the pinned version, loaded already (no placement),
// and a redeploy that changes the share take effect at once.
func TestPinnedVersionLeavesTheFlowsShare(t *testing.T) {
	e := testkit.Engine(t, engine.Config{})
	ctx := context.Background()
	m := testkit.Manifest("fn")
	m.Share, m.Priority = 1, "batch"
	v1 := testkit.Deploy(t, e, testkit.BundleDir(t, m, nil))
	m.Share, m.Priority = 5, "latency"
	m.Chain = append(m.Chain, m.Chain[0]) // another bundle: a second version
	testkit.Deploy(t, e, testkit.BundleDir(t, m, nil))
	if err := e.Invoke(ctx, "fn", &call.Request{Input: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	if w, c, ok := e.DeviceFlowShare("fn"); !ok || w != 5 || c != sched.Latency {
		t.Fatalf("after the current version ran: flow %v %v %v, want share 5, latency", w, c, ok)
	}
	p, err := e.PinVersion(ctx, "fn", v1.Version, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Invoke(ctx, &call.Request{Input: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	p.Release()
	// The current version's requests now run in the flow the pinned one set.
	if err := e.Invoke(ctx, "fn", &call.Request{Input: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	if w, c, _ := e.DeviceFlowShare("fn"); w != 5 || c != sched.Latency {
		t.Fatalf("fn's current version (share 5, latency) is scheduled at share %v, class %v: the pinned v1's", w, c)
	}
	if _, err := e.Control().Rollback(ctx, "fn", v1.Version); err != nil {
		t.Fatal(err)
	}
	if w, c, _ := e.DeviceFlowShare("fn"); w != 1 || c != sched.Batch {
		t.Errorf("after a rollback to v1 (share 1, batch, loaded as a pinned version): flow share %v, class %v", w, c)
	}
	m.Share, m.Priority = 3, "default"
	testkit.Deploy(t, e, testkit.BundleDir(t, m, nil))
	if w, c, _ := e.DeviceFlowShare("fn"); w != 3 || c != sched.Default {
		t.Errorf("after a redeploy at share 3, default: flow share %v, class %v", w, c)
	}
	if err := e.Invoke(ctx, "fn", &call.Request{Input: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	if w, c, _ := e.DeviceFlowShare("fn"); w != 3 || c != sched.Default {
		t.Errorf("after the redeployed version ran: flow share %v, class %v", w, c)
	}
}

// What the server's CPU spends on a function's bytes is charged to its
// flow on every device (README, "The server's own I/O"). A pipeline's
// bytes are counted under the pipeline's name, which has no device flow
// (its steps run as their functions): they were owed for ever, and no
// device share paid for them however large the bodies sent through it.
// Its first step's function pays, through a nested pipeline too.
func TestPipelineIOChargedToItsFirstStep(t *testing.T) {
	e := testkit.Engine(t, engine.Config{})
	testkit.Deploy(t, e, testkit.BundleDir(t, testkit.Manifest("step"), nil))
	pipelineDir := func(name string, steps ...string) string {
		dir := t.TempDir()
		b, _ := json.Marshal(map[string]any{"name": name, "kind": "pipeline", "steps": steps})
		if err := os.WriteFile(filepath.Join(dir, abi.ManifestFile), b, 0o644); err != nil {
			t.Fatal(err)
		}
		return dir
	}
	testkit.Deploy(t, e, pipelineDir("p", "step"))
	testkit.Deploy(t, e, pipelineDir("outer", "p", "step"))
	if e.ChargeIO(e.IO("p"), time.Millisecond) {
		t.Fatal("charged before the step ran: it has no device flow yet")
	}
	for _, name := range []string{"p", "outer"} {
		if err := pipeline.New(e, nil).Invoke(context.Background(), name, &call.Request{Input: []byte("x")}); err != nil {
			t.Fatal(err)
		}
		if e.IO(name) == nil {
			t.Fatalf("pipeline %s has no I/O flow: its bytes are not counted at all", name)
		}
	}
	if !e.ChargeIO(e.IO("step"), time.Millisecond) {
		t.Fatal("the step has no device flow after it ran")
	}
	for _, name := range []string{"p", "outer"} {
		if !e.ChargeIO(e.IO(name), time.Millisecond) {
			t.Errorf("pipeline %s's I/O time (io_seconds under its name) is charged to no device flow, after its first step ran", name)
		}
	}
}

// A request that found its function before a delete and a redeploy of the
// name, and asks for its I/O flow after them (its body still to read),
// gets its own function's flow, not the new one's: by name it took the new
// function's flow, gave it the deleted version's share and charged its
// pieces to it.
func TestLateRequestKeepsItsOwnFunctionsIOFlow(t *testing.T) {
	e := testkit.Engine(t, engine.Config{})
	m := testkit.Manifest("fn")
	m.Share = 1
	testkit.Deploy(t, e, testkit.BundleDir(t, m, nil))
	old := e.IO("fn")
	late := e.IOLater("fn") // the request finds fn here
	if err := e.Control().Delete(context.Background(), "fn", false); err != nil {
		t.Fatal(err)
	}
	m.Share = 5
	testkit.Deploy(t, e, testkit.BundleDir(t, m, nil))
	next := e.IO("fn") // the new function's first request
	if next == nil || next == old {
		t.Fatalf("the redeployed function's flow %p, the deleted one's %p: want a new one", next, old)
	}
	if got := late(); got == next {
		t.Fatal("a request of the deleted function got the redeployed function's I/O flow")
	}
}

// A piece's CPU time reaches the engine's charge after its function was
// deleted and deployed anew under its name, the new one run already: the
// piece passed ioshare's check of its flow (Forget) just before the delete
// landed, or the charge was on its way through the device schedulers as
// it did. It is the deleted function's, and charges no one: by name it
// charged the new function's device flow, giving it turns' worth of
// another function's bytes.
func TestDeletedFunctionsIOChargesNotTheNext(t *testing.T) {
	e := testkit.Engine(t, engine.Config{})
	ctx := context.Background()
	dir := testkit.BundleDir(t, testkit.Manifest("fn"), nil)
	testkit.Deploy(t, e, dir)
	if err := e.Invoke(ctx, "fn", &call.Request{Input: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	old := e.IO("fn")
	if !e.ChargeIO(old, time.Millisecond) {
		t.Fatal("fn's charge taken by no device flow after it ran")
	}
	if err := e.Control().Delete(ctx, "fn", false); err != nil {
		t.Fatal(err)
	}
	testkit.Deploy(t, e, dir)
	if err := e.Invoke(ctx, "fn", &call.Request{Input: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	next := e.IO("fn")
	if e.ChargeIO(old, time.Millisecond) {
		t.Error("the deleted function's I/O time was charged to the name's next function's device flow")
	}
	if !e.ChargeIO(next, time.Millisecond) {
		t.Error("the redeployed function's own charge was taken by no device flow")
	}
}

// Charges of the server's I/O land while the function is deleted and
// deployed again and again, its requests running between: run with -race,
// no charge races a delete, none blocks one (the charge takes the table's
// lock, which a delete holds as it forgets the flows), and each life's
// flow is charged only while it is the name's.
func TestIOChargesBesideDeletesAndRedeploys(t *testing.T) {
	e := testkit.Engine(t, engine.Config{})
	ctx := context.Background()
	dir := testkit.BundleDir(t, testkit.Manifest("fn"), nil)
	testkit.Deploy(t, e, dir)
	stop := make(chan struct{})
	done := make(chan int)
	go func() {
		n := 0
		for {
			select {
			case <-stop:
				done <- n
				return
			default:
			}
			if fl := e.IO("fn"); fl != nil && e.ChargeIO(fl, time.Microsecond) {
				n++
			}
		}
	}()
	var olds []*ioshare.Flow
	for range 20 {
		if err := e.Invoke(ctx, "fn", &call.Request{Input: []byte("x")}); err != nil {
			t.Fatal(err)
		}
		olds = append(olds, e.IO("fn"))
		if err := e.Control().Delete(ctx, "fn", false); err != nil {
			t.Fatal(err)
		}
		testkit.Deploy(t, e, dir)
	}
	close(stop)
	t.Logf("%d charges taken", <-done)
	if err := e.Invoke(ctx, "fn", &call.Request{Input: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	for i, old := range olds {
		if e.ChargeIO(old, time.Microsecond) {
			t.Errorf("life %d's flow was charged after its function was deleted", i)
		}
	}
	if !e.ChargeIO(e.IO("fn"), time.Microsecond) {
		t.Error("the last life's own charge was taken by no device flow")
	}
}
