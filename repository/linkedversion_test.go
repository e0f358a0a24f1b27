package repository

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/plover-run/plover/bundle"
)

// A version folder that is a link (cnn/2 -> releases/v2) is looked into:
// a file rewritten in place in the folder it points at, after it settled,
// is a change deployed again under its label (the link and the linked
// directory's own time and size stay the same), and a file still being
// written there keeps it LOADING.
func TestLinkedVersionFolderFilesChange(t *testing.T) {
	for _, c := range []struct {
		what  string
		write func(t *testing.T, file string)
	}{
		{"rewritten in place", func(t *testing.T, file string) {
			if err := os.WriteFile(file, []byte("new lib!"), 0o644); err != nil {
				t.Fatal(err)
			}
		}},
		{"appended to", func(t *testing.T, file string) {
			f, err := os.OpenFile(file, os.O_APPEND|os.O_WRONLY, 0)
			if err != nil {
				t.Fatal(err)
			}
			f.WriteString(" and more")
			f.Close()
		}},
	} {
		t.Run(c.what, func(t *testing.T) {
			ctx := context.Background()
			d := t.TempDir()
			models, rel := filepath.Join(d, "models"), filepath.Join(d, "releases", "v2")
			writeBundle(t, filepath.Join(models, "cnn", "1"), "cnn", false)
			writeBundle(t, rel, "cnn", false)
			if err := os.Symlink(rel, filepath.Join(models, "cnn", "2")); err != nil {
				t.Fatal(err)
			}
			age(t, d)
			node := newFakeNode()
			r, err := New(Config{Dir: models, Poll: time.Hour, Settle: 50 * time.Millisecond}, node)
			if err != nil {
				t.Fatal(err)
			}
			r.Scan(ctx)
			if node.current("cnn") != "2" {
				t.Fatalf("start: current %q; %s", node.current("cnn"), index(r))
			}
			relInfo, _ := os.Stat(rel)
			c.write(t, filepath.Join(rel, "vecadd.so"))
			if now, _ := os.Stat(rel); !now.ModTime().Equal(relInfo.ModTime()) {
				t.Fatalf("the linked directory's time changed: the test does not test what it means to")
			}
			// Still being written: not deployed at this scan.
			r.Scan(ctx)
			_, half, _, _ := bundle.PackBytes(rel)
			if got := labelSHA(node, "cnn", "2"); got == half {
				t.Fatalf("a file just written in a linked version folder was deployed before it settled")
			}
			waitFor(t, r, 5, "the linked version folder's changed file deployed again", func() bool {
				return labelSHA(node, "cnn", "2") == half
			})
		})
	}
}
