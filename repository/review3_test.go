package repository

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/plover-run/plover/errdefs"
)

// DIR served as one bundle from a volume's root (KServe's /mnt/models, a
// claim on ext4) holds the file system's lost+found, root's and of mode
// 0700: the look at DIR walked into it, and the only model was
// UNAVAILABLE for good, while /readyz said ready.
func TestASingleBundleAtAVolumesRootDeploys(t *testing.T) {
	base, err := os.MkdirTemp("", "repository-volume-")
	if err != nil {
		t.Fatal(err)
	}
	mnt := filepath.Join(base, "mnt")
	lf := filepath.Join(mnt, "lost+found")
	t.Cleanup(func() { os.Chmod(lf, 0o755); os.RemoveAll(base) })
	if err := os.Chmod(base, 0o755); err != nil { // traversable by the server's uid
		t.Fatal(err)
	}
	writeBundle(t, mnt, "cnn", false)
	if err := os.Mkdir(lf, 0); err != nil {
		t.Fatal(err)
	}
	age(t, mnt)
	asContainerUser(t, lf)
	node := newFakeNode()
	r, err := New(Config{Dir: mnt, Poll: time.Hour, Settle: 10 * time.Millisecond}, node)
	if err != nil {
		t.Fatal(err)
	}
	r.Scan(context.Background())
	if got := index(r); node.current("cnn") != "1" || strings.Contains(got, "lost+found") {
		t.Errorf("DIR one bundle beside lost+found: current %q, index %s; want cnn deployed", node.current("cnn"), got)
	}
}

// A manifest at DIR's top that never parses (a stray, broken file), beside
// a folder that is no model's, had Run scan every Settle for good, each
// scan walking every folder and listing the store, and nothing said why.
// Once DIR has settled so, Run waits for a kick, the log says it once, and
// DIR is served as model folders.
func TestABrokenManifestAtTheTopIsSaidOnce(t *testing.T) {
	root := filepath.Join(t.TempDir(), "models")
	if err := os.MkdirAll(filepath.Join(root, "data"), 0o755); err != nil {
		t.Fatal(err)
	}
	age(t, root)
	var log bytes.Buffer
	r, err := New(Config{Dir: root, Settle: 20 * time.Millisecond, Log: slog.New(slog.NewTextHandler(&log, nil))}, newFakeNode())
	if err != nil {
		t.Fatal(err)
	}
	cancel, done := runRepo(r)
	if !started(r, 3*time.Second) || !idleWithin(r, 3*time.Second) {
		cancel()
		<-done
		t.Fatalf("not started and idle at first: %s", index(r))
	}
	if err := os.WriteFile(filepath.Join(root, "plover.json"), []byte(`{"name": "x"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	w0 := r.waits.Load()
	r.kick()
	for end := time.Now().Add(3 * time.Second); r.waits.Load() == w0 && time.Now().Before(end); {
		time.Sleep(time.Millisecond) // until Run took the kick and waits again
	}
	idle := idleWithin(r, 3*time.Second)
	for range 3 { // more kicks: the log says it once for DIR as it is
		r.kick()
		idleWithin(r, time.Second)
	}
	cancel()
	<-done
	if !idle {
		t.Errorf("Run still scanning 3 s after a broken manifest at the top settled; index: %s", index(r))
	}
	if n := strings.Count(log.String(), "at its top does not parse"); n != 1 {
		t.Errorf("the log said the broken manifest %d times, want once:\n%s", n, log.String())
	}
}

// DIR as one bundle, its manifest rewritten in place: the index's reason
// names the manifest from DIR's own name, not the server's path (the
// index is a read-scope token's to see).
func TestASingleBundlesReasonNamesNoServerPath(t *testing.T) {
	root := filepath.Join(t.TempDir(), "models")
	writeBundle(t, root, "vecadd", false)
	node := newFakeNode()
	r, err := New(Config{Dir: root, Poll: time.Hour, Settle: 30 * time.Second}, node) // written a minute back
	if err != nil {
		t.Fatal(err)
	}
	r.Scan(context.Background())
	if node.current("vecadd") != "1" {
		t.Fatalf("start: %s", index(r))
	}
	if err := os.WriteFile(filepath.Join(root, "plover.json"), []byte(`{"name": "vec`), 0o644); err != nil {
		t.Fatal(err)
	}
	r.Scan(context.Background())
	if got := index(r); !strings.Contains(got, "LOADING") || strings.Contains(got, root) || !strings.Contains(got, "models/plover.json") {
		t.Errorf("index while the manifest is rewritten: %s, want LOADING naming models/plover.json, not %s", got, root)
	}
}

// A version folder whose constants are a sparse file of 5 GiB (truncate
// -s) compresses to under any bound on a bundle: it was read whole (about
// 7 s a GiB here) while every load waited, to be refused by the node. It
// is refused, 413, before a byte is read.
func TestAHugeSparseFileIsRefusedUnread(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "cnn", "1")
	writeBundle(t, dir, "cnn", false)
	if err := os.Truncate(filepath.Join(dir, "b.bin"), 5<<30); err != nil {
		t.Fatal(err)
	}
	r, err := New(Config{Dir: filepath.Dir(filepath.Dir(dir)), Poll: time.Hour, Settle: time.Hour, MaxBundleBytes: 256 << 20}, newFakeNode())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() { _, _, _, err := r.pack(dir, ""); done <- err }()
	select {
	case err := <-done:
		if errdefs.KindOf(err) != errdefs.KindTooLarge || !strings.Contains(err.Error(), "b.bin") || strings.Contains(err.Error(), dir) {
			t.Errorf("packing 5 GiB of sparse constants: %v, want 413 naming b.bin (not the server's path)", err)
		}
	case <-ctx.Done():
		t.Errorf("packing 5 GiB of sparse constants still running 20 s on: read, not refused")
	}
}
