package engine_test

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/plover-run/plover/call"
	"github.com/plover-run/plover/engine"
	"github.com/plover-run/plover/internal/testkit"
)

// Control.Unready answers, from the table alone, what a pin of the
// version answers (Pin.Unready): nil until the version's library is
// refused at its first load, then the refusal; for a pipeline, any of its
// steps' (parallel ones and nested pipelines' included, a step pinned to
// a version by that version).
func TestControlUnreadyIsThePinsAnswer(t *testing.T) {
	ctx := context.Background()
	e := testkit.Engine(t, engine.Config{})
	good := testkit.Deploy(t, e, testkit.BundleDir(t, testkit.Manifest("good"), nil))
	bad := testkit.Deploy(t, e, testkit.UnloadableBundleDir(t, testkit.Manifest("bad")))
	inner := testkit.Deploy(t, e, testkit.PipelineDir(t, "inner", map[string]any{"parallel": []any{"good", map[string]any{"function": "bad", "version": bad.Version}}}))
	outer := testkit.Deploy(t, e, testkit.PipelineDir(t, "outer", "good", "inner"))
	only := testkit.Deploy(t, e, testkit.PipelineDir(t, "only", "good"))
	c := e.Control()
	check := func(when string, want map[string]bool) {
		t.Helper()
		for name, id := range map[string]string{"good": good.Version, "bad": bad.Version, "inner": inner.Version, "outer": outer.Version, "only": only.Version} {
			err := c.Unready(name, id)
			if (err != nil) != want[name] || err != nil && !strings.Contains(err.Error(), "libploverdep.so") {
				t.Errorf("%s: Unready(%s): %v, want unready %v", when, name, err, want[name])
			}
		}
		for _, name := range []string{"good", "bad"} { // a function's pin
			pin, err := e.Pin(ctx, name, time.Time{})
			if err != nil {
				t.Fatal(err)
			}
			if got := pin.Unready(time.Now()); (got != nil) != want[name] {
				t.Errorf("%s: %s's pin says %v", when, name, got)
			}
			pin.Release()
		}
	}
	check("before any load", nil)
	if err := e.Invoke(ctx, "bad", &call.Request{Input: []byte("x")}); err == nil {
		t.Fatal("a library that cannot load ran")
	}
	check("once bad's library was refused", map[string]bool{"bad": true, "inner": true, "outer": true})
	if err := c.Unready("nothing", "0123456789"); err != nil {
		t.Errorf("a function the node does not hold: %v", err)
	}
}

// Pipelines redeployed under others can make a tree of steps that grows as
// 32 to the power of its depth (each deploy checks only its own steps):
// Unready looks at each step once, as a request pins each once. It walked
// the whole tree, every index request and load: 2.9 s at 5 levels, 1 min
// 49 s at 6, about 30 hours at 8 (a review).
func TestUnreadyLooksAtEachStepOnce(t *testing.T) {
	ctx := context.Background()
	e := testkit.Engine(t, engine.Config{})
	testkit.Deploy(t, e, testkit.BundleDir(t, testkit.Manifest("good"), nil))
	bad := testkit.Deploy(t, e, testkit.UnloadableBundleDir(t, testkit.Manifest("bad")))
	if err := e.Invoke(ctx, "bad", &call.Request{Input: []byte("x")}); err == nil {
		t.Fatal("a library that cannot load ran")
	}
	const levels = 7
	name := func(i int) string { return "p" + strconv.Itoa(i) }
	for i := levels - 1; i >= 2; i-- { // a chain p2 -> p3 -> ... -> good
		next := name(i + 1)
		if i == levels-1 {
			next = "good"
		}
		testkit.Deploy(t, e, testkit.PipelineDir(t, name(i), next))
	}
	wide := func(step string) []any {
		s := make([]any, 32)
		for i := range s {
			s[i] = step
		}
		return s
	}
	top := testkit.Deploy(t, e, testkit.PipelineDir(t, name(1), wide(name(2))...))
	for i := 2; i < levels; i++ { // forced past the limits of the pipelines running it
		next := name(i + 1)
		if i == levels-1 {
			next = "good"
		}
		testkit.ForceDeploy(t, e, testkit.PipelineDir(t, name(i), wide(next)...))
	}
	unready := func() error {
		done := make(chan error, 1)
		go func() { done <- e.Control().Unready(name(1), top.Version) }()
		select {
		case err := <-done:
			return err
		case <-time.After(10 * time.Second): // the tree has 32^6 leaves; its distinct steps are 8
			t.Fatal("Unready still walking the tree of steps after 10 s")
			return nil
		}
	}
	if err := unready(); err != nil { // every step ready: the whole tree to look at
		t.Fatalf("Unready(p1) = %v, want nil", err)
	}
	steps := wide("good")
	steps[31] = map[string]any{"function": "bad", "version": bad.Version}
	testkit.Deploy(t, e, testkit.PipelineDir(t, name(levels-1), steps...))
	if err := unready(); err == nil || !strings.Contains(err.Error(), "libploverdep.so") {
		t.Fatalf("Unready(p1) = %v, want bad's refusal from the bottom of the tree", err)
	}
}
