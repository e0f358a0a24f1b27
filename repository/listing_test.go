package repository

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// listNode's listing answers what lists says (nil: the fake node's) once
// release is closed, counting the calls.
type listNode struct {
	*fakeNode
	calls   atomic.Int32
	release chan struct{}
	lists   map[string]bool
}

func (n *listNode) Listed(ctx context.Context) (map[string]bool, error) {
	n.calls.Add(1)
	if n.release != nil {
		<-n.release
	}
	if n.lists != nil {
		return n.lists, nil
	}
	return n.fakeNode.Listed(ctx)
}

// servingA is a repository with model a deployed and serving (an index
// lists the store), over node.
func servingA(t *testing.T, node Node, cfg Config) *Repository {
	t.Helper()
	models := filepath.Join(t.TempDir(), "models")
	writeBundle(t, filepath.Join(models, "a"), "a", false)
	age(t, models)
	cfg.Dir, cfg.Poll, cfg.Settle = models, time.Hour, time.Millisecond
	r, _ := New(cfg, node)
	r.Scan(context.Background())
	return r
}

// Index answers asked together share one listing of the store: each made
// its own (N requests, N listings, each up to 2 s with a store hanging).
func TestIndexesShareOneListing(t *testing.T) {
	node := &listNode{fakeNode: newFakeNode()}
	r := servingA(t, node, Config{})
	node.release = make(chan struct{})
	const n = 5
	var wg sync.WaitGroup
	for range n {
		wg.Add(1)
		go func() { defer wg.Done(); r.Index(context.Background(), false) }()
	}
	// Every index is either listing or waiting for the listing on its way.
	deadline := time.Now().Add(10 * time.Second)
	for int(node.calls.Load())+sharing(r) < n && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	close(node.release)
	wg.Wait()
	if got := node.calls.Load(); got != 1 {
		t.Errorf("%d index answers made %d listings, want 1", n, got)
	}
}

// sharing is how many index answers wait for the listing on its way.
func sharing(r *Repository) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.flight == nil {
		return 0
	}
	return r.flight.sharing
}

// A listing that comes back without a function the store has (empty, or
// partial: a page lost) takes no model for deleted: a record read confirms
// each. It marked every model deleted, and kept that for restarts.
func TestPartialListingDeletesNothing(t *testing.T) {
	state := filepath.Join(t.TempDir(), "state.json")
	node := &listNode{fakeNode: newFakeNode(), lists: map[string]bool{}}
	r := servingA(t, node, Config{StateFile: state})
	if got := index(r); got != "a/1 READY; " {
		t.Errorf("after an empty listing: index %q, want a/1 READY", got)
	}
	if _, err := os.Stat(state); err == nil {
		b, _ := os.ReadFile(state)
		t.Errorf("state file written: %s", b)
	}
}

// An index that marks a model deleted does not wait for another's write of
// the state file (its fsyncs on a slow disk): the one writing writes again.
func TestIndexDoesNotWaitForAStateWrite(t *testing.T) {
	state := filepath.Join(t.TempDir(), "state.json")
	node := newFakeNode()
	r := servingA(t, node, Config{StateFile: state})
	node.Delete(context.Background(), "a", false) // plover rm
	r.saving.Lock()                               // a write on its way
	done := make(chan struct{})
	go func() { r.Index(context.Background(), false); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the index waited for a write of the state file")
	}
	r.saving.Unlock()
	r.saveKept() // as the writer's next round does
	if b, err := os.ReadFile(state); err != nil || !strings.Contains(string(b), `"a"`) {
		t.Errorf("state file %q (%v), want a unloaded", b, err)
	}
}
