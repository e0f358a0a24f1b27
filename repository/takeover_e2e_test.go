package repository_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/plover-run/plover/engine"
	"github.com/plover-run/plover/errdefs"
	"github.com/plover-run/plover/internal/testkit"
	"github.com/plover-run/plover/repository"
)

// A function deployed otherwise (plover deploy) before a folder of its
// name appeared is taken over by the folder, and given back when the
// folder goes or is unloaded: its version from before is current again,
// the folders' labels off, not deleted with them (it was, whole record
// and all). A function the repository made itself is deleted as before,
// though one of its version folders went first (its version unlabelled:
// a first give-back took that version for one deployed otherwise and left
// the function serving, unowned).
func TestAFunctionTheFolderTookOverIsGivenBack(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name      string
		byHand    bool // cnn deployed by plover deploy before the folder
		unload    bool // else the folder removed
		givenBack bool
	}{
		{"taken over, folder removed", true, false, true},
		{"taken over, unloaded", true, true, true},
		{"the repository's own, folder removed", false, false, false},
		{"the repository's own, unloaded", false, true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := testkit.Engine(t, engine.Config{})
			var hand string
			if tc.byHand {
				m := testkit.Manifest("cnn")
				m.OutBytes = 128 // other bytes than the folders'
				hand = testkit.Deploy(t, e, testkit.BundleDir(t, m, nil)).Version
			}
			models := cnnModels(t, "1", "2")
			r, err := repository.New(repository.Config{Dir: models, Poll: time.Hour, Settle: 50 * time.Millisecond}, e.Control())
			if err != nil {
				t.Fatal(err)
			}
			r.Scan(ctx)
			// A version folder goes first: the repository unlabels its
			// version, which is no version deployed otherwise.
			os.RemoveAll(filepath.Join(models, "cnn", "1"))
			r.Scan(ctx)
			if rec, err := e.Control().Versions(ctx, "cnn"); err != nil || rec.Current == hand {
				t.Fatalf("the folder did not take cnn over: %+v, %v", rec, err)
			}
			if tc.unload {
				if err := r.Unload(ctx, "cnn"); err != nil {
					t.Fatal(err)
				}
			} else {
				os.RemoveAll(filepath.Join(models, "cnn"))
				r.Scan(ctx)
			}
			rec, err := e.Control().Versions(ctx, "cnn")
			if !tc.givenBack {
				if errdefs.KindOf(err) != errdefs.KindNotFound {
					t.Fatalf("the repository's own cnn after its folder went: %+v, %v; want it deleted", rec, err)
				}
				return
			}
			if err != nil {
				t.Fatalf("cnn was deleted: %v", err)
			}
			if rec.Current != hand {
				t.Errorf("current %s, want %s, deployed before the folder", rec.Current, hand)
			}
			for _, v := range rec.Versions {
				if v.Label != "" {
					t.Errorf("version %s keeps the folder's label %q", v.ID, v.Label)
				}
			}
			r.Scan(ctx) // the next scan takes it no more
			if rec, err := e.Control().Versions(ctx, "cnn"); err != nil || rec.Current != hand {
				t.Errorf("after the next scan: %+v, %v; want %s current", rec, err, hand)
			}
		})
	}
}
