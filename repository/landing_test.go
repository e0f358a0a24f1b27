package repository

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/plover-run/plover/api"
	"github.com/plover-run/plover/bundle"
)

// racingNode lands a plover deploy of name (an unlabelled version made
// current) once, at the moment at names: "read" as the unload or removal
// reads the record a second time (deleteOurs' read, after the read that
// decided the function was the repository's), "delete" as the delete
// begins (after every read of the repository's).
type racingNode struct {
	*fakeNode
	at    string
	body  []byte // nil: a rollback to the first version lands instead
	once  sync.Once
	reads int
}

func (n *racingNode) land(ctx context.Context) {
	n.once.Do(func() {
		if n.body == nil {
			n.fakeNode.Rollback(ctx, "cnn", "id-1")
			return
		}
		n.fakeNode.DeployLabeled(ctx, "cnn", "", false, bytes.NewReader(n.body))
	})
}

func (n *racingNode) Versions(ctx context.Context, name string) (*api.Record, error) {
	n.mu.Lock()
	n.reads++
	second := n.reads == 2
	n.mu.Unlock()
	if n.at == "read" && second {
		n.land(ctx)
	}
	return n.fakeNode.Versions(ctx, name)
}

func (n *racingNode) DeleteCurrent(ctx context.Context, name, version string) error {
	if n.at == "delete" {
		n.land(ctx)
	}
	return n.fakeNode.DeleteCurrent(ctx, name, version)
}

// A plover deploy (a token's hot-fix) that lands while the repository
// unloads its function, or deletes it for its removed folder, is left
// alone, as it is when it landed before: README's "functions deployed
// otherwise are left alone". The unload or removal read the record, took
// the function for its own, and deleted the whole record, the deploy with
// it.
func TestADeployLandingAsTheRepositoryDeletesIsLeftAlone(t *testing.T) {
	for _, how := range []string{"unload", "folder removed"} {
		for _, at := range []string{"read", "delete"} {
			t.Run(how+"/"+at, func(t *testing.T) {
				ctx := context.Background()
				d := t.TempDir()
				hotfix := filepath.Join(d, "hotfix", "cnn")
				writeBundle(t, hotfix, "cnn", false)
				body, _, _, err := bundle.PackBytes(hotfix)
				if err != nil {
					t.Fatal(err)
				}
				root := filepath.Join(d, "models")
				writeBundle(t, filepath.Join(root, "cnn", "1"), "cnn", false)
				age(t, root)
				node := &racingNode{fakeNode: newFakeNode(), body: body}
				r, err := New(Config{Dir: root, Settle: time.Millisecond}, node)
				if err != nil {
					t.Fatal(err)
				}
				r.Scan(ctx)
				if got := index(r); got != "cnn/1 READY; " {
					t.Fatalf("start: %s", got)
				}
				node.mu.Lock()
				node.at, node.reads = at, 0
				node.mu.Unlock()
				unloadOrRemove(t, r, root, how)
				rec, err := node.fakeNode.Versions(ctx, "cnn")
				if err != nil {
					t.Fatalf("the deploy that landed meanwhile went with the repository's function: %v", err)
				}
				if v, _ := rec.CurrentVersion(); v.Label != "" {
					t.Fatalf("current version %+v; want the plover deploy's (no label)", v)
				}
			})
		}
	}
}

// A rollback to another of the folders' versions that lands as the
// repository deletes the function leaves it the repository's: it is
// deleted all the same. Taken for a landing that was someone else's, it
// was left serving for good, with no folder and no entry in the index.
func TestARollbackLandingAsTheRepositoryDeletesIsStillDeleted(t *testing.T) {
	for _, how := range []string{"unload", "folder removed"} {
		t.Run(how, func(t *testing.T) {
			ctx := context.Background()
			root := filepath.Join(t.TempDir(), "models")
			writeBundle(t, filepath.Join(root, "cnn", "1"), "cnn", false)
			writeBundle(t, filepath.Join(root, "cnn", "2"), "cnn", true)
			age(t, root)
			node := &racingNode{fakeNode: newFakeNode()}
			r, err := New(Config{Dir: root, Settle: time.Millisecond}, node)
			if err != nil {
				t.Fatal(err)
			}
			r.Scan(ctx)
			if rec, err := node.fakeNode.Versions(ctx, "cnn"); err != nil || rec.Current != "id-2" {
				t.Fatalf("start: %+v, %v; want version 2 (id-2) current", rec, err)
			}
			node.mu.Lock()
			node.at = "delete"
			node.mu.Unlock()
			unloadOrRemove(t, r, root, how)
			if rec, err := node.fakeNode.Versions(ctx, "cnn"); err == nil {
				t.Fatalf("the function is still there, current %s; want it deleted", rec.Current)
			}
		})
	}
}

// unloadOrRemove takes cnn from r as how says: an unload, or its folder
// under root removed and a scan.
func unloadOrRemove(t *testing.T, r *Repository, root, how string) {
	t.Helper()
	ctx := context.Background()
	if how == "unload" {
		if err := r.Unload(ctx, "cnn"); err != nil {
			t.Fatalf("unload: %v", err)
		}
		return
	}
	if err := os.RemoveAll(filepath.Join(root, "cnn")); err != nil {
		t.Fatal(err)
	}
	scanEmptied(ctx, r)
}
