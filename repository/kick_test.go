package repository

// A model unloaded here whose function comes back (a load on another node
// sharing the store): only Run's scans take it back, so a folder gone here
// is never taken back, settling and retries go on, and nothing scans once
// Run's context ended.

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/plover-run/plover/api"
	"github.com/plover-run/plover/errdefs"
)

// runStarted runs r until the test ends and returns once its first scans
// deployed the folders found at start (where Run, without Poll, once
// returned).
func runStarted(t *testing.T, r *Repository) {
	t.Helper()
	cancel, done := runRepo(r)
	t.Cleanup(func() { cancel(); <-done })
	<-r.Started()
}

// scansOf is how many scans r finished.
func scansOf(r *Repository) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.scans
}

// scannedAfter waits up to 10 s for r to finish a scan past n.
func scannedAfter(t *testing.T, r *Repository, n int) {
	t.Helper()
	for end := time.Now().Add(10 * time.Second); scansOf(r) <= n; time.Sleep(time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("no scan 10 s on; index %q", index(r))
		}
	}
}

// twoNodes is nodes A and B (no poll) sharing one store, each with its
// own copy of cnn/1/, deployed, and cnn unloaded on A.
func twoNodes(t *testing.T) (a, b *Repository, modelsA string, node *fakeNode) {
	t.Helper()
	modelsA = filepath.Join(t.TempDir(), "models")
	modelsB := filepath.Join(t.TempDir(), "models")
	writeBundle(t, filepath.Join(modelsA, "cnn", "1"), "cnn", false)
	writeBundle(t, filepath.Join(modelsB, "cnn", "1"), "cnn", false)
	age(t, modelsA)
	age(t, modelsB)
	node = newFakeNode()
	a, _ = New(Config{Dir: modelsA, Settle: time.Millisecond}, node)
	b, _ = New(Config{Dir: modelsB, Settle: time.Millisecond}, node)
	runStarted(t, a)
	runStarted(t, b)
	if err := a.Unload(context.Background(), "cnn"); err != nil {
		t.Fatal(err)
	}
	return a, b, modelsA, node
}

// A's folder removed while no scan looked (no poll), then cnn loaded on B:
// A's index took cnn back with no look at its folder, and the scan it
// started found the folder gone and deleted B's function from the store.
func TestIndexLeavesAGoneFolderAlone(t *testing.T) {
	a, b, modelsA, node := twoNodes(t)
	os.RemoveAll(filepath.Join(modelsA, "cnn"))
	if err := b.Load(context.Background(), "cnn"); err != nil {
		t.Fatal(err)
	}
	n := scansOf(a)
	index(a) // sees cnn's function back
	scannedAfter(t, a, n)
	if node.current("cnn") != "1" {
		t.Errorf("B's function was deleted by A, whose folder is gone: deletes %v; A %q, B %q", node.deletes, index(a), index(b))
	}
}

// A's folder changed since its last scan (a new version folder) when cnn
// is loaded on B: the scan A's index started saw it settling and nothing
// scanned again (no poll): LOADING for good.
func TestBackElsewhereSettles(t *testing.T) {
	a, b, modelsA, node := twoNodes(t)
	writeBundle(t, filepath.Join(modelsA, "cnn", "2"), "cnn", false)
	if err := b.Load(context.Background(), "cnn"); err != nil {
		t.Fatal(err)
	}
	want := func(s string) bool { return s == "cnn/1 READY; cnn/2 READY; " }
	if got := indexUntil(t, a, want); !want(got) {
		t.Errorf("A's index 10 s after B's load: %q (store's current %q), want both READY", got, node.current("cnn"))
	}
}

// A scan asked for as Run's context ends does not start: take's select
// chose the free turn over the ended context at random.
func TestNoScanAfterTheContextEnded(t *testing.T) {
	_, _, r := servingCNN(t, Config{Settle: time.Millisecond})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	n := scansOf(r)
	for range 200 {
		r.Scan(ctx)
	}
	if got := scansOf(r) - n; got != 0 {
		t.Errorf("%d of 200 scans ran under an ended context", got)
	}
}

// holdListNode's listing waits for release (or its context's end).
type holdListNode struct {
	*fakeNode
	once    sync.Once
	started chan struct{}
	release chan struct{}
}

func (n *holdListNode) Listed(ctx context.Context) (map[string]bool, error) {
	n.once.Do(func() { close(n.started) })
	select {
	case <-n.release:
		return n.fakeNode.Listed(ctx)
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// The index whose listing others share leaves (its client disconnected):
// the listing goes on for the others, who got none.
func TestSharedListingOutlivesItsFirstAsker(t *testing.T) {
	node := &holdListNode{fakeNode: newFakeNode(), started: make(chan struct{}), release: make(chan struct{})}
	r := servingA(t, node, Config{})
	ctx1, cancel1 := context.WithCancel(context.Background())
	first := make(chan struct{})
	go func() { r.Index(ctx1, false); close(first) }()
	<-node.started
	res := make(chan *listing, 1)
	go func() { res <- r.noticeDeleted(context.Background(), true) }()
	for sharing(r) == 0 {
		time.Sleep(time.Millisecond) // the second index to wait for the listing
	}
	cancel1()
	<-first
	close(node.release)
	if l := <-res; l == nil || !l.names["a"] {
		t.Errorf("the index sharing the listing got %v: the first one's leaving ended it", l)
	}
}

// countNode counts the records read.
type countNode struct {
	*fakeNode
	reads atomic.Int32
}

func (n *countNode) Versions(ctx context.Context, name string) (*api.Record, error) {
	n.reads.Add(1)
	return n.fakeNode.Versions(ctx, name)
}

// An unloaded model whose name a plover deploy took (left alone): every
// index read its record, holding the turn a load or scan waits for.
func TestIndexesDoNotReadAnotherDeploysRecord(t *testing.T) {
	models := filepath.Join(t.TempDir(), "models")
	writeBundle(t, filepath.Join(models, "cnn", "1"), "cnn", false)
	age(t, models)
	node := &countNode{fakeNode: newFakeNode()}
	r, _ := New(Config{Dir: models, Settle: time.Millisecond}, node)
	unloadedThenDeployed(t, r, node.fakeNode, "") // a plover deploy: no label
	n := scansOf(r)
	index(r) // has a scan look at it once
	scannedAfter(t, r, n)
	node.reads.Store(0)
	for range 4 {
		index(r)
	}
	if got := node.reads.Load(); got != 0 {
		t.Errorf("4 indexes read %d records", got)
	}
	if got := index(r); !strings.HasPrefix(got, "cnn/ UNAVAILABLE (unloaded)") {
		t.Errorf("index %q, want cnn unloaded", got)
	}
}

// A write of the state file that failed is tried again without another
// event (no poll, an idle server): else a restart would deploy the model
// unloaded.
func TestFailedStateWriteIsRetried(t *testing.T) {
	d := t.TempDir()
	models := filepath.Join(d, "models")
	writeBundle(t, filepath.Join(models, "cnn", "1"), "cnn", false)
	age(t, models)
	state := filepath.Join(d, "data", "repository-unloaded.json") // data/ not there yet
	r, _ := New(Config{Dir: models, Settle: time.Millisecond, StateFile: state}, newFakeNode())
	runStarted(t, r)
	if err := r.Unload(context.Background(), "cnn"); err != nil {
		t.Fatal(err)
	}
	os.Mkdir(filepath.Join(d, "data"), 0o700)
	keptWithin(t, state, "cnn")
}

// keptWithin waits up to 10 s for state to keep name unloaded.
func keptWithin(t *testing.T, state, name string) {
	t.Helper()
	for end := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		if b, err := os.ReadFile(state); err == nil && strings.Contains(string(b), `"`+name+`"`) {
			return
		}
		if time.Now().After(end) {
			t.Fatalf("%s not kept in the state file 10 s on", name)
		}
	}
}

// A --data path holding a glob's characters: its torn writes were left.
func TestTornWritesRemovedUnderAnyPath(t *testing.T) {
	models := filepath.Join(t.TempDir(), "models")
	os.Mkdir(models, 0o700)
	data := filepath.Join(t.TempDir(), "d[1]*")
	os.Mkdir(data, 0o700)
	torn := filepath.Join(data, ".repository-unloaded.json.tmp-123")
	os.WriteFile(torn, []byte("{"), 0o600)
	if _, err := New(Config{Dir: models, StateFile: filepath.Join(data, "repository-unloaded.json")}, newFakeNode()); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(torn); err == nil {
		t.Errorf("%s left", torn)
	}
}

// holdWarnHandler holds a log call whose message holds hold until
// release, saying so on held.
type holdWarnHandler struct {
	hold          string
	held, release chan struct{}
	once          sync.Once
}

func (h *holdWarnHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h *holdWarnHandler) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h *holdWarnHandler) WithGroup(string) slog.Handler            { return h }
func (h *holdWarnHandler) Handle(_ context.Context, rec slog.Record) error {
	if strings.Contains(rec.Message, h.hold) {
		h.once.Do(func() { close(h.held) })
		<-h.release
	}
	return nil
}

// An index whose listing marks a model deleted answers before the state
// file is written (its fsyncs on a slow disk; here a write failing, whose
// warning is held): it, and those sharing its listing, waited for it.
func TestIndexDoesNotWaitForItsListingsWrite(t *testing.T) {
	h := &holdWarnHandler{hold: "cannot keep the unloaded models", held: make(chan struct{}), release: make(chan struct{})}
	state := filepath.Join(t.TempDir(), "missing", "state.json") // cannot be written
	node := newFakeNode()
	r := servingA(t, node, Config{StateFile: state, Log: slog.New(h)})
	node.Delete(context.Background(), "a", false) // plover rm
	done := make(chan string, 1)
	go func() { done <- index(r) }()
	<-h.held // the write failed and is being said
	select {
	case got := <-done:
		if !strings.Contains(got, "a/ UNAVAILABLE (deleted") {
			t.Errorf("index %q, want a deleted", got)
		}
	case <-time.After(10 * time.Second):
		t.Error("the index waited for the state file's write 10 s")
	}
	close(h.release)
}

// recordDownNode's records of name cannot be read while down; its
// listing still answers.
type recordDownNode struct {
	*fakeNode
	down atomic.Bool
}

func (n *recordDownNode) Versions(ctx context.Context, name string) (*api.Record, error) {
	if n.down.Load() && name == "cnn" {
		return nil, errdefs.New(errdefs.KindUnavailable, nil, "store: connection reset")
	}
	return n.fakeNode.Versions(ctx, name)
}

// An unloaded model's function listed again (a load elsewhere) whose
// record a scan could not read: every index after had a scan read it
// again at once, each acting on every folder.
func TestUnreadableRecordBacksOff(t *testing.T) {
	models := filepath.Join(t.TempDir(), "models")
	writeBundle(t, filepath.Join(models, "cnn", "1"), "cnn", false)
	age(t, models)
	node := &recordDownNode{fakeNode: newFakeNode()}
	r, _ := New(Config{Dir: models, Settle: 5 * time.Second}, node)
	unloadedThenDeployed(t, r, node.fakeNode, "1") // a load elsewhere
	node.down.Store(true)
	n := scansOf(r)
	index(r) // lists cnn back: a scan, which cannot read its record
	scannedAfter(t, r, n)
	if r.backInListing(&listing{names: map[string]bool{"cnn": true}}) {
		t.Errorf("the next index would have a scan read cnn's record again at once; index %q", index(r))
	}
}

// unloadedThenDeployed runs r, unloads cnn and deploys DIR/cnn/1 into
// the store again under label ("": a plover deploy).
func unloadedThenDeployed(t *testing.T, r *Repository, node *fakeNode, label string) {
	t.Helper()
	runStarted(t, r)
	ctx := context.Background()
	if err := r.Unload(ctx, "cnn"); err != nil {
		t.Fatal(err)
	}
	b, _, _, err := r.pack(filepath.Join(r.cfg.Dir, "cnn", "1"), "")
	if err != nil {
		t.Fatal(err)
	}
	node.DeployLabeled(ctx, "cnn", label, false, strings.NewReader(string(b)))
}

// A log sink that blocks (a full pipe) while a model is said unavailable:
// the line was written under r.mu, and every index waited for the sink.
func TestIndexDoesNotWaitForTheLog(t *testing.T) {
	models := filepath.Join(t.TempDir(), "models")
	os.MkdirAll(filepath.Join(models, "empty"), 0o755)
	os.WriteFile(filepath.Join(models, "empty", "README"), []byte("no bundle"), 0o644)
	age(t, models)
	h := &holdWarnHandler{hold: "a model is unavailable", held: make(chan struct{}), release: make(chan struct{})}
	r, _ := New(Config{Dir: models, Poll: time.Hour, Settle: time.Millisecond, Log: slog.New(h)}, newFakeNode())
	scanned := make(chan struct{})
	go func() { r.Scan(context.Background()); close(scanned) }()
	<-h.held
	done := make(chan string, 1)
	go func() { done <- index(r) }()
	select {
	case got := <-done:
		if !strings.Contains(got, "empty/ UNAVAILABLE") {
			t.Errorf("index %q, want empty unavailable", got)
		}
	case <-time.After(10 * time.Second):
		t.Error("the index waited 10 s for a log line")
	}
	close(h.release)
	<-scanned
}

// A load or unload waiting for the turn (a scan holds it while its deploys
// run, for minutes where bundles are large) is refused as the server stops
// (Run's context ends), though its own context goes on: an HTTP request's
// is the transport's, which a drain does not end. Before, it waited on and
// deployed while the server went down, its "shutting down" refusal never
// given.
func TestAWaitForTheTurnEndsWithRun(t *testing.T) {
	for _, tc := range []struct {
		what string
		call func(*Repository) error
	}{
		{"load", func(r *Repository) error { return r.Load(context.Background(), "cnn") }},
		{"unload", func(r *Repository) error { return r.Unload(context.Background(), "cnn") }},
	} {
		t.Run(tc.what, func(t *testing.T) {
			models := filepath.Join(t.TempDir(), "models")
			writeBundle(t, filepath.Join(models, "cnn", "1"), "cnn", false)
			age(t, models)
			r, err := New(Config{Dir: models, Settle: time.Millisecond}, newFakeNode())
			if err != nil {
				t.Fatal(err)
			}
			cancel, done := runRepo(r)
			defer func() { cancel(); <-done }()
			<-r.Started()
			r.turn <- struct{}{} // as a long scan holds it
			defer r.give()
			got := make(chan error, 1)
			go func() { got <- tc.call(r) }()
			cancel()
			select {
			case err := <-got:
				if errdefs.KindOf(err) != errdefs.KindUnavailable || !strings.Contains(err.Error(), "shutting down") {
					t.Fatalf("%s as the server stops: %v, want unavailable, shutting down", tc.what, err)
				}
			case <-time.After(10 * time.Second):
				t.Fatalf("%s still waits for the turn 10 s after Run's context ended", tc.what)
			}
		})
	}
}

// Once Run has returned, its turn is free: a load or unload is still
// refused, every time (select chose at random between the free turn and
// the ended Run, and about half of them deployed as the server went down).
func TestNoLoadAfterRunEnded(t *testing.T) {
	models := filepath.Join(t.TempDir(), "models")
	writeBundle(t, filepath.Join(models, "cnn", "1"), "cnn", false)
	age(t, models)
	node := newFakeNode()
	r, err := New(Config{Dir: models, Settle: time.Millisecond}, node)
	if err != nil {
		t.Fatal(err)
	}
	cancel, done := runRepo(r)
	<-r.Started()
	cancel()
	<-done
	for i := range 20 {
		for what, call := range map[string]func() error{
			"load":   func() error { return r.Load(context.Background(), "cnn") },
			"unload": func() error { return r.Unload(context.Background(), "cnn") },
		} {
			if err := call(); errdefs.KindOf(err) != errdefs.KindUnavailable || !strings.Contains(err.Error(), "shutting down") {
				t.Fatalf("%s #%d after Run returned: %v, want unavailable, shutting down", what, i, err)
			}
		}
	}
}
