package repository

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// indexUntil asks r's index until want holds of it (an index may start a
// scan that runs on its own), or fails after 10 s.
func indexUntil(t *testing.T, r *Repository, want func(string) bool) string {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		got := index(r)
		if want(got) || time.Now().After(deadline) {
			return got
		}
		time.Sleep(time.Millisecond) // the next look at the index
	}
}

// Two replicas sharing a store, without --repository-poll (the default: no
// scan after start). A model unloaded on one (or deleted by plover rm) and
// then loaded on the other is served by both again: the first replica's
// index sees the function listed again with a version folder's label and
// loads it, and so does its restart over the unload it kept. It stayed
// unloaded for good (backElsewhere ran only at a scan, and at a restart
// before the kept unloads were applied), its reason saying plover rm.
func TestLoadedElsewhereWithoutPolling(t *testing.T) {
	ctx := context.Background()
	for _, c := range []struct {
		name   string
		unload func(t *testing.T, a, b *Repository, node *fakeNode)
	}{
		{"unloaded on the other replica", func(t *testing.T, _, b *Repository, _ *fakeNode) {
			if err := b.Unload(ctx, "cnn"); err != nil {
				t.Fatal(err)
			}
		}},
		{"unloaded here", func(t *testing.T, a, _ *Repository, _ *fakeNode) {
			if err := a.Unload(ctx, "cnn"); err != nil {
				t.Fatal(err)
			}
		}},
		{"plover rm", func(t *testing.T, _, _ *Repository, node *fakeNode) { node.Delete(ctx, "cnn", false) }},
	} {
		t.Run(c.name, func(t *testing.T) {
			models := filepath.Join(t.TempDir(), "models")
			writeBundle(t, filepath.Join(models, "cnn", "1"), "cnn", false)
			age(t, models)
			node := newFakeNode()
			cfg := Config{Dir: models, Settle: time.Millisecond, StateFile: filepath.Join(t.TempDir(), "state.json")}
			a, _ := New(cfg, node)
			b, _ := New(Config{Dir: models, Settle: time.Millisecond}, node)
			runStarted(t, a)
			runStarted(t, b)
			c.unload(t, a, b, node)
			if got := index(a); !strings.Contains(got, "UNAVAILABLE") {
				t.Fatalf("after the unload: %q", got)
			}
			if got := index(a); strings.Contains(got, "(plover rm)") {
				t.Errorf("the reason names plover rm alone: %q", got)
			}
			restarted, _ := New(cfg, node) // over the unload a kept
			if err := b.Load(ctx, "cnn"); err != nil {
				t.Fatal(err)
			}
			ready := func(s string) bool { return s == "cnn/1 READY; " }
			if got := indexUntil(t, a, ready); !ready(got) {
				t.Errorf("after the load elsewhere: index %q, want cnn/1 READY", got)
			}
			runStarted(t, restarted)
			if got := index(restarted); !ready(got) {
				t.Errorf("restarted after the load elsewhere: index %q, want cnn/1 READY", got)
			}
		})
	}
}
