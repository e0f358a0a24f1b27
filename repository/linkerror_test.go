package repository

import (
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
