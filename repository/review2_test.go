package repository

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/plover-run/plover/api"
	"github.com/plover-run/plover/errdefs"
)

// Found by a review (2026-12-01): an unload that a folder's passing
// change cleared, a load's passing failure never tried again without
// polling, a lower version made current for every node sharing the store
// when the highest failed for a reason that may pass, an unload that left
// a pending delete, and reasons that quoted the server's path.

// cnnModels is a models folder holding cnn's version folders labels,
// their files set back past any settle time.
func cnnModels(t *testing.T, labels ...string) string {
	t.Helper()
	models := filepath.Join(t.TempDir(), "models")
	for _, l := range labels {
		writeBundle(t, filepath.Join(models, "cnn", l), "cnn", false)
	}
	age(t, models)
	return models
}

// An unloaded model whose folder changes for one scan and comes back as it
// was (a link unreadable a moment, a file touched and set back) is still
// unloaded: it showed a blank state, neither unloaded nor deployed.
func TestAnUnloadOutlastsAPassingChange(t *testing.T) {
	ctx := context.Background()
	models := cnnModels(t, "1")
	node := newFakeNode()
	state := filepath.Join(t.TempDir(), "unloaded.json")
	r, _ := New(Config{Dir: models, Poll: time.Hour, Settle: time.Minute, StateFile: state}, node)
	r.Scan(ctx)
	if err := r.Unload(ctx, "cnn"); err != nil {
		t.Fatal(err)
	}
	lib := filepath.Join(models, "cnn", "1", "vecadd.so")
	st, err := os.Stat(lib)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	os.Chtimes(lib, now, now)
	r.Scan(ctx) // changed: waiting to settle
	if got := index(r); !strings.Contains(got, "LOADING") {
		t.Fatalf("the folder changed: %q, want LOADING", got)
	}
	os.Chtimes(lib, st.ModTime(), st.ModTime()) // back as it was
	r.Scan(ctx)
	want := "cnn/ UNAVAILABLE (unloaded); "
	if got := index(r); got != want || node.current("cnn") != "" {
		t.Fatalf("back as it was: %q, current %q; want %q, nothing deployed", got, node.current("cnn"), want)
	}
	// Kept for a restart, as any unload is.
	r2, err := New(Config{Dir: models, Poll: time.Hour, Settle: time.Minute, StateFile: state}, node)
	if err != nil {
		t.Fatal(err)
	}
	r2.Scan(ctx)
	if got := index(r2); got != want || node.current("cnn") != "" {
		t.Fatalf("after a restart: %q, current %q; want %q, nothing deployed", got, node.current("cnn"), want)
	}
}

// downOnce refuses the first deploys (the store down) while down is set.
type downOnce struct {
	*fakeNode
	down atomic.Bool
}

func (d *downOnce) DeployLabeled(ctx context.Context, name, label string, aside bool, body io.Reader) (api.FunctionInfo, error) {
	if d.down.Load() {
		return api.FunctionInfo{}, errdefs.New(errdefs.KindUnavailable, nil, "store: connection refused")
	}
	return d.fakeNode.DeployLabeled(ctx, name, label, aside, body)
}

// A load that fails for a reason that may pass (the store down) is tried
// again by Run's scans without polling, as the index says: it stayed
// unloaded-and-failed until the folder changed or another load came.
func TestALoadThatMayPassIsTriedAgain(t *testing.T) {
	ctx := context.Background()
	models := cnnModels(t, "1")
	node := &downOnce{fakeNode: newFakeNode()}
	r, _ := New(Config{Dir: models, Settle: 10 * time.Millisecond}, node)
	runStarted(t, r)
	if err := r.Unload(ctx, "cnn"); err != nil {
		t.Fatal(err)
	}
	node.down.Store(true)
	if err := r.Load(ctx, "cnn"); errdefs.KindOf(err) != errdefs.KindUnavailable {
		t.Fatalf("a load while the store is down: %v, want 503", err)
	}
	node.down.Store(false)
	for end := time.Now().Add(10 * time.Second); node.current("cnn") != "1"; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("not deployed 10 s after the store came back; index %q", index(r))
		}
	}
}

// When the highest version fails for a reason that may pass (a conflict,
// the store), the record's current version stays: a lower one was made
// current, for every node sharing the store, until the next scan.
func TestAPassingFailureOfTheHighestKeepsTheCurrentVersion(t *testing.T) {
	ctx := context.Background()
	models := cnnModels(t, "1", "2")
	node := &downOnce{fakeNode: newFakeNode()}
	r, _ := New(Config{Dir: models, Poll: time.Hour, Settle: 10 * time.Millisecond}, node)
	r.Scan(ctx)
	if c := node.current("cnn"); c != "2" {
		t.Fatalf("current %q, want 2", c)
	}
	// Version 2 rewritten while the store refuses deploys.
	os.WriteFile(filepath.Join(models, "cnn", "2", "vecadd.so"), []byte("a new build"), 0o644)
	age(t, models)
	node.down.Store(true)
	rollbacks := node.rollbacks
	r.Scan(ctx) // seen changed
	r.Scan(ctx) // seen the same twice: deployed, and refused
	if got := index(r); !strings.Contains(got, "cnn/2 UNAVAILABLE") || !strings.Contains(got, "connection refused") {
		t.Fatalf("the index: %q, want cnn/2 UNAVAILABLE with the store's refusal", got)
	}
	if c := node.current("cnn"); c != "2" || node.rollbacks != rollbacks {
		t.Fatalf("after the highest's deploy failed for a passing reason: current %q, %d rollbacks; want 2 still, none", c, node.rollbacks-rollbacks)
	}
}

// A reason for a folder that cannot be read names it as the repository
// lays it out, not by the server's path.
func TestReasonsDoNotQuoteTheServersPath(t *testing.T) {
	models := filepath.Join(t.TempDir(), "models")
	os.Mkdir(models, 0o755)
	r, err := New(Config{Dir: models}, newFakeNode())
	if err != nil {
		t.Fatal(err)
	}
	err = &os.PathError{Op: "stat", Path: filepath.Join(models, "cnn"), Err: os.ErrPermission}
	if got := r.quiet(err); strings.Contains(got, models) || !strings.Contains(got, "models/cnn") {
		t.Fatalf("%q: want models/cnn, not %s", got, models)
	}
}

// An unload of a model whose folder went and came back while the store
// was down (its delete pending) ends that delete: the next scan left the
// unload for a removal's retry and deployed the model again unasked.
func TestAnUnloadEndsAPendingDelete(t *testing.T) {
	ctx := context.Background()
	models := cnnModels(t, "1")
	node := &storeDownNode{fakeNode: newFakeNode()}
	r, _ := New(Config{Dir: models, Poll: time.Hour, Settle: 10 * time.Millisecond}, node)
	r.Scan(ctx)
	away := filepath.Join(t.TempDir(), "cnn")
	if err := os.Rename(filepath.Join(models, "cnn"), away); err != nil {
		t.Fatal(err)
	}
	node.down.Store(true)
	scanEmptied(ctx, r) // its delete cannot read the record: pending
	if got := index(r); !strings.Contains(got, "its folder was removed") {
		t.Fatalf("removed while the store is down: %q", got)
	}
	node.down.Store(false)
	if err := os.Rename(away, filepath.Join(models, "cnn")); err != nil { // back as it was
		t.Fatal(err)
	}
	if err := r.Unload(ctx, "cnn"); err != nil {
		t.Fatal(err)
	}
	r.Scan(ctx)
	r.Scan(ctx)
	if got := index(r); got != "cnn/ UNAVAILABLE (unloaded); " || node.current("cnn") != "" {
		t.Fatalf("after the unload: %q, current %q; want it unloaded, nothing deployed", got, node.current("cnn"))
	}
}

// Files beside a model's version folders (a log, .git, Triton's
// config.pbtxt) are no bundle's: writing them neither deploys anything
// again nor ends an unload, where they were part of the folder's
// fingerprint.
func TestFilesBesideTheVersionsAreLeftAlone(t *testing.T) {
	ctx := context.Background()
	models := cnnModels(t, "1")
	node := newFakeNode()
	r, _ := New(Config{Dir: models, Poll: time.Hour, Settle: 10 * time.Millisecond}, node)
	r.Scan(ctx)
	if err := r.Unload(ctx, "cnn"); err != nil {
		t.Fatal(err)
	}
	deploys := node.deploys
	for _, f := range []string{"logs/serve.log", ".git/HEAD", "config.pbtxt"} {
		p := filepath.Join(models, "cnn", f)
		os.MkdirAll(filepath.Dir(p), 0o755)
		if err := os.WriteFile(p, []byte("written "+f), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	r.Scan(ctx)
	r.Scan(ctx)
	if got := index(r); got != "cnn/ UNAVAILABLE (unloaded); " || node.deploys != deploys {
		t.Fatalf("after writes beside the versions: %q, %d deploys; want it unloaded, none", got, node.deploys-deploys)
	}
	// A version folder's change still ends it.
	writeBundle(t, filepath.Join(models, "cnn", "2"), "cnn", false)
	age(t, models)
	r.Scan(ctx)
	r.Scan(ctx)
	if c := node.current("cnn"); c != "2" {
		t.Fatalf("after a new version folder: current %q, want 2; index %q", c, index(r))
	}
}
