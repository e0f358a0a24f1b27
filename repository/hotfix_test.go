package repository

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/plover-run/plover/api"
	"github.com/plover-run/plover/internal/testkit"
)

// A plover deploy over a model the repository serves (an operator's
// hot-fix) outlives a restart while the folder is as the repository last
// deployed it: the restart's scan made the folder's version current again,
// rolling the hot-fix back, where the running server had kept it (the
// folder unchanged, nothing to do). A folder changed while the server was
// down, and a load, apply the folder.
func TestHotFixOutlivesARestart(t *testing.T) {
	ctx := context.Background()
	for _, c := range []struct {
		what    string
		between func(t *testing.T, models string, r *Repository)
		hotfix  bool // the plover deploy is current after the restart
	}{
		{"folder as it was", func(*testing.T, string, *Repository) {}, true},
		{"folder touched, same bytes", func(t *testing.T, models string, _ *Repository) {
			now := time.Now().Add(-time.Hour) // at rest, but another time: a change the scan packs
			os.Chtimes(filepath.Join(models, "cnn", "1", "b.bin"), now, now)
		}, true},
		{"lower version folder added", func(t *testing.T, models string, _ *Repository) {
			writeBundle(t, filepath.Join(models, "cnn", "0"), "cnn", false)
		}, true},
		{"folder changed", func(t *testing.T, models string, _ *Repository) {
			os.WriteFile(filepath.Join(models, "cnn", "1", "b.bin"), []byte("new constants"), 0o644)
			age(t, models)
		}, false},
		{"new version folder", func(t *testing.T, models string, _ *Repository) {
			writeBundle(t, filepath.Join(models, "cnn", "2"), "cnn", false)
			os.WriteFile(filepath.Join(models, "cnn", "2", "b.bin"), []byte("v2 constants"), 0o644)
			age(t, models)
		}, false},
	} {
		t.Run(c.what, func(t *testing.T) {
			models := cnnModels(t, "1")
			node := newFakeNode()
			cfg := Config{Dir: models, Settle: time.Millisecond}
			r, _ := New(cfg, node)
			r.Scan(ctx)
			if node.current("cnn") != "1" {
				t.Fatalf("not deployed: %s", index(r))
			}
			hotfix := ploverDeploy(t, r, node, models)
			c.between(t, models, r)

			var log testkit.LogBuffer
			cfg.Log = slog.New(slog.NewTextHandler(&log, nil))
			r2, err := New(cfg, node) // the restart, over the same store
			if err != nil {
				t.Fatal(err)
			}
			r2.Scan(ctx)
			rec, _ := node.Versions(ctx, "cnn")
			said := strings.Contains(log.String(), "not made current")
			if (rec.Current == hotfix) != c.hotfix || said != c.hotfix {
				t.Errorf("after the restart: current %s (the hot-fix %s), logged %v; want the hot-fix current %v, said in the log; log:\n%s", rec.Current, hotfix, said, c.hotfix, log.String())
			}
			if got := index(r2); !strings.Contains(got, "cnn/1 READY") {
				t.Errorf("index %q: want the folder's versions READY", got)
			}
			if err := r2.Load(ctx, "cnn"); err != nil {
				t.Fatal(err)
			}
			if rec, _ := node.Versions(ctx, "cnn"); rec.Current == hotfix {
				t.Errorf("a load kept the hot-fix current: a load applies the folder")
			}
		})
	}
}

// ploverDeploy deploys other bytes of cnn without a label, as plover
// deploy does, and returns its version.
func ploverDeploy(t *testing.T, r *Repository, node *fakeNode, models string) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "hotfix")
	writeBundle(t, dir, "cnn", false)
	os.WriteFile(filepath.Join(dir, "b.bin"), []byte("hot-fixed constants"), 0o644)
	b, _, _, err := r.pack(dir, "")
	if err != nil {
		t.Fatal(err)
	}
	fi, err := node.DeployLabeled(context.Background(), "cnn", "", false, strings.NewReader(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	return fi.Version
}

// A function plover deploy made before the folder's version (listed
// before it in the record) is no hot-fix over the folder: it is current
// only because making the folder's version current failed (the store, a
// moment) after a lower version deployed beside it, or a restart came
// between; the folder's version is made current.
func TestAnEarlierPloverDeployIsReplaced(t *testing.T) {
	ctx := context.Background()
	models := cnnModels(t, "1")
	node := newFakeNode()
	r, _ := New(Config{Dir: models, Settle: time.Millisecond}, node)
	b, sha, _, err := r.pack(filepath.Join(models, "cnn", "1"), "")
	if err != nil || len(b) == 0 {
		t.Fatal(err)
	}
	node.recs["cnn"] = &api.Record{Name: "cnn", Current: "id-plover", Versions: []api.Version{
		{ID: "id-plover", SHA256: "other"}, {ID: "id-folder", SHA256: sha, Label: "1"}}}
	r.Scan(ctx)
	if rec, _ := node.Versions(ctx, "cnn"); rec.Current != "id-folder" {
		t.Errorf("current %s, want the folder's version id-folder over the earlier plover deploy", rec.Current)
	}
}
