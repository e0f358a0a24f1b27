package repository

import (
	"context"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// failStat has stat fail for path as a volume's may (EACCES) until the
// test ends.
func failStat(t *testing.T, path string) {
	t.Helper()
	stat = func(p string) (fs.FileInfo, error) {
		if p == path {
			return nil, &fs.PathError{Op: "stat", Path: p, Err: syscall.EACCES}
		}
		return os.Stat(p)
	}
	t.Cleanup(func() { stat = os.Stat })
}

// A model folder or a version folder that is a link (README's mv -T
// swap) whose target cannot be stat'd now (EACCES, EIO, ESTALE) was taken
// for gone: the model folder's function deleted at once, with no settle,
// or the only version's ("no plover.json and no version folders"). A
// plain folder that cannot be read is UNAVAILABLE while what it deployed
// serves on: so is a linked one.
func TestUnreadableLinkIsNotRemoved(t *testing.T) {
	for _, c := range []struct {
		what string
		link func(models, target string) string // makes the link, returns its path
	}{
		{"model folder", func(models, target string) string {
			return filepath.Join(models, "cnn")
		}},
		{"only version folder", func(models, target string) string {
			os.MkdirAll(filepath.Join(models, "cnn"), 0o755)
			return filepath.Join(models, "cnn", "1")
		}},
	} {
		t.Run(c.what, func(t *testing.T) {
			d := t.TempDir()
			models, target := filepath.Join(d, "models"), filepath.Join(d, "releases", "v1")
			os.MkdirAll(models, 0o755)
			writeBundle(t, target, "cnn", false)
			link := c.link(models, target)
			if err := os.Symlink(target, link); err != nil {
				t.Fatal(err)
			}
			node := newFakeNode()
			r, _ := New(Config{Dir: models, Poll: time.Hour, Settle: 10 * time.Millisecond}, node)
			waitFor(t, r, 10, "cnn served", func() bool { return node.current("cnn") == "1" })
			failStat(t, link)
			waitFor(t, r, 10, "cnn unavailable, or deleted", func() bool {
				return node.current("cnn") == "" || strings.Contains(index(r), "UNAVAILABLE")
			})
			if got := index(r); node.current("cnn") != "1" || !strings.Contains(got, "cnn/ UNAVAILABLE") || !strings.Contains(got, "permission denied") {
				t.Errorf("its link's target unreadable: index %q, deletes %v; want cnn served on, its entry UNAVAILABLE", got, node.deletes)
			}
		})
	}
}

// A linked model folder unreadable for a scan, then readable again as it
// was, shows what it showed before: its entry stayed LOADING ("cannot
// read it yet") for good, the folder being unchanged since its deploy.
func TestLinkUnreadableForAScanComesBack(t *testing.T) {
	d := t.TempDir()
	models, target := filepath.Join(d, "models"), filepath.Join(d, "releases", "v1")
	os.MkdirAll(models, 0o755)
	writeBundle(t, target, "cnn", false)
	link := filepath.Join(models, "cnn")
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
	node := newFakeNode()
	// A settle long enough that the scans below, back to back, never see
	// the unreadable link settle into UNAVAILABLE.
	r, _ := New(Config{Dir: models, Poll: time.Hour, Settle: 5 * time.Second}, node)
	r.Scan(context.Background()) // the first scan takes a folder settled since before it
	if node.current("cnn") != "1" {
		t.Fatalf("cnn not served after the first scan: %s", index(r))
	}
	before := index(r)
	// A link beside the models to a file that cannot be stat'd now either:
	// its name could be no function's, and it is left alone, as the file.
	notes := filepath.Join(models, "notes.txt")
	if err := os.Symlink(filepath.Join(d, "notes.txt"), notes); err != nil {
		t.Fatal(err)
	}
	failStat(t, link)
	inner := stat
	stat = func(p string) (fs.FileInfo, error) {
		if p == notes {
			return nil, &fs.PathError{Op: "stat", Path: p, Err: syscall.EACCES}
		}
		return inner(p)
	}
	r.Scan(context.Background())
	if got := index(r); strings.Contains(got, "notes.txt") {
		t.Fatalf("a link to a file beside the models, unreadable: index %q, want it left out", got)
	}
	if got := index(r); !strings.Contains(got, "LOADING") {
		t.Fatalf("its link's target unreadable for a scan: index %q, want its entry LOADING while it may pass", got)
	}
	stat = os.Stat
	r.Scan(context.Background())
	if got := index(r); got != before || node.current("cnn") != "1" {
		t.Fatalf("readable again as it was: index %q, want %q as before", got, before)
	}
}

// A relative --repository (with a trailing slash, as a shell completes
// it) names a folder's failure once: "models/cnn: unreadable (...)" (the
// reason named the folder twice, models/cnn/models/cnn, the path of the
// error being relative too).
func TestARelativeRepositoryNamesAFolderOnce(t *testing.T) {
	d := t.TempDir()
	t.Chdir(d)
	writeBundle(t, filepath.Join("releases", "v1"), "cnn", false)
	os.MkdirAll("models", 0o755)
	if err := os.Symlink(filepath.Join(d, "releases", "v1"), filepath.Join("models", "cnn")); err != nil {
		t.Fatal(err)
	}
	r, err := New(Config{Dir: "models/", Poll: time.Hour, Settle: 10 * time.Millisecond}, newFakeNode())
	if err != nil {
		t.Fatal(err)
	}
	failStat(t, filepath.Join(d, "models", "cnn"))
	waitFor(t, r, 10, "cnn unavailable", func() bool { return strings.Contains(index(r), "UNAVAILABLE") })
	if got, want := index(r), "cnn/ UNAVAILABLE (models/cnn: unreadable (permission denied): tried again when it changes); "; got != want {
		t.Errorf("index: %s, want %s", got, want)
	}
}
