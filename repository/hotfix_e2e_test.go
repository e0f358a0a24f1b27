package repository_test

import (
	"bytes"
	"context"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/plover-run/plover/bundle"
	"github.com/plover-run/plover/engine"
	"github.com/plover-run/plover/internal/testkit"
	"github.com/plover-run/plover/objectstore"
	"github.com/plover-run/plover/repository"
)

// A hot-fix deployed with plover deploy over a repository's model is
// still current after the server restarts over the same store and the
// same, unchanged folder (it was rolled back to the folder's version),
// and the log says why the folder was not applied; a load applies it.
func TestHotFixOutlivesAServerRestart(t *testing.T) {
	ctx := context.Background()
	models := cnnModels(t, "1")
	storeDir := filepath.Join(t.TempDir(), "store")
	node := func(log *slog.Logger) (*engine.Engine, *repository.Repository) {
		s, err := objectstore.NewFS(storeDir)
		if err != nil {
			t.Fatal(err)
		}
		e := testkit.Engine(t, engine.Config{Store: s})
		r, err := repository.New(repository.Config{Dir: models, Settle: 50 * time.Millisecond, Log: log}, e.Control())
		if err != nil {
			t.Fatal(err)
		}
		return e, r
	}
	e1, r1 := node(nil)
	r1.Scan(ctx)
	rec, err := e1.Control().Versions(ctx, "cnn")
	if err != nil {
		t.Fatal(err)
	}
	folder := rec.Current

	m := testkit.Manifest("cnn")
	m.MaxInputBytes = 1 << 15 // other bytes than the folder's
	var b bytes.Buffer
	if _, err := bundle.PackWithin(testkit.BundleDir(t, m, nil), "", &b); err != nil {
		t.Fatal(err)
	}
	fix, err := e1.Control().Deploy(ctx, "cnn", &b, false)
	if err != nil {
		t.Fatal(err)
	}
	e1.Close() // the server stops

	var log testkit.LogBuffer
	e2, r2 := node(slog.New(slog.NewTextHandler(&log, nil)))
	r2.Scan(ctx)
	rec, err = e2.Control().Versions(ctx, "cnn")
	if err != nil {
		t.Fatal(err)
	}
	if rec.Current != fix.Version || !strings.Contains(log.String(), "not made current") {
		t.Errorf("after the restart current is %s (the folder's %s, the hot-fix %s); want the hot-fix, and the log saying why:\n%s", rec.Current, folder, fix.Version, log.String())
	}
	if err := r2.Load(ctx, "cnn"); err != nil {
		t.Fatal(err)
	}
	if rec, _ = e2.Control().Versions(ctx, "cnn"); rec.Current != folder {
		t.Errorf("after a load current is %s, want the folder's %s", rec.Current, folder)
	}
}
