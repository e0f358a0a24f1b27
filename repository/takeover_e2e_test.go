package repository_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/plover-run/plover/engine"
	"github.com/plover-run/plover/errdefs"
	"github.com/plover-run/plover/internal/testkit"
	"github.com/plover-run/plover/repository"
)

// A function deployed otherwise (plover deploy) before a folder of its
// name appeared is taken over by the folder, and when the folder goes or
// is unloaded it is not deleted (it was, its whole record with it, the
// plover deploy's versions too, perhaps another tenant's): refused as a
// function a pipeline runs is (409 for an unload; UNAVAILABLE with the
// reason for a removed folder, tried again at each scan), serving on,
// until its owner rolls it back or deletes it. A function the repository
// made itself is deleted as before, though one of its version folders
// went first (its version unlabelled, which is no plover deploy's).
func TestAFunctionTheFolderTookOverIsNotDeleted(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name           string
		byHand, unload bool
	}{
		{"taken over, folder removed", true, false},
		{"taken over, unloaded", true, true},
		{"the repository's own, folder removed", false, false},
		{"the repository's own, unloaded", false, true},
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
			// version, which is no plover deploy's.
			os.RemoveAll(filepath.Join(models, "cnn", "1"))
			r.Scan(ctx)
			before, err := e.Control().Versions(ctx, "cnn")
			if err != nil || before.Current == hand {
				t.Fatalf("the folder did not take cnn over: %+v, %v", before, err)
			}
			var refusal error
			if tc.unload {
				refusal = r.Unload(ctx, "cnn")
			} else {
				os.RemoveAll(filepath.Join(models, "cnn"))
				repository.ScanEmptied(ctx, r)
			}
			rec, err := e.Control().Versions(ctx, "cnn")
			if !tc.byHand {
				if refusal != nil || errdefs.KindOf(err) != errdefs.KindNotFound {
					t.Fatalf("the repository's own cnn after its folder went: %v; %+v, %v; want it deleted", refusal, rec, err)
				}
				return
			}
			if err != nil || rec.Current != before.Current {
				t.Fatalf("cnn after its folder went: %+v, %v; want it kept as it was (%s current)", rec, err, before.Current)
			}
			why := "current when its folder took it over (" + hand
			if tc.unload {
				if errdefs.KindOf(refusal) != errdefs.KindConflict || !strings.Contains(refusal.Error(), why) {
					t.Fatalf("the unload: %v; want a 409 saying %q", refusal, why)
				}
				return
			}
			if got := indexOf(r); !strings.Contains(got, "UNAVAILABLE") || !strings.Contains(got, why) {
				t.Errorf("index %q: want cnn UNAVAILABLE saying %q", got, why)
			}
			// Its owner gives it back: the next scan leaves it alone.
			if _, err := e.Control().Rollback(ctx, "cnn", hand); err != nil {
				t.Fatal(err)
			}
			r.Scan(ctx)
			if rec, err := e.Control().Versions(ctx, "cnn"); err != nil || rec.Current != hand {
				t.Errorf("after its owner's rollback and a scan: %+v, %v; want %s current", rec, err, hand)
			}
			if got := indexOf(r); strings.Contains(got, "cnn") {
				t.Errorf("index %q: want the removed folder's entry gone", got)
			}
		})
	}
}

// indexOf is r's index as one line: each entry's name, version, state and
// reason.
func indexOf(r *repository.Repository) string {
	var b strings.Builder
	for _, m := range r.Index(context.Background(), false) {
		fmt.Fprintf(&b, "%s/%s %s (%s); ", m.Name, m.Version, m.State, m.Reason)
	}
	return b.String()
}
