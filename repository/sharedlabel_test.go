package repository

import (
	"context"
	"crypto/rand"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/plover-run/plover/api"
	"github.com/plover-run/plover/bundle"
	"github.com/plover-run/plover/errdefs"
)

// labels is rec's version labels.
func labels(rec *api.Record) []string {
	var out []string
	for _, v := range rec.Versions {
		out = append(out, v.Label)
	}
	return out
}

// A version folder another node deployed and this one refuses only by its
// own settings (a bundle over this node's --max-body, rules a newer server
// holds it to) keeps its label in the shared store: node A still serves
// /v2/models/cnn/versions/1 by it, and its index says READY. This node's
// refusal took the label off, and A answered 404. A folder whose content
// is not what the label names (its manifest names another function) still
// loses it.
func TestRefusedHereKeepsASharedLabel(t *testing.T) {
	ctx := context.Background()
	for _, c := range []struct {
		name  string
		here  Config
		after func(t *testing.T, v1 string)
		kept  bool
	}{
		{"over this node's bundle limit", Config{MaxBundleBytes: 100000}, func(*testing.T, string) {}, true},
		{"refused by today's rules", Config{}, func(t *testing.T, v1 string) {
			os.WriteFile(filepath.Join(v1, "plover.json"), []byte(`{"name": "cnn", "abi": 99}`), 0o644)
		}, true},
		{"manifest names another function", Config{}, func(t *testing.T, v1 string) { writeBundle(t, v1, "other", false) }, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			models := filepath.Join(t.TempDir(), "models")
			v1 := filepath.Join(models, "cnn", "1")
			writeBundle(t, v1, "cnn", false)
			big := make([]byte, 200000)
			rand.Read(big)
			os.WriteFile(filepath.Join(v1, "b.bin"), big, 0o644)
			writeBundle(t, filepath.Join(models, "cnn", "2"), "cnn", false)
			age(t, models)
			node := newFakeNode()
			a, _ := New(Config{Dir: models, Poll: time.Hour, Settle: time.Millisecond}, node)
			a.Scan(ctx)
			c.after(t, v1)
			age(t, models)
			c.here.Dir, c.here.Poll, c.here.Settle = models, time.Hour, time.Millisecond
			here, _ := New(c.here, node)
			here.Scan(ctx)
			rec, _ := node.Versions(ctx, "cnn")
			if got := slices.Contains(labels(rec), "1"); got != c.kept {
				t.Errorf("label 1 kept %v (labels %q; index here %q), want %v", got, labels(rec), index(here), c.kept)
			}
		})
	}
}

// A version folder's file that cannot be read now (EIO, EACCES, ESTALE) is
// no bundle refused as it is: the deploy is tried again (503 on load), and
// the version keeps its label. A bundle the rules refuse, or a file
// missing, is refused.
func TestPackReadErrorsMayPass(t *testing.T) {
	for _, c := range []struct {
		name    string
		err     error
		passing bool
	}{
		{"I/O error", &fs.PathError{Op: "read", Path: "/m/cnn/1/b.bin", Err: syscall.EIO}, true},
		{"stale handle", &fs.PathError{Op: "open", Path: "/m/cnn/1/b.bin", Err: syscall.ESTALE}, true},
		{"file missing", &fs.PathError{Op: "open", Path: "/m/cnn/1/b.bin", Err: syscall.ENOENT}, false},
		{"refused by the bundle's rules", &bundle.Error{Reason: "b.bin is a named pipe (FIFO), not a regular file"}, false},
		{"manifest malformed", errors.New("/m/cnn/1/plover.json: unexpected end of JSON input"), false},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := packFailure("models/cnn/1", "/m/cnn/1", c.err)
			if passing(err) != c.passing {
				t.Errorf("%v: passing %v (kind %d), want %v", err, passing(err), errdefs.KindOf(err), c.passing)
			}
		})
	}
}
