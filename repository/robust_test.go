package repository

// What a repository written by others than the server may hold (special
// files, unreadable folders, clocks ahead, layouts that change kind) and
// what load and unload must keep to.

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/plover-run/plover/bundle"
	"github.com/plover-run/plover/errdefs"
)

// runRepo runs r until cancel; done closes when Run returns.
func runRepo(r *Repository) (cancel func(), done <-chan struct{}) {
	ctx, cancel := context.WithCancel(context.Background())
	ch := make(chan struct{})
	go func() { r.Run(ctx); close(ch) }()
	return cancel, ch
}

// idleWithin reports whether Run came to wait for a kick alone (no
// folder settling, nothing to try again) within d.
func idleWithin(r *Repository, d time.Duration) bool {
	for end := time.Now().Add(d); !r.idle.Load(); time.Sleep(time.Millisecond) {
		if time.Now().After(end) {
			return false
		}
	}
	return true
}

// servingCNN is a repository of cfg (its Dir made) with one model,
// cnn/1/, at rest and deployed by a first scan.
func servingCNN(t *testing.T, cfg Config) (root string, node *fakeNode, r *Repository) {
	t.Helper()
	root = filepath.Join(t.TempDir(), "models")
	writeBundle(t, filepath.Join(root, "cnn", "1"), "cnn", false)
	age(t, root)
	node = newFakeNode()
	cfg.Dir = root
	r, err := New(cfg, node)
	if err != nil {
		t.Fatal(err)
	}
	r.Scan(context.Background())
	if got := index(r); got != "cnn/1 READY; " {
		t.Fatalf("start: %s", got)
	}
	return root, node, r
}

// started reports whether r's Started closed within d.
func started(r *Repository, d time.Duration) bool {
	select {
	case <-r.Started():
		return true
	case <-time.After(d):
		return false
	}
}

// A plover.json that is a FIFO (a named pipe left by a tool, or made on
// purpose by whoever writes the repository) does not stall the repository:
// opened, it would block until a writer came while the scan holds the
// turn, every other model's deploy waiting behind it, Started never
// closing and a load of another model hanging. It is refused unopened:
// the others deploy, the server says ready, a load answers.
func TestFIFOManifestDoesNotStallTheRepository(t *testing.T) {
	models := filepath.Join(t.TempDir(), "models")
	writeBundle(t, filepath.Join(models, "good"), "good", false)
	fifo := filepath.Join(models, "bad", "plover.json")
	if err := os.MkdirAll(filepath.Dir(fifo), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(fifo, 0o644); err != nil {
		t.Fatal(err)
	}
	age(t, models)
	node := newFakeNode()
	r, err := New(Config{Dir: models, Settle: 50 * time.Millisecond}, node)
	if err != nil {
		t.Fatal(err)
	}
	cancel, done := runRepo(r)
	t.Cleanup(func() {
		// Release whatever open of the FIFO blocks (O_RDWR never blocks
		// and counts as a writer), until Run returns.
		cancel()
		for {
			select {
			case <-done:
				return
			case <-time.After(20 * time.Millisecond):
				if f, err := os.OpenFile(fifo, os.O_RDWR, 0); err == nil {
					f.Close()
				}
			}
		}
	})
	if !started(r, 5*time.Second) {
		t.Errorf("not started 5 s on (a FIFO plover.json blocks the scan); good deployed: %v; index: %s",
			node.current("good") != "", index(r))
	}
	lctx, lcancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer lcancel()
	if err := r.Load(lctx, "good"); err != nil {
		t.Errorf("load of another model while a FIFO manifest is in the repository: %v", err)
	}
	if got := index(r); !strings.Contains(got, "bad/1 UNAVAILABLE (models/bad: ") || !strings.Contains(got, "models/bad: manifest: bundle: plover.json is a named pipe (FIFO), not a regular file)") {
		t.Errorf("the FIFO's model is not UNAVAILABLE with a reason naming the file; index: %s", got)
	}
}

// A directory the server cannot read in the repository (lost+found at the
// root of an ext4 PersistentVolume, root's and 0700, as the Helm chart's
// repository.existingClaim mounts it; the server runs as uid 10001) is
// not a copy still settling: were it LOADING, Started would never close
// (the server never ready) and, without --repository-poll, Run would
// rescan it for ever. lost+found is left alone; another unreadable
// folder is UNAVAILABLE with the reason. The server starts and Run ends.
func TestUnreadableFolderIsUnavailable(t *testing.T) {
	base, err := os.MkdirTemp("", "repository-unreadable-")
	if err != nil {
		t.Fatal(err)
	}
	models := filepath.Join(base, "models")
	locked := []string{filepath.Join(models, "lost+found"), filepath.Join(models, "locked")}
	t.Cleanup(func() {
		for _, d := range locked {
			os.Chmod(d, 0o755)
		}
		os.RemoveAll(base)
	})
	if err := os.Chmod(base, 0o755); err != nil { // traversable by the server's uid
		t.Fatal(err)
	}
	writeBundle(t, filepath.Join(models, "good"), "good", false)
	for _, d := range locked {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		os.WriteFile(filepath.Join(d, "#1234"), []byte("x"), 0o600)
	}
	age(t, models)
	for _, d := range locked {
		if err := os.Chmod(d, 0); err != nil {
			t.Fatal(err)
		}
	}
	asContainerUser(t, locked[1])
	node := newFakeNode()
	r, err := New(Config{Dir: models, Settle: 50 * time.Millisecond}, node)
	if err != nil {
		t.Fatal(err)
	}
	cancel, done := runRepo(r)
	defer func() { cancel(); <-done }()
	if !started(r, 3*time.Second) {
		t.Errorf("not started 3 s on with unreadable folders (good current %q); index: %s", node.current("good"), index(r))
	}
	if !idleWithin(r, 3*time.Second) { // no poll: nothing left to scan for
		t.Errorf("Run (no --repository-poll) still rescanning 3 s on; index: %s", index(r))
	}
	got := index(r)
	if !strings.Contains(got, "good/1 READY") || !strings.Contains(got, "locked/ UNAVAILABLE (models/locked: unreadable (permission denied)") ||
		!strings.Contains(got, "permission denied") || strings.Contains(got, "lost+found") {
		t.Errorf("want good READY, locked UNAVAILABLE for permission, lost+found left out; index: %s", got)
	}
	lctx, lcancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer lcancel()
	// The node's failure, not the client's: 503, as for a file in a
	// version folder that cannot be read.
	if err := r.Load(lctx, "locked"); errdefs.KindOf(err) != errdefs.KindUnavailable || !strings.Contains(err.Error(), "locked: unreadable (permission denied)") {
		t.Errorf("load of the unreadable folder: %v, want 503 naming the permission", err)
	}
}

// DIR was one bundle (KServe's /mnt/models, function "cnn") and now holds
// model folders, one of them cnn/1/: the model cnn follows to its new
// folder (not DIR, the single bundle's), and cnn/1/ deploys.
func TestSingleBundleTurnedIntoModelFolders(t *testing.T) {
	root := filepath.Join(t.TempDir(), "mnt")
	writeBundle(t, root, "cnn", false)
	node := newFakeNode()
	r, err := New(Config{Dir: root, Poll: time.Hour, Settle: 50 * time.Millisecond}, node)
	if err != nil {
		t.Fatal(err)
	}
	r.Scan(context.Background())
	if node.current("cnn") != "1" {
		t.Fatalf("start: %s", index(r))
	}
	for _, f := range []string{"plover.json", "vecadd.so", "b.bin"} {
		os.Remove(filepath.Join(root, f))
	}
	writeBundle(t, filepath.Join(root, "cnn", "1"), "cnn", false)
	os.WriteFile(filepath.Join(root, "cnn", "1", "b.bin"), []byte("other constants"), 0o644)
	age(t, root)
	rec, _ := node.Versions(context.Background(), "cnn")
	before := len(rec.Versions)
	for range 8 {
		r.Scan(context.Background())
		time.Sleep(r.cfg.Settle)
	}
	if rec, _ := node.Versions(context.Background(), "cnn"); rec == nil || len(rec.Versions) == before || !strings.Contains(index(r), "cnn/1 READY") {
		t.Errorf("cnn/1/ not deployed after DIR turned from one bundle into model folders; index: %s", index(r))
	}
}

// An unload holds "through polls until a load, or until its folder
// changes" (README): a folder that changed before the unload, still
// settling when the unload came, is not deployed once it settles, since
// nothing changed after the unload.
func TestUnloadHoldsOverACopySettlingBeforeIt(t *testing.T) {
	ctx := context.Background()
	root, node, r := servingCNN(t, Config{Poll: time.Hour, Settle: 100 * time.Millisecond})
	writeBundle(t, filepath.Join(root, "cnn", "2"), "cnn", true) // a new version being copied
	r.Scan(ctx)                                                  // LOADING: settling
	if err := r.Unload(ctx, "cnn"); err != nil {
		t.Fatal(err)
	}
	for range 4 { // nothing changes after the unload
		time.Sleep(r.cfg.Settle)
		r.Scan(ctx)
	}
	if cur := node.current("cnn"); cur != "" {
		t.Errorf("unloaded, folder unchanged since, yet version %q is deployed and current; index: %s", cur, index(r))
	}
}

// A file whose modification time is in the future (an archive unpacked
// with its times kept, as KServe's storage initializer unpacks a
// .tar.gz, made on a machine whose clock ran ahead) does not keep its
// folder LOADING, and the server unready, until the clock reaches that
// time: the folder settles once it has looked the same for the settle
// time.
func TestFutureModTimeSettles(t *testing.T) {
	models := filepath.Join(t.TempDir(), "models")
	writeBundle(t, filepath.Join(models, "cnn", "1"), "cnn", false)
	future := time.Now().Add(time.Hour)
	os.Chtimes(filepath.Join(models, "cnn", "1", "b.bin"), future, future)
	node := newFakeNode()
	r, _ := New(Config{Dir: models, Settle: 50 * time.Millisecond}, node)
	cancel, done := runRepo(r)
	defer func() { cancel(); <-done }()
	if !started(r, 3*time.Second) || node.current("cnn") != "1" {
		t.Errorf("a folder untouched for 3 s (one file dated an hour ahead) is still not deployed; index: %s", index(r))
	}
}

// Unload of a model whose folder is broken (its manifest names another
// function), so that this server has deployed nothing of it: a function
// of that name deployed otherwise (plover deploy: its current version has
// no version folder's label) is left alone, "functions deployed otherwise
// are left alone" (README), as the scan's removal does; one the repository
// deployed before (a server's earlier run: its current version carries a
// folder's label) is unloaded, as README's unload says (it was left
// serving, the repository's memory of it lost with the restart).
func TestUnloadDeletesOnlyWhatTheRepositoryDeployed(t *testing.T) {
	for _, c := range []struct {
		name, label string
		deleted     bool
	}{{"deployed otherwise", "", false}, {"deployed by an earlier run", "1", true}} {
		t.Run(c.name, func(t *testing.T) {
			ctx := context.Background()
			d := t.TempDir()
			other := filepath.Join(d, "elsewhere", "cnn")
			writeBundle(t, other, "cnn", false)
			node := newFakeNode()
			b, _, _, err := bundle.PackBytes(other)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := node.DeployLabeled(ctx, "cnn", c.label, false, bytes.NewReader(b)); err != nil {
				t.Fatal(err)
			}
			models := filepath.Join(d, "models")
			writeBundle(t, filepath.Join(models, "cnn", "1"), "other", false) // refused: names "other"
			age(t, models)
			r, _ := New(Config{Dir: models, Settle: 50 * time.Millisecond}, node)
			r.Scan(ctx)
			if got := index(r); !strings.Contains(got, "cnn/1 UNAVAILABLE") {
				t.Fatalf("index: %s", got)
			}
			if err := r.Unload(ctx, "cnn"); err != nil {
				t.Fatalf("unload: %v", err)
			}
			if _, err := node.Versions(ctx, "cnn"); (err != nil) != c.deleted {
				t.Errorf("after the unload the function's record: %v; want it deleted %v", err, c.deleted)
			}
		})
	}
}

// A model folder that the scan's look read but that cannot be read a
// moment later, when its versions are listed (it went, a volume's
// hiccup), is no refusal: what it served still shows and serves, and the
// next scan tries again.
func TestReadErrorKeepsWhatServes(t *testing.T) {
	ctx := context.Background()
	_, _, r := servingCNN(t, Config{Poll: time.Hour, Settle: 50 * time.Millisecond})
	r.mu.Lock()
	m := r.models["cnn"]
	r.mu.Unlock()
	r.deploy(ctx, m, nil, fmt.Errorf("models/cnn: %w", syscall.EIO), false) // versionsOf's ReadDir failed
	if got := index(r); !strings.Contains(got, "cnn/ LOADING (models/cnn: unreadable (input/output error): tried again at the next scan)") || !strings.Contains(got, "cnn/1 READY") {
		t.Errorf("after a read error: %s, want cnn/1 still READY beside a LOADING entry", got)
	}
	r.Scan(ctx)
	if got := index(r); got != "cnn/1 READY; " {
		t.Errorf("after the next scan: %s", got)
	}
}

// asContainerUser runs the rest of the test as the container's user, uid
// 10001, where it runs as root (root reads anything): the effective uid
// only, so that root comes back for the cleanup. It skips the test where
// the folder locked, of mode 0, can be read all the same.
func asContainerUser(t *testing.T, locked string) {
	t.Helper()
	if os.Geteuid() == 0 {
		if err := syscall.Seteuid(10001); err != nil {
			t.Skipf("cannot take uid 10001: %v", err)
		}
		t.Cleanup(func() { syscall.Seteuid(0) })
	}
	if _, err := os.ReadDir(locked); err == nil {
		t.Skip("a folder of mode 0 is readable here: nothing to show")
	}
}
