package engine_test

import (
	"context"
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
