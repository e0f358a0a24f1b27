package repository

// Run without Poll after start: what wakes it (a failed write of the state
// file, an index seeing a model back) and what it does then, and what it
// waits for before returning.

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// A state file that cannot be written, no poll: Run tried it again by
// scanning, on the back-off until a write succeeded, and each scan
// deleted the function of a folder removed meanwhile (README: without
// polling the folder is scanned once at start).
func TestStateRetryDoesNotScan(t *testing.T) {
	d := t.TempDir()
	models := filepath.Join(d, "models")
	writeBundle(t, filepath.Join(models, "cnn", "1"), "cnn", false)
	writeBundle(t, filepath.Join(models, "old", "1"), "old", false)
	age(t, models)
	node := newFakeNode()
	state := filepath.Join(d, "data", "state.json") // data/ not there yet
	r, _ := New(Config{Dir: models, Settle: 10 * time.Millisecond, StateFile: state}, node)
	runStarted(t, r)
	n := scansOf(r)
	if err := r.Unload(context.Background(), "cnn"); err != nil {
		t.Fatal(err)
	}
	os.RemoveAll(filepath.Join(models, "old"))
	os.Mkdir(filepath.Join(d, "data"), 0o700)
	keptWithin(t, state, "cnn")
	node.mu.Lock()
	defer node.mu.Unlock()
	if node.recs["old"] == nil || scansOf(r) != n {
		t.Errorf("the write's retries scanned %d times and deleted %v (old's function gone: %v)", scansOf(r)-n, node.deletes, node.recs["old"] == nil)
	}
}

// An unload whose write failed, then a load of the same model: nothing
// is left to write, yet Run tried again for good (unsaved stayed set).
func TestUndoneUnsavedChangeEndsTheRetries(t *testing.T) {
	d := t.TempDir()
	models := filepath.Join(d, "models")
	writeBundle(t, filepath.Join(models, "cnn", "1"), "cnn", false)
	age(t, models)
	state := filepath.Join(d, "data", "state.json") // cannot be written
	r, _ := New(Config{Dir: models, Settle: time.Millisecond, StateFile: state}, newFakeNode())
	runStarted(t, r)
	ctx := context.Background()
	if err := r.Unload(ctx, "cnn"); err != nil {
		t.Fatal(err)
	}
	if err := r.Load(ctx, "cnn"); err != nil {
		t.Fatal(err)
	}
	if !idleWithin(r, 5*time.Second) {
		t.Errorf("nothing to write, yet Run still tries again 5 s on (unsaved %v)", r.unsaved.Load())
	}
}

// A scan's record read finding the function absent (deleted between the
// scan's listing and the read: an unload then a load on B, Triton's
// reload) took it for deployed otherwise, and A ignored B's load for a
// minute.
func TestNotFoundIsNotDeployedOtherwise(t *testing.T) {
	a, b, _, node := twoNodes(t)
	ctx := context.Background()
	if err := b.Load(ctx, "cnn"); err != nil {
		t.Fatal(err)
	}
	var calls atomic.Int32
	node.mu.Lock()
	node.onList = func() {
		if calls.Add(1) == 2 { // the scan's listing: B unloads cnn right after
			node.Delete(ctx, "cnn", false)
		}
	}
	node.mu.Unlock()
	n := scansOf(a)
	index(a) // lists cnn back: a scan
	scannedAfter(t, a, n)
	node.mu.Lock()
	node.onList = nil
	node.mu.Unlock()
	if err := b.Load(ctx, "cnn"); err != nil {
		t.Fatal(err)
	}
	want := func(s string) bool { return strings.Contains(s, "cnn/1 READY") }
	if got := indexUntil(t, a, want); !want(got) {
		t.Errorf("A's index 10 s after B's load: %q", got)
	}
}

// deadlineListNode's listing answers only as its context ends (a slow
// store), without the models deleted.
type deadlineListNode struct {
	*fakeNode
	hold    atomic.Bool
	started chan struct{}
}

func (n *deadlineListNode) Listed(ctx context.Context) (map[string]bool, error) {
	if !n.hold.Load() {
		return n.fakeNode.Listed(ctx)
	}
	close(n.started)
	<-ctx.Done()
	return n.fakeNode.Listed(context.Background())
}

// An index's listing marks a model deleted (plover rm) as the server
// shuts down: Run returned before the state file was written, and the
// restart deployed the model again.
func TestRunWaitsForAnIndexsWrite(t *testing.T) {
	d := t.TempDir()
	models := filepath.Join(d, "models")
	writeBundle(t, filepath.Join(models, "a", "1"), "a", false)
	age(t, models)
	node := &deadlineListNode{fakeNode: newFakeNode(), started: make(chan struct{})}
	state := filepath.Join(d, "state.json")
	r, _ := New(Config{Dir: models, Settle: time.Millisecond, StateFile: state}, node)
	cancel, done := runRepo(r)
	<-r.Started()
	node.Delete(context.Background(), "a", false) // plover rm
	node.hold.Store(true)
	ctx, leave := context.WithCancel(context.Background())
	go r.Index(ctx, false)
	<-node.started
	leave() // the index's client went; its listing goes on
	cancel()
	<-done
	if b, err := os.ReadFile(state); err != nil || !strings.Contains(string(b), `"a"`) {
		t.Errorf("Run returned before the state file kept a's deletion: %q, %v", b, err)
	}
}

// A failed write woke an idle Run before setting unsaved: Run, looking
// at it in between, saw nothing to write and went idle, and no later
// failure woke it again (unsaved already set): the unload was never kept.
func TestFailedWriteWakeIsNotLost(t *testing.T) {
	d := t.TempDir()
	models := filepath.Join(d, "models")
	writeBundle(t, filepath.Join(models, "cnn", "1"), "cnn", false)
	age(t, models)
	state := filepath.Join(d, "data", "state.json") // data/ not there yet
	r, _ := New(Config{Dir: models, Settle: time.Millisecond, StateFile: state}, newFakeNode())
	r.wake = func() {
		n := r.waits.Load()
		r.wakeSave()
		// Run has taken the wake-up and decided its next wait.
		for r.waits.Load() == n {
			time.Sleep(time.Millisecond)
		}
	}
	runStarted(t, r)
	if !idleWithin(r, 10*time.Second) {
		t.Fatal("Run not idle 10 s after start")
	}
	if err := r.Unload(context.Background(), "cnn"); err != nil {
		t.Fatal(err)
	}
	os.Mkdir(filepath.Join(d, "data"), 0o700)
	keptWithin(t, state, "cnn")
}

// DIR unreadable at the first scan (a volume not mounted yet): Run took
// the scan that read nothing for one that found nothing settling, and the
// server said ready with an empty index.
func TestNotStartedUntilDirIsRead(t *testing.T) {
	models := filepath.Join(t.TempDir(), "models")
	os.Mkdir(models, 0o755)
	node := newFakeNode()
	r, err := New(Config{Dir: models, Settle: time.Millisecond}, node)
	if err != nil {
		t.Fatal(err)
	}
	os.Remove(models) // gone after the start's check
	cancel, done := runRepo(r)
	defer func() { cancel(); <-done }()
	for r.waits.Load() == 0 { // the first scan ended, and Run decided
		time.Sleep(time.Millisecond)
	}
	select {
	case <-r.Started():
		t.Fatal("started before DIR could be read")
	default:
	}
	// Written aside and renamed in: Run looks every millisecond, and a
	// folder half-written when DIR came back would be its first scan's.
	staged := filepath.Join(t.TempDir(), "models")
	writeBundle(t, filepath.Join(staged, "cnn", "1"), "cnn", false)
	if err := os.Rename(staged, models); err != nil {
		t.Fatal(err)
	}
	select {
	case <-r.Started():
		if node.current("cnn") != "1" {
			t.Errorf("started with cnn not deployed: %s", index(r))
		}
	case <-time.After(10 * time.Second):
		t.Errorf("not started 10 s after DIR came: %s", index(r))
	}
}
