package repository

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/plover-run/plover/api"
	"github.com/plover-run/plover/bundle"
	"github.com/plover-run/plover/errdefs"
	"github.com/plover-run/plover/pipedef"
)

// flakyNode fails its first fails deploys with err.
type flakyNode struct {
	*fakeNode
	fmu      sync.Mutex
	fails    int
	err      error
	attempts int
}

func (f *flakyNode) DeployLabeled(ctx context.Context, name, label string, aside bool, body io.Reader) (api.FunctionInfo, error) {
	f.fmu.Lock()
	f.attempts++
	if f.fails > 0 {
		f.fails--
		f.fmu.Unlock()
		return api.FunctionInfo{}, f.err
	}
	f.fmu.Unlock()
	return f.fakeNode.DeployLabeled(ctx, name, label, aside, body)
}

func (f *flakyNode) deployed(name string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.recs[name] != nil
}

// A deploy that failed for a reason that may pass (the store, a conflict,
// a pipeline's step not deployed yet) is tried again at the next scan; one
// the node refuses as invalid waits for its folder to change.
func TestRetryDeploy(t *testing.T) {
	for _, c := range []struct {
		what  string
		err   error
		retry bool
	}{
		{"store", errdefs.New(errdefs.KindUnavailable, nil, "cannot write to the store"), true},
		{"conflict", errdefs.New(errdefs.KindConflict, nil, "the record kept changing"), true},
		{"internal", errdefs.New(errdefs.KindInternal, nil, "temp file"), true},
		{"missing step", errdefs.New(errdefs.KindInvalid, &errdefs.NoFunction{Name: "pre"}, "pipeline: step not deployed"), true},
		{"invalid", errdefs.New(errdefs.KindInvalid, nil, "bad chain"), false},
		{"too large", errdefs.New(errdefs.KindTooLarge, nil, "too large"), false},
		{"breaks its users", errdefs.New(errdefs.KindConflict, &pipedef.UsersError{Function: "cnn", Users: []string{"outer"}, Reasons: []string{"too deep"}}, "deploy cnn"), false},
	} {
		t.Run(c.what, func(t *testing.T) {
			root := filepath.Join(t.TempDir(), "models")
			writeBundle(t, filepath.Join(root, "cnn", "1"), "cnn", false)
			age(t, root)
			node := &flakyNode{fakeNode: newFakeNode(), fails: 1, err: c.err}
			r, _ := New(Config{Dir: root, Settle: 10 * time.Millisecond, Poll: 10 * time.Millisecond}, node)
			for i := 0; i < 3; i++ {
				r.Scan(context.Background())
			}
			if got := node.deployed("cnn"); got != c.retry {
				t.Errorf("deployed after a %s failure and two scans: %v, want %v (%s)", c.what, got, c.retry, index(r))
			}
			if !c.retry && node.attempts != 1 {
				t.Errorf("a refused bundle was tried %d times, want once until its folder changes", node.attempts)
			}
		})
	}
}

// Without polling, Run scans again while a deploy is to be tried again.
func TestRetryWithoutPoll(t *testing.T) {
	root := filepath.Join(t.TempDir(), "models")
	writeBundle(t, filepath.Join(root, "cnn", "1"), "cnn", false)
	age(t, root)
	node := &flakyNode{fakeNode: newFakeNode(), fails: 2, err: errdefs.New(errdefs.KindUnavailable, nil, "store down")}
	r, _ := New(Config{Dir: root, Settle: 10 * time.Millisecond}, node)
	cancel, done := runRepo(r)
	defer func() { cancel(); <-done }()
	if !idleWithin(r, 10*time.Second) {
		t.Fatal("Run still scanning 10 s on")
	}
	if !node.deployed("cnn") {
		t.Errorf("Run stopped scanning without deploying after the store came back: %s", index(r))
	}
}

// labelSHA is the sha256 of the latest version of name labeled label.
func labelSHA(f *fakeNode, name, label string) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	rec := f.recs[name]
	if rec == nil {
		return ""
	}
	v, n := rec.Find(label)
	if n == 0 {
		return ""
	}
	return v.SHA256
}

// A lower version folder changed and then changed back: its label names
// the folder's bytes again.
func TestRevertedVersion(t *testing.T) {
	ctx := context.Background()
	root := filepath.Join(t.TempDir(), "models")
	writeBundle(t, filepath.Join(root, "cnn", "1"), "cnn", false)
	writeBundle(t, filepath.Join(root, "cnn", "2"), "cnn", false)
	age(t, root)
	node := newFakeNode()
	r, err := New(Config{Dir: root, Settle: 10 * time.Millisecond}, node)
	if err != nil {
		t.Fatal(err)
	}
	r.Scan(ctx)
	v1 := filepath.Join(root, "cnn", "1")
	_, shaA, _, _ := bundle.PackBytes(v1)
	if got := labelSHA(node, "cnn", "1"); got != shaA {
		t.Fatalf("start: label 1 = %s want %s", got, shaA)
	}
	lib := filepath.Join(v1, "vecadd.so")
	orig, _ := os.ReadFile(lib)
	os.WriteFile(lib, []byte("changed lib"), 0o644)
	age(t, filepath.Join(root, "cnn"))
	r.Scan(ctx)
	r.Scan(ctx)
	_, shaB, _, _ := bundle.PackBytes(v1)
	if got := labelSHA(node, "cnn", "1"); got != shaB {
		t.Fatalf("changed: label 1 = %s want %s", got, shaB)
	}
	os.WriteFile(lib, orig, 0o644)
	old := time.Now().Add(-30 * time.Second)
	os.Chtimes(lib, old, old)
	r.Scan(ctx)
	r.Scan(ctx)
	if got := labelSHA(node, "cnn", "1"); got != shaA {
		t.Errorf("reverted: label 1 names %.12s (the changed bytes), the folder holds %.12s", got, shaA)
	}
	if c := node.current("cnn"); c != "2" {
		t.Errorf("current is version %q, want 2", c)
	}
}

// DIR is one bundle whose manifest is rewritten in place (half-written a
// moment) or absent a moment: the function keeps its name, LOADING with
// the reason, and is not deleted; a rename deletes the old name only once
// DIR settles so.
func TestSingleBundleManifestGlitch(t *testing.T) {
	for _, c := range []struct {
		what   string
		glitch func(t *testing.T, man string, orig []byte)
	}{
		{"half-written", func(t *testing.T, man string, orig []byte) { os.WriteFile(man, orig[:10], 0o644) }},
		{"absent", func(t *testing.T, man string, orig []byte) { os.Remove(man) }},
	} {
		t.Run(c.what, func(t *testing.T) {
			ctx := context.Background()
			root := filepath.Join(t.TempDir(), "models")
			writeBundle(t, root, "saxpy", false)
			// A folder beside it (no bundle: a folder with one beside a
			// top manifest makes DIR model folders): a model once DIR
			// holds models.
			os.MkdirAll(filepath.Join(root, "extra"), 0o755)
			os.WriteFile(filepath.Join(root, "extra", "notes.txt"), []byte("notes"), 0o644)
			age(t, root)
			node := newFakeNode()
			r, _ := New(Config{Dir: root, Settle: 10 * time.Millisecond, Poll: time.Second}, node)
			r.Scan(ctx)
			if node.current("saxpy") == "" {
				t.Fatalf("not deployed: %s", index(r))
			}
			man := filepath.Join(root, "plover.json")
			orig, _ := os.ReadFile(man)
			c.glitch(t, man, orig)
			age(t, root)
			r.Scan(ctx)
			if len(node.deletes) > 0 {
				t.Errorf("a %s manifest deleted %v", c.what, node.deletes)
			}
			if got := index(r); !strings.Contains(got, "saxpy/ LOADING") || strings.Contains(got, "extra") {
				t.Errorf("index while the manifest is %s: %s, want saxpy LOADING alone", c.what, got)
			}
			os.WriteFile(man, orig, 0o644)
			age(t, root)
			r.Scan(ctx)
			r.Scan(ctx)
			if len(node.deletes) > 0 || node.current("saxpy") == "" {
				t.Errorf("after the manifest came back: deletes %v, index %s", node.deletes, index(r))
			}
			if got := index(r); got != "saxpy/1 READY; " {
				t.Errorf("index after the manifest came back: %s", got)
			}
		})
	}
	t.Run("rename", func(t *testing.T) {
		ctx := context.Background()
		root := filepath.Join(t.TempDir(), "models")
		writeBundle(t, root, "saxpy", false)
		node := newFakeNode()
		r, _ := New(Config{Dir: root, Settle: 10 * time.Millisecond, Poll: time.Second}, node)
		r.Scan(ctx)
		writeBundle(t, root, "saxpy2", false)
		r.Scan(ctx)
		if len(node.deletes) > 0 {
			t.Errorf("a rename deleted %v at its first scan", node.deletes)
		}
		r.Scan(ctx) // settled: the old name goes
		r.Scan(ctx) // the new one, seen twice, deploys
		if fmt.Sprint(node.deletes) != "[saxpy]" || node.current("saxpy2") == "" {
			t.Errorf("after the rename settled: deletes %v, index %s", node.deletes, index(r))
		}
	})
}

// Unloaded, then its folder changes: the index shows no deleted version
// READY while the change settles.
func TestUnloadThenChange(t *testing.T) {
	ctx := context.Background()
	root, _, r := servingCNN(t, Config{Settle: time.Second})
	if err := r.Unload(ctx, "cnn"); err != nil {
		t.Fatal(err)
	}
	writeBundle(t, filepath.Join(root, "cnn", "1"), "cnn", true) // being copied again
	os.WriteFile(filepath.Join(root, "cnn", "1", "vecadd.so"), []byte("new"), 0o644)
	r.Scan(ctx)
	if got := r.Index(context.Background(), true); len(got) > 0 {
		t.Errorf("index(ready) lists %v while the function is deleted", got)
	}
	if got := index(r); !strings.HasPrefix(got, "cnn/ LOADING") || strings.Contains(got, "cnn/1") {
		t.Errorf("index: %s, want cnn LOADING alone", got)
	}
}

// failingDelete fails its first fails deletes with err.
type failingDelete struct {
	*fakeNode
	fails int
	err   error
}

func (f *failingDelete) DeleteCurrent(ctx context.Context, name, version string) error {
	if f.fails > 0 {
		f.fails--
		return f.err
	}
	return f.fakeNode.DeleteCurrent(ctx, name, version)
}

// A removed folder whose function's delete failed stays, UNAVAILABLE with
// the reason, and the delete is tried again at the next scan.
func TestRemoveRetried(t *testing.T) {
	ctx := context.Background()
	root := filepath.Join(t.TempDir(), "models")
	writeBundle(t, filepath.Join(root, "cnn", "1"), "cnn", false)
	writeBundle(t, filepath.Join(root, "rnn", "1"), "rnn", false)
	age(t, root)
	node := &failingDelete{fakeNode: newFakeNode(), fails: 1, err: errdefs.New(errdefs.KindUnavailable, nil, "store down")}
	r, _ := New(Config{Dir: root, Settle: 10 * time.Millisecond, Poll: time.Second}, node)
	r.Scan(ctx)
	os.RemoveAll(filepath.Join(root, "cnn"))
	if !r.Scan(ctx) {
		t.Error("Scan does not report the delete to try again")
	}
	if got := index(r); !strings.HasPrefix(got, "cnn/ UNAVAILABLE (its folder was removed, but deleting its function failed") {
		t.Errorf("index after the failed delete: %s", got)
	}
	if node.current("cnn") == "" {
		t.Fatal("the fake deleted it")
	}
	r.Scan(ctx)
	if node.current("cnn") != "" {
		t.Errorf("the delete was not tried again: %s", index(r))
	}
	if got := index(r); got != "rnn/1 READY; " {
		t.Errorf("index after the delete: %s", got)
	}
}

// copyingNode adds a file to dir at its first Versions, after the scan
// decided to deploy and before the version is packed: a copy still
// going on.
type copyingNode struct {
	*fakeNode
	dir  string
	done bool
}

func (c *copyingNode) Versions(ctx context.Context, name string) (*api.Record, error) {
	if !c.done {
		c.done = true
		os.WriteFile(filepath.Join(c.dir, "late.txt"), []byte("more"), 0o644)
	}
	return c.fakeNode.Versions(ctx, name)
}

// A folder that changes after the scan that decided to deploy it is not
// deployed from that look: it stays LOADING until it settles again.
func TestChangedWhilePacked(t *testing.T) {
	ctx := context.Background()
	root := filepath.Join(t.TempDir(), "models")
	writeBundle(t, filepath.Join(root, "cnn", "1"), "cnn", false)
	age(t, root)
	node := &copyingNode{fakeNode: newFakeNode(), dir: filepath.Join(root, "cnn", "1")}
	r, _ := New(Config{Dir: root, Settle: 10 * time.Millisecond, Poll: time.Second}, node)
	if !r.Scan(ctx) {
		t.Error("Scan does not report the model to look at again")
	}
	if node.deploys != 0 {
		t.Errorf("deployed %d versions packed while the folder changed", node.deploys)
	}
	if got := index(r); !strings.HasPrefix(got, "cnn/ LOADING (models/cnn: files changed while it was read") {
		t.Errorf("index: %s", got)
	}
	time.Sleep(20 * time.Millisecond)
	r.Scan(ctx)
	r.Scan(ctx)
	if node.current("cnn") != "1" {
		t.Errorf("not deployed once settled: %s", index(r))
	}
}

// A version folder's file linked out of it (to a file only the server
// may read) is refused, the version UNAVAILABLE with the reason naming
// it; a file linked within it deploys, and a change of what it points at
// is a change of the folder.
func TestLinkedFiles(t *testing.T) {
	secret := filepath.Join(t.TempDir(), "tokens")
	os.WriteFile(secret, []byte("SERVER-SECRET-TOKEN"), 0o600)
	for _, c := range []struct {
		what, target string
		ok           bool
	}{
		{"out", secret, false},
		{"to a sibling version", "../2/b.bin", false},
		{"within", "data/b.bin", true},
	} {
		t.Run(c.what, func(t *testing.T) {
			ctx := context.Background()
			root := filepath.Join(t.TempDir(), "models")
			dir := filepath.Join(root, "cnn", "1")
			writeBundle(t, dir, "cnn", false)
			writeBundle(t, filepath.Join(root, "cnn", "2"), "cnn", false)
			os.MkdirAll(filepath.Join(dir, "data"), 0o755)
			os.WriteFile(filepath.Join(dir, "data", "b.bin"), []byte("weights"), 0o644)
			link := filepath.Join(dir, "b.bin")
			os.Remove(link)
			if err := os.Symlink(c.target, link); err != nil {
				t.Fatal(err)
			}
			age(t, root)
			time.Sleep(20 * time.Millisecond) // the link's own time past Settle
			node := newFakeNode()
			r, _ := New(Config{Dir: root, Settle: 10 * time.Millisecond, Poll: time.Second}, node)
			r.Scan(ctx)
			got := index(r)
			if c.ok {
				if got != "cnn/1 READY; cnn/2 READY; " {
					t.Fatalf("index: %s", got)
				}
				before := look(filepath.Join(root, "cnn"), false).print
				os.WriteFile(filepath.Join(dir, "data", "b.bin"), []byte("other weights"), 0o644)
				if look(filepath.Join(root, "cnn"), false).print == before {
					t.Error("rewriting a linked file's target does not change the folder's fingerprint")
				}
				return
			}
			want := "models/cnn/1: pack: bundle: b.bin is a link that resolves outside"
			if !strings.HasPrefix(got, "cnn/1 UNAVAILABLE (models/cnn/1: ") || !strings.Contains(got, want) || !strings.Contains(got, "cnn/2 READY") {
				t.Errorf("index: %s, want %s...", got, want)
			}
			node.mu.Lock()
			defer node.mu.Unlock()
			if node.recs["cnn"] == nil {
				t.Fatal("version 2 not deployed")
			}
			for _, v := range node.recs["cnn"].Versions {
				if v.Label == "1" {
					t.Errorf("deployed version 1 with a file linked out of it")
				}
			}
		})
	}
}

// A load that fails keeps the failure's class: the store down is 503, a
// conflict 409, a bundle refused 400.
func TestLoadFailureKind(t *testing.T) {
	for _, c := range []struct {
		what string
		err  error
		want errdefs.Kind
	}{
		{"store", errdefs.New(errdefs.KindUnavailable, nil, "cannot write to the store"), errdefs.KindUnavailable},
		{"conflict", errdefs.New(errdefs.KindConflict, nil, "the record kept changing"), errdefs.KindConflict},
		{"too large", errdefs.New(errdefs.KindTooLarge, nil, "bundle is larger"), errdefs.KindTooLarge},
		{"invalid", errdefs.New(errdefs.KindInvalid, nil, "bad chain"), errdefs.KindBadRequest},
		{"no space", errdefs.New(errdefs.KindNoSpace, nil, "out of disk space"), errdefs.KindNoSpace},
	} {
		t.Run(c.what, func(t *testing.T) {
			root := filepath.Join(t.TempDir(), "models")
			writeBundle(t, filepath.Join(root, "cnn", "1"), "cnn", false)
			node := &flakyNode{fakeNode: newFakeNode(), fails: 100, err: c.err}
			r, _ := New(Config{Dir: root, Settle: 10 * time.Millisecond}, node)
			err := r.Load(context.Background(), "cnn")
			if errdefs.KindOf(err) != c.want || !strings.Contains(fmt.Sprint(err), c.err.Error()) {
				t.Errorf("load: %v (kind %d), want kind %d with the reason", err, errdefs.KindOf(err), c.want)
			}
		})
	}
}

// pipeNode refuses, as the engine does without force, to delete "step"
// while "zpipe" (a pipeline running it) is there.
type pipeNode struct{ *fakeNode }

func (p pipeNode) DeleteCurrent(ctx context.Context, name, version string) error {
	p.mu.Lock()
	used := p.recs["zpipe"] != nil
	p.mu.Unlock()
	if name == "step" && used {
		return errdefs.New(errdefs.KindConflict, nil, "function step is a step of pipeline zpipe")
	}
	return p.fakeNode.DeleteCurrent(ctx, name, version)
}

// A removed folder whose function a pipeline runs is not deleted with
// force: it stays, UNAVAILABLE with the reason, until the pipeline goes
// (in the same scan too, though it sorts after the step).
func TestRemoveStepOfPipeline(t *testing.T) {
	for _, c := range []struct {
		what   string
		remove []string
		after  string // the index after the scan
	}{
		{"step alone", []string{"step"}, "step/ UNAVAILABLE (its folder was removed, but deleting its function failed (tried again at the next scan): function step is a step of pipeline zpipe); zpipe/1 READY; "},
		{"step and pipeline", []string{"step", "zpipe"}, ""},
	} {
		t.Run(c.what, func(t *testing.T) {
			ctx := context.Background()
			root := filepath.Join(t.TempDir(), "models")
			writeBundle(t, filepath.Join(root, "step", "1"), "step", false)
			writeBundle(t, filepath.Join(root, "zpipe", "1"), "zpipe", false)
			age(t, root)
			node := pipeNode{newFakeNode()}
			r, _ := New(Config{Dir: root, Settle: 10 * time.Millisecond, Poll: time.Second}, node)
			r.Scan(ctx)
			for _, n := range c.remove {
				os.RemoveAll(filepath.Join(root, n))
			}
			scanEmptied(ctx, r) // one scan where a folder is left
			if got := index(r); got != c.after {
				t.Errorf("index: %q, want %q", got, c.after)
			}
			if len(c.remove) == 1 {
				if node.current("step") == "" {
					t.Error("the step a pipeline runs was deleted")
				}
				os.RemoveAll(filepath.Join(root, "zpipe"))
				scanEmptied(ctx, r)
				if got := index(r); got != "" || node.current("step") != "" {
					t.Errorf("after the pipeline went: index %q, step deployed %v", got, node.current("step") != "")
				}
			}
		})
	}
}
