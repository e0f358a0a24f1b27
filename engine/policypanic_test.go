package engine_test

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/plover-run/plover/bundle"
	"github.com/plover-run/plover/call"
	"github.com/plover-run/plover/engine"
	"github.com/plover-run/plover/internal/testkit"
)

var reweighBug = testkit.RegisterPolicyBug("engine-test-buggy")

// A redeploy that changes a function's share sets its device flows under
// the table's lock (switchTo -> weighFlows -> Flow.Set -> the policy's
// Reweighed); a panic there is recovered by the transport that serves the
// deploy. Before the fix switchTo and Set unlocked without defer: the
// table's lock and the device scheduler's stayed held, and every later
// request, to any function, hung past its deadline (/healthz still OK).
func TestRedeployPolicyPanicLeavesEngineUsable(t *testing.T) {
	e := testkit.Engine(t, engine.Config{Sched: engine.SchedConfig{Policy: "engine-test-buggy"}})
	testkit.Deploy(t, e, testkit.BundleDir(t, testkit.Manifest("other"), nil))
	testkit.Deploy(t, e, testkit.BundleDir(t, testkit.Manifest("f"), nil))
	// f's flows exist once it ran: a share change reaches the policy.
	if err := e.Invoke(context.Background(), "f", &call.Request{Input: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	m := testkit.Manifest("f")
	m.Share = 4
	b, _, _, err := bundle.PackBytes(testkit.BundleDir(t, m, nil))
	if err != nil {
		t.Fatal(err)
	}
	reweighBug.Arm("Reweighed")
	func() {
		defer func() {
			if recover() == nil {
				t.Fatal("the redeploy did not panic")
			}
		}()
		e.Control().Deploy(context.Background(), "f", bytes.NewReader(b), false)
	}()
	if reweighBug.Armed() {
		t.Fatal("the redeploy panicked elsewhere than in Reweighed")
	}
	for _, name := range []string{"other", "f"} {
		done := make(chan error, 1)
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			done <- e.Invoke(ctx, name, &call.Request{Input: []byte("x")})
		}()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("%s's request after the panic: %v", name, err)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("%s's request (1 s deadline) still hangs after 5 s: a lock is held by the recovered panic", name)
		}
	}
}
