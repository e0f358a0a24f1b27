package repository

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/bundle"
)

// A scan packs only the version folders that changed: a version copied
// into a model of three packs that one (every version was packed again,
// each followed by a look at the whole model's folder), one changed in
// place packs again and is deployed again under its label, and a restart
// (nothing remembered) packs each once to find its bytes deployed.
func TestAScanPacksOnlyTheVersionsThatChanged(t *testing.T) {
	var mu sync.Mutex
	var packed []string
	repackWithin = func(dir, name string, w io.Writer) (*abi.Manifest, error) {
		mu.Lock()
		packed = append(packed, filepath.Base(dir))
		mu.Unlock()
		return bundle.RepackWithin(dir, name, w)
	}
	t.Cleanup(func() { repackWithin = bundle.RepackWithin })
	took := func() []string {
		mu.Lock()
		defer mu.Unlock()
		out := slices.Sorted(slices.Values(packed))
		packed = nil
		return out
	}
	models := filepath.Join(t.TempDir(), "models")
	for _, v := range []string{"1", "2", "3"} {
		writeBundle(t, filepath.Join(models, "vecadd", v), "vecadd", false)
	}
	age(t, models)
	node := newFakeNode()
	cfg := Config{Dir: models, Poll: time.Hour, Settle: 20 * time.Millisecond}
	r, err := New(cfg, node)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	r.Scan(ctx)
	if got := took(); !slices.Equal(got, []string{"1", "2", "3"}) || node.current("vecadd") != "3" {
		t.Fatalf("first scan packed %v, current %q; want 1 2 3, 3", got, node.current("vecadd"))
	}
	for _, step := range []struct {
		what    string
		change  func()
		packs   []string
		current string
		deploys int
	}{
		{"a version copied in", func() { writeBundle(t, filepath.Join(models, "vecadd", "4"), "vecadd", true) }, []string{"4"}, "4", 1},
		{"a version changed in place", func() {
			os.WriteFile(filepath.Join(models, "vecadd", "2", "b.bin"), []byte("other constants"), 0o644)
		}, []string{"2"}, "4", 1},
		{"nothing changed", func() {}, nil, "4", 0},
	} {
		deploys := node.deploys
		step.change()
		// Written now: the first scan sees it settling, a later one
		// deploys it.
		for range 2 {
			r.Scan(ctx)
			time.Sleep(2 * cfg.Settle)
		}
		waitFor(t, r, 4, step.what, func() bool { return node.deploys-deploys >= step.deploys })
		if got := took(); !slices.Equal(got, step.packs) {
			t.Errorf("%s: packed %v, want %v", step.what, got, step.packs)
		}
		if node.current("vecadd") != step.current || node.deploys-deploys != step.deploys {
			t.Errorf("%s: current %q after %d deploys, want %q after %d", step.what, node.current("vecadd"), node.deploys-deploys, step.current, step.deploys)
		}
	}

	// A new Repository (a restart) remembers nothing: it packs each
	// version once, finds its bytes deployed, and deploys none.
	deploys := node.deploys
	r2, err := New(cfg, node)
	if err != nil {
		t.Fatal(err)
	}
	r2.Scan(ctx)
	if got := took(); !slices.Equal(got, []string{"1", "2", "3", "4"}) || node.deploys != deploys {
		t.Errorf("after a restart: packed %v and deployed %d, want 1 2 3 4 and none", got, node.deploys-deploys)
	}
}
