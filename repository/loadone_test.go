package repository

import (
	"context"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/plover-run/plover/errdefs"
)

// A load of one model looks at that model's folder alone: it fingerprinted
// every folder of the repository (a walk of each, a stat of each link), so
// that a load's cost grew with the repository and waited on any folder a
// volume stalled. The other folders here are links, whose stat the test
// counts (the walk of a plain folder has no seam).
func TestLoadLooksAtItsFolderAlone(t *testing.T) {
	ctx := context.Background()
	d := t.TempDir()
	models := filepath.Join(d, "models")
	writeBundle(t, filepath.Join(models, "cnn", "1"), "cnn", false)
	for i := range 10 {
		name := "m" + strconv.Itoa(i)
		target := filepath.Join(d, "releases", name)
		writeBundle(t, filepath.Join(target, "1"), name, false)
		if err := os.Symlink(target, filepath.Join(models, name)); err != nil {
			t.Fatal(err)
		}
	}
	age(t, models)
	node := newFakeNode()
	r, err := New(Config{Dir: models, Poll: time.Hour, Settle: time.Millisecond}, node)
	if err != nil {
		t.Fatal(err)
	}
	r.Scan(ctx)
	if node.current("cnn") != "1" || node.current("m9") != "1" {
		t.Fatalf("not deployed: %s", index(r))
	}
	if err := r.Unload(ctx, "cnn"); err != nil {
		t.Fatal(err)
	}
	var others atomic.Int32
	stat = func(p string) (fs.FileInfo, error) {
		if filepath.Dir(p) == models && filepath.Base(p) != "cnn" {
			others.Add(1)
		}
		return os.Stat(p)
	}
	t.Cleanup(func() { stat = os.Stat })
	if err := r.Load(ctx, "cnn"); err != nil {
		t.Fatal(err)
	}
	if node.current("cnn") != "1" {
		t.Fatalf("load of cnn deployed nothing: %s", index(r))
	}
	if n := others.Load(); n != 0 {
		t.Errorf("a load of cnn looked at the other model folders (%d stats of their links), want none", n)
	}
}

// A load names one folder of DIR, never a path: a name reaching past DIR
// (a folder beside it) is no model of the repository (404), nor are the
// names list leaves out.
func TestLoadNamesNoPath(t *testing.T) {
	ctx := context.Background()
	d := t.TempDir()
	models := filepath.Join(d, "models")
	writeBundle(t, filepath.Join(models, "cnn", "1"), "cnn", false)
	writeBundle(t, filepath.Join(d, "other", "1"), "other", false)
	writeBundle(t, filepath.Join(models, ".hidden", "1"), "hidden", false)
	age(t, d)
	node := newFakeNode()
	r, err := New(Config{Dir: models, Poll: time.Hour, Settle: time.Millisecond}, node)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"../other", "..", ".", "", ".hidden", "cnn/1", "cnn\x00", strings.Repeat("a", 300)} {
		if err := r.Load(ctx, name); errdefs.KindOf(err) != errdefs.KindNotFound {
			t.Errorf("load %q: %v, want 404", name, err)
		}
	}
	if len(node.recs) != 0 {
		t.Errorf("deployed %v, want nothing", node.recs)
	}
	if err := r.Load(ctx, "cnn"); err != nil || node.current("cnn") != "1" {
		t.Errorf("load cnn: %v, current %q", err, node.current("cnn"))
	}
}

// A load right after a copy deploys the folder once it has been still
// for the settle time, as a scan would, not the copy as it is so far; a
// folder that goes on changing is 503 (still being copied), and a load
// whose deadline comes first is 504.
func TestLoadWaitsForItsFolderToSettle(t *testing.T) {
	const settle = 300 * time.Millisecond
	for _, c := range []struct {
		what     string
		writes   int           // rewrites of b.bin, one every settle/3 after the load began
		deadline time.Duration // the load's
		kind     errdefs.Kind
		deployed string // b.bin's bytes deployed, "" for none
	}{
		{"just copied, a file written again", 1, 10 * time.Second, errdefs.KindInternal, "v1"},
		{"written on", 12, 10 * time.Second, errdefs.KindUnavailable, ""},
		{"a short deadline", 0, settle / 3, errdefs.KindTimeout, ""},
	} {
		t.Run(c.what, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), c.deadline)
			defer cancel()
			models := filepath.Join(t.TempDir(), "models")
			dir := filepath.Join(models, "cnn", "1")
			writeBundle(t, dir, "cnn", true)
			os.WriteFile(filepath.Join(dir, "b.bin"), []byte("v0"), 0o644)
			node := newFakeNode()
			r, _ := New(Config{Dir: models, Poll: time.Hour, Settle: settle}, node)
			done := make(chan struct{})
			go func() {
				defer close(done)
				for i := 1; i <= c.writes; i++ {
					time.Sleep(settle / 3)
					os.WriteFile(filepath.Join(dir, "b.bin"), []byte("v"+strconv.Itoa(i)), 0o644)
				}
			}()
			err := r.Load(ctx, "cnn")
			<-done
			if c.deployed == "" {
				if errdefs.KindOf(err) != c.kind || node.current("cnn") != "" {
					t.Fatalf("load: %v (kind %d), current %q; want kind %d and nothing deployed", err, errdefs.KindOf(err), node.current("cnn"), c.kind)
				}
				if c.kind == errdefs.KindUnavailable && !strings.Contains(err.Error(), "still being copied") {
					t.Errorf("load of a folder being written: %v, want it to say it is still being copied", err)
				}
				return
			}
			if err != nil {
				t.Fatalf("load: %v", err)
			}
			if got := node.constants("cnn"); got != c.deployed {
				t.Errorf("deployed constants %q, want %q", got, c.deployed)
			}
		})
	}
}

// A load waiting for its folder to settle gives the repository's turn up
// meanwhile: another model's load (and the scans) go on, where they waited
// up to twice the settle time.
func TestALoadWaitingToSettleHoldsNobody(t *testing.T) {
	models := filepath.Join(t.TempDir(), "models")
	writeBundle(t, filepath.Join(models, "cnn", "1"), "cnn", true) // just written
	writeBundle(t, filepath.Join(models, "vec", "1"), "vec", false)
	node := newFakeNode()
	r, err := New(Config{Dir: models, Poll: time.Hour, Settle: time.Minute}, node)
	if err != nil {
		t.Fatal(err)
	}
	waiting := make(chan struct{})
	var once sync.Once // called at each wait
	settling = func(name string) {
		if name == "cnn" {
			once.Do(func() { close(waiting) })
		}
	}
	defer func() { settling = func(string) {} }()
	ctx, cancel := context.WithCancel(context.Background())
	cnn := make(chan error, 1)
	go func() { cnn <- r.Load(ctx, "cnn") }()
	<-waiting
	loaded := make(chan error, 1)
	go func() { loaded <- r.Load(context.Background(), "vec") }()
	select {
	case err := <-loaded:
		if err != nil || node.current("vec") == "" {
			t.Errorf("vec's load beside cnn's wait: %v, current %q", err, node.current("vec"))
		}
	case err := <-cnn:
		t.Fatalf("cnn's load returned first: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("vec's load waited for cnn's folder to settle")
	}
	scanned := make(chan struct{}) // a scan too
	go func() { r.Scan(context.Background()); close(scanned) }()
	select {
	case <-scanned:
	case <-time.After(30 * time.Second):
		t.Fatal("a scan waited for cnn's folder to settle")
	}
	cancel()
	if err := <-cnn; errdefs.KindOf(err) != errdefs.KindGone || node.current("cnn") != "" {
		t.Errorf("cnn's load, its client gone while it waited: %v, current %q", err, node.current("cnn"))
	}
}
