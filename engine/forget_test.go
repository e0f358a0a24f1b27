package engine

import (
	"testing"
	"time"

	"github.com/plover-run/plover/api"
	"github.com/plover-run/plover/funclog"
	"github.com/plover-run/plover/registry"
)

// A function forgotten on this node (deleted here, or found deleted by a
// refresh) loses its kept output, and what its workers still print (a
// request in flight finishing) is dropped, not kept for whoever deploys
// the name next; the next life's workers are heard. A refresh whose epoch
// moved on forgets nothing.
func TestForgetEndsTheOutputsLife(t *testing.T) {
	logs := funclog.New(nil)
	tab := newTable(registry.Registry{}, logs, 0, 0)
	for _, n := range []string{"f", "g"} {
		tab.funcs[n] = &function{name: n, out: logs.Sink(n)}
	}
	line := func(s string) api.LogLine { return api.LogLine{Time: time.Now(), Stream: "stdout", Line: s} }
	oldF, oldG := tab.funcs["f"].output(), tab.funcs["g"].output()
	oldF.Add(line("f before"))
	oldG.Add(line("g before"))

	tab.forget("f", 0)
	tab.forget("g", 7) // a refresh that read epoch 7: stale
	oldF.Add(line("f's worker, after the delete"))
	oldG.Add(line("g after"))
	if got := logs.Lines("f", time.Time{}); len(got) != 0 {
		t.Fatalf("f's lines after its delete: %+v", got)
	}
	if got := logs.Lines("g", time.Time{}); len(got) != 2 {
		t.Fatalf("g (not forgotten) kept %d lines, want 2", len(got))
	}
	logs.Sink("f").Add(line("f redeployed")) // the next life: a new function's sink
	oldF.Add(line("the old worker again"))
	if got := logs.Lines("f", time.Time{}); len(got) != 1 || got[0].Line != "f redeployed" {
		t.Fatalf("f's lines after a redeploy: %+v", got)
	}
}
