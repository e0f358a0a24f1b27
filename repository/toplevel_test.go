package repository

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// A plover.json appearing at the top of a repository of model folders (a
// stray cp, a directory of that name) neither makes DIR one bundle nor
// deletes a model's function: the models serve on, the log says the
// manifest is left alone. Once the model folders are removed (their
// functions deleted as any removed folder's) and DIR settles, DIR is one
// bundle and deploys.
func TestAManifestAtTheTopOfModelFoldersDeletesNothing(t *testing.T) {
	for _, c := range []struct {
		what  string
		stray func(t *testing.T, root string)
	}{
		{"a bundle's manifest", func(t *testing.T, root string) { writeBundle(t, root, "stray", false) }},
		{"a half-written manifest", func(t *testing.T, root string) {
			os.WriteFile(filepath.Join(root, "plover.json"), []byte(`{"name": "str`), 0o644)
		}},
		{"a directory", func(t *testing.T, root string) { os.Mkdir(filepath.Join(root, "plover.json"), 0o755) }},
	} {
		t.Run(c.what, func(t *testing.T) {
			ctx := context.Background()
			root := filepath.Join(t.TempDir(), "models")
			writeBundle(t, filepath.Join(root, "cnn"), "cnn", false)
			writeBundle(t, filepath.Join(root, "vec", "1"), "vec", false)
			var log bytes.Buffer
			node := newFakeNode()
			r, _ := New(Config{Dir: root, Settle: 10 * time.Millisecond, Poll: time.Second, Log: slog.New(slog.NewTextHandler(&log, nil))}, node)
			r.Scan(ctx)
			want := "cnn/1 READY; vec/1 READY; "
			if got := index(r); got != want {
				t.Fatalf("start: %s", got)
			}
			c.stray(t, root)
			age(t, root)
			for range 4 {
				r.Scan(ctx)
				time.Sleep(2 * r.cfg.Settle)
			}
			if len(node.deletes) > 0 || node.current("cnn") != "1" || node.current("vec") != "1" || node.current("stray") != "" {
				t.Errorf("a %s at the top: deletes %v; cnn %q vec %q stray %q", c.what, node.deletes, node.current("cnn"), node.current("vec"), node.current("stray"))
			}
			// (A directory named plover.json is a folder like any: a
			// model entry with its reason.)
			if got := index(r); !strings.HasPrefix(got, "cnn/1 READY; ") || !strings.HasSuffix(got, "vec/1 READY; ") {
				t.Errorf("index with a %s at the top: %s, want %s", c.what, got, want)
			}
			if n := strings.Count(log.String(), "is left alone: it holds model folders"); n != 1 || !strings.Contains(log.String(), "model_folders=\"[cnn vec]\"") {
				t.Errorf("the log said the manifest is left alone %d times, want once naming cnn and vec:\n%s", n, log.String())
			}
		})
	}
	t.Run("the folders removed", func(t *testing.T) {
		ctx := context.Background()
		root, node, r := cnnBesideATopManifest(t, "one")
		os.RemoveAll(filepath.Join(root, "cnn"))
		age(t, root)
		for range 4 {
			r.Scan(ctx)
			time.Sleep(2 * r.cfg.Settle)
		}
		if got := index(r); got != "one/1 READY; " || strings.Join(node.deletes, ",") != "cnn" {
			t.Errorf("cnn/ removed beside a top manifest: index %s, deletes %v; want one READY, cnn deleted", got, node.deletes)
		}
	})
}

// A volume being filled with one bundle whose subfolder (build/) came
// first: the repository served it as model folders (build/ LOADING). The
// manifest then written at the top makes DIR one bundle only once it
// parses and DIR has settled, and the switch deletes no function.
func TestABundleCopiedAfterItsSubfolderSwitchesOnceSettled(t *testing.T) {
	ctx := context.Background()
	root := filepath.Join(t.TempDir(), "mnt")
	os.MkdirAll(filepath.Join(root, "build", "host"), 0o755)
	os.WriteFile(filepath.Join(root, "build", "host", "vecadd.so"), []byte("lib"), 0o644)
	age(t, root)
	node := newFakeNode()
	r, _ := New(Config{Dir: root, Settle: 200 * time.Millisecond, Poll: time.Second}, node)
	r.Scan(ctx)
	if got := index(r); !strings.HasPrefix(got, "build/ ") {
		t.Fatalf("start: %s", got)
	}
	man := filepath.Join(root, "plover.json")
	writeBundle(t, root, "vecadd", true)
	full, _ := os.ReadFile(man)
	os.WriteFile(man, full[:20], 0o644) // the copy under way
	if !r.Scan(ctx) {
		t.Errorf("a scan with a manifest being written at the top did not ask to scan again")
	}
	if got := index(r); !strings.HasPrefix(got, "build/ ") || node.current("vecadd") != "" {
		t.Errorf("switched while the top manifest does not parse: %s", got)
	}
	os.WriteFile(man, full, 0o644) // the copy ends
	waitFor(t, r, 20, "DIR served as one bundle", func() bool { return node.current("vecadd") == "1" })
	if got := index(r); got != "vecadd/1 READY; " || len(node.deletes) > 0 {
		t.Errorf("after the switch: index %s, deletes %v", got, node.deletes)
	}
}

// A model folder replaced (removed, then copied again, its plover.json
// last) beside a stray top manifest: the scans in between, with no model
// folder left, do not make DIR one bundle at once (only a first scan
// does), so that the model is served again once its copy ends.
func TestAStrayTopManifestOutlastsAModelsReplacement(t *testing.T) {
	ctx := context.Background()
	root, node, r := cnnBesideATopManifest(t, "stray")
	os.RemoveAll(filepath.Join(root, "cnn"))
	r.Scan(ctx) // cnn's function deleted, as any removed folder's
	os.MkdirAll(filepath.Join(root, "cnn"), 0o755)
	os.WriteFile(filepath.Join(root, "cnn", "b.bin"), []byte("constants"), 0o644)
	r.Scan(ctx) // the copy under way: no model folder
	writeBundle(t, filepath.Join(root, "cnn"), "cnn", false)
	age(t, root)
	waitFor(t, r, 10, "cnn served again", func() bool { return node.current("cnn") != "" })
	if node.current("stray") != "" {
		t.Errorf("the stray manifest was deployed: index %s", index(r))
	}
}

// DIR as one bundle, no polling (loads alone): its manifest renamed, a
// load of the new name deploys it (a load of either waited for DIR to
// settle, which only a scan records, and none came: every load 503).
func TestALoadAfterTheSingleBundlesRenameDeploys(t *testing.T) {
	ctx := context.Background()
	root := filepath.Join(t.TempDir(), "models")
	writeBundle(t, root, "saxpy", false)
	node := newFakeNode()
	r, _ := New(Config{Dir: root, Settle: 50 * time.Millisecond}, node)
	r.Scan(ctx)
	writeBundle(t, root, "other", false)
	for i := range 3 {
		r.Load(ctx, "saxpy")
		if err := r.Load(ctx, "other"); err == nil {
			break
		} else if i == 2 {
			t.Errorf("load other: %v", err)
		}
	}
	if node.current("other") == "" {
		t.Errorf("other not deployed; index %s", index(r))
	}
}

// cnnBesideATopManifest is a repository serving the model folder cnn/,
// scanned again once a bundle named top was written at its top.
func cnnBesideATopManifest(t *testing.T, top string) (string, *fakeNode, *Repository) {
	ctx := context.Background()
	root := filepath.Join(t.TempDir(), "models")
	writeBundle(t, filepath.Join(root, "cnn"), "cnn", false)
	node := newFakeNode()
	r, _ := New(Config{Dir: root, Settle: 10 * time.Millisecond, Poll: time.Second}, node)
	r.Scan(ctx)
	writeBundle(t, root, top, false)
	r.Scan(ctx)
	return root, node, r
}
