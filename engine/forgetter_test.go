package engine_test

import (
	"context"
	"path/filepath"
	"slices"
	"sync"
	"testing"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/engine"
	"github.com/plover-run/plover/internal/testkit"
	"github.com/plover-run/plover/objectstore"
)

// told is a Forgetter that notes what it is told.
type told struct {
	mu  sync.Mutex
	got []string
}

func (r *told) Met(name string)    { r.note("met " + name) }
func (r *told) Forget(name string) { r.note("forget " + name) }

func (r *told) note(s string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.got = append(r.got, s)
}

// take is what r was told since the last take.
func (r *told) take() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	got := r.got
	r.got = nil
	return got
}

// A node tells its Forgetters (the request metrics, a pipeline's step
// series) when a function's version changes on it, however the change
// came (a deploy here, a first request, a poll of another node's deploy or
// rollback), and when the function leaves it: a delete here, one another
// node made, seen through the store, a record deleted and made anew
// between two polls (the name's next life is met after).
func TestForgettersFollowTheNode(t *testing.T) {
	ctx := context.Background()
	fs, err := objectstore.NewFS(filepath.Join(t.TempDir(), "store"))
	if err != nil {
		t.Fatal(err)
	}
	a := testkit.Engine(t, engine.Config{Store: fs}) // where deploys are made
	b := testkit.Engine(t, engine.Config{Store: fs}) // the node watched
	var onA, onB told
	a.Forgets(&onA)
	b.Forgets(&onB)
	m := testkit.Manifest("fn")
	deploy := func(kernels ...string) {
		m.Chain = nil
		for _, k := range kernels {
			m.Chain = append(m.Chain, abi.Launch{Kernel: k, Grid: 1, Block: 1})
		}
		testkit.Deploy(t, a, testkit.BundleDir(t, m, nil))
	}
	del := func(e *engine.Engine) {
		if err := e.Control().Delete(ctx, "fn", false); err != nil {
			t.Fatal(err)
		}
	}
	poll := func() {
		if err := b.Refresh(ctx); err != nil {
			t.Fatal(err)
		}
	}
	for _, step := range []struct {
		what         string
		do           func()
		wantA, wantB []string
	}{
		{"a deploy, then b's first request", func() { deploy("echo"); invoke(t, b, "fn", []byte("x")) }, []string{"met fn"}, []string{"met fn"}},
		{"a redeploy, polled", func() { deploy("echo", "add_one"); poll() }, []string{"met fn"}, []string{"met fn"}},
		{"a delete elsewhere, polled", func() { del(a); poll() }, []string{"forget fn"}, []string{"forget fn"}},
		{"the name deployed again", func() { deploy("echo"); invoke(t, b, "fn", []byte("x")) }, []string{"met fn"}, []string{"met fn"}},
		{"deleted and made anew between two polls", func() { del(a); deploy("add_one"); poll() }, []string{"forget fn", "met fn"}, []string{"forget fn", "met fn"}},
		{"a delete on the node itself", func() { del(b) }, nil, []string{"forget fn"}},
	} {
		step.do()
		if got := onA.take(); !slices.Equal(got, step.wantA) {
			t.Errorf("%s: the deploying node was told %q, want %q", step.what, got, step.wantA)
		}
		if got := onB.take(); !slices.Equal(got, step.wantB) {
			t.Errorf("%s: the watching node was told %q, want %q", step.what, got, step.wantB)
		}
	}
}
