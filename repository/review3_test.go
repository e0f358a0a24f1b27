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

// A volume's root (ext4) holds the file system's lost+found, root's and
// of mode 0700: DIR served as one bundle from one (KServe's /mnt/models, a
// claim), or a version folder that is one (mounted at cnn/1, or linked
// there), was walked into it and UNAVAILABLE for good, while /readyz said
// ready.
func TestAVolumesRootServesBesideItsLostFound(t *testing.T) {
	for _, c := range []struct {
		name string
		// make writes the repository under base, returns DIR and the
		// volume's root (where lost+found goes).
		make func(t *testing.T, base string) (dir, volume string)
	}{
		{"DIR one bundle", func(t *testing.T, base string) (string, string) {
			writeBundle(t, filepath.Join(base, "mnt"), "cnn", false)
			return filepath.Join(base, "mnt"), filepath.Join(base, "mnt")
		}},
		{"a version folder", func(t *testing.T, base string) (string, string) {
			writeBundle(t, filepath.Join(base, "models", "cnn", "1"), "cnn", false)
			return filepath.Join(base, "models"), filepath.Join(base, "models", "cnn", "1")
		}},
		{"a linked version folder", func(t *testing.T, base string) (string, string) {
			writeBundle(t, filepath.Join(base, "vol"), "cnn", false)
			os.MkdirAll(filepath.Join(base, "models", "cnn"), 0o755)
			if err := os.Symlink(filepath.Join(base, "vol"), filepath.Join(base, "models", "cnn", "1")); err != nil {
				t.Fatal(err)
			}
			return filepath.Join(base, "models"), filepath.Join(base, "vol")
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			base, err := os.MkdirTemp("", "repository-volume-")
			if err != nil {
				t.Fatal(err)
			}
			dir, volume := c.make(t, base)
			lf := filepath.Join(volume, "lost+found")
			t.Cleanup(func() { os.Chmod(lf, 0o755); os.RemoveAll(base) })
			if err := os.Chmod(base, 0o755); err != nil { // traversable by the server's uid
				t.Fatal(err)
			}
			if err := os.Mkdir(lf, 0); err != nil {
				t.Fatal(err)
			}
			age(t, base)
			asContainerUser(t, lf)
			node := newFakeNode()
			r, err := New(Config{Dir: dir, Poll: time.Hour, Settle: 10 * time.Millisecond}, node)
			if err != nil {
				t.Fatal(err)
			}
			r.Scan(context.Background())
			if got := index(r); node.current("cnn") != "1" || strings.Contains(got, "lost+found") {
				t.Errorf("beside lost+found: current %q, index %s; want cnn deployed", node.current("cnn"), got)
			}
		})
	}
}

// A manifest at DIR's top that does not parse once DIR settled (a stray,
// broken file; a copy that paused longer than Settle), beside a folder
// that is no model's, had Run scan every Settle for good, each scan
// walking every folder and listing the store, and nothing said why. It is
// said once, scanned again on the retries' back-off, and once it parses
// DIR serves as one bundle, no kick needed.
func TestABrokenManifestAtTheTopIsSaidOnce(t *testing.T) {
	const settle = 20 * time.Millisecond
	root := filepath.Join(t.TempDir(), "models")
	if err := os.MkdirAll(filepath.Join(root, "data"), 0o755); err != nil {
		t.Fatal(err)
	}
	age(t, root)
	var log bytes.Buffer
	node := newFakeNode()
	r, err := New(Config{Dir: root, Settle: settle, Log: slog.New(slog.NewTextHandler(&log, nil))}, node)
	if err != nil {
		t.Fatal(err)
	}
	cancel, done := runRepo(r)
	defer func() { cancel(); <-done }()
	if !started(r, 3*time.Second) || !idleWithin(r, 3*time.Second) {
		t.Fatalf("not started and idle at first: %s", index(r))
	}
	if err := os.WriteFile(filepath.Join(root, "plover.json"), []byte(`{"name": "vec`), 0o644); err != nil {
		t.Fatal(err)
	}
	r.kick()
	scans := func() int { r.mu.Lock(); defer r.mu.Unlock(); return r.scans }
	start := time.Now()
	for n := scans(); scans() < n+40 && time.Since(start) < 2*time.Second; {
		time.Sleep(settle / 4)
	}
	// Every Settle for 2 s is 100 scans; on the back-off, from Settle
	// doubling, 7.
	if n := scans(); n > 20 {
		t.Errorf("%d scans in 2 s of a broken manifest at the top (settle %v), want them backing off", n, settle)
	}
	writeBundle(t, root, "vecadd", false)
	for end := time.Now().Add(10 * time.Second); node.current("vecadd") == "" && time.Now().Before(end); {
		time.Sleep(settle)
	}
	if node.current("vecadd") == "" {
		t.Errorf("the manifest at the top parses now: not deployed 10 s on, no kick (index %s)", index(r))
	}
	cancel()
	<-done // the log is Run's to write until then
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
