package repository_test

import (
	"context"
	"crypto/rand"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/plover-run/plover/engine"
	"github.com/plover-run/plover/errdefs"
	"github.com/plover-run/plover/fileutil"
	"github.com/plover-run/plover/httpapi"
	"github.com/plover-run/plover/internal/testkit"
	"github.com/plover-run/plover/repository"
)

// copyFiles links or copies the named files of src into dir.
func copyFiles(t *testing.T, src, dir string, files ...string) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		if err := fileutil.LinkOrCopy(filepath.Join(src, f), filepath.Join(dir, f)); err != nil {
			t.Fatal(err)
		}
	}
}

// ageAll sets the times of everything under dir a minute back: at rest.
func ageAll(dir string) {
	old := time.Now().Add(-time.Minute)
	filepath.Walk(dir, func(p string, _ os.FileInfo, err error) error { os.Chtimes(p, old, old); return err })
}

// cnnModels lays out models/cnn/V/ for each version V, copies of one
// bundle of cnn, at rest, and returns the models folder.
func cnnModels(t *testing.T, versions ...string) string {
	t.Helper()
	src := testkit.BundleDir(t, testkit.Manifest("cnn"), nil)
	models := filepath.Join(t.TempDir(), "models")
	for _, v := range versions {
		copyFiles(t, src, filepath.Join(models, "cnn", v), "plover.json", "kernels.so")
	}
	ageAll(models)
	return models
}

// servePolled serves the repository at models, polled (every hour: the
// test scans), on a real engine and server, once scanned; it returns the
// repository and the server's URL.
func servePolled(t *testing.T, models string) (*repository.Repository, string) {
	t.Helper()
	e := testkit.Engine(t, engine.Config{})
	r, err := repository.New(repository.Config{Dir: models, Poll: time.Hour, Settle: 50 * time.Millisecond}, e.Control())
	if err != nil {
		t.Fatal(err)
	}
	url := testkit.Serve(t, e, httpapi.Options{Repository: r})
	r.Scan(context.Background())
	return r, url
}

// A version folder removed while polling (cnn/2/ deleted, cnn/1/ kept):
// the repository makes 1 current and drops 2 from its index, and
// /v2/models/cnn/versions/2/ready and /versions/2/infer no longer answer
// for the bundle whose folder is gone (Triton unloads a removed version).
func TestRemovedVersionFolderIsNotServed(t *testing.T) {
	src := testkit.BundleDir(t, testkit.Manifest("cnn"), nil)
	models := filepath.Join(t.TempDir(), "models")
	copyFiles(t, src, filepath.Join(models, "cnn", "1"), "plover.json", "kernels.so")
	copyFiles(t, src, filepath.Join(models, "cnn", "2"), "kernels.so")
	// Version 2 differs from 1 in its bytes (a larger input limit).
	m := testkit.Manifest("cnn")
	m.MaxInputBytes = 1 << 15
	testkit.WriteManifest(t, filepath.Join(models, "cnn", "2"), m)
	ageAll(models)

	r, url := servePolled(t, models)
	ctx := context.Background()
	if resp, body := testkit.Post(t, "GET", url+"/v2/models/cnn/versions/2/ready", "", nil); resp.StatusCode != 200 {
		t.Fatalf("version 2 not ready at start: %d %s", resp.StatusCode, body)
	}

	if err := os.RemoveAll(filepath.Join(models, "cnn", "2")); err != nil {
		t.Fatal(err)
	}
	// Scanned until the index drops version 2 (the folder settles first).
	var idx []byte
	for end := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		r.Scan(ctx)
		_, idx = testkit.Post(t, "POST", url+"/v2/repository/index", "application/json", nil)
		if !strings.Contains(string(idx), `"version":"2"`) {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("cnn/2/ removed 10 s ago, the index still lists it: %s", idx)
		}
	}
	if resp, body := testkit.Post(t, "GET", url+"/v2/models/cnn/versions/2/ready", "", nil); resp.StatusCode == 200 {
		t.Errorf("cnn/2/ removed, yet /v2/models/cnn/versions/2/ready answers %d %s", resp.StatusCode, body)
	}
	in := `{"inputs":[{"name":"INPUT0","datatype":"UINT8","shape":[3],"data":[1,2,3]}]}`
	if resp, body := testkit.Post(t, "POST", url+"/v2/models/cnn/versions/2/infer", "application/json", []byte(in)); resp.StatusCode == 200 {
		t.Errorf("cnn/2/ removed, yet /v2/models/cnn/versions/2/infer runs it: %d %.120s", resp.StatusCode, body)
	}
}

// A version folder over the node's bundle limit (--max-body, 256 MiB by
// default: model weights of a few GiB are common) is refused once its
// packing passes the limit, not packed whole into memory first (4 deploys
// at once, a model larger than the pod's memory limit would get the
// server OOM-killed): UNAVAILABLE, 413 on load, and what the refusal
// allocates is far below the folder's size. Here: a 1 MiB limit and
// 64 MiB of incompressible constants; the compressor's window (16 MiB)
// is allocated whatever the size.
func TestOversizedBundleRefusedWithinTheLimit(t *testing.T) {
	m := testkit.Manifest("big")
	m.Constants = "w.bin"
	weights := make([]byte, 64<<20)
	rand.Read(weights)
	src := testkit.BundleDir(t, m, weights)
	models := filepath.Join(t.TempDir(), "models")
	copyFiles(t, src, filepath.Join(models, "big"), "plover.json", "kernels.so", "w.bin")
	ageAll(models)
	e := testkit.Engine(t, engine.Config{MaxBundleBytes: 1 << 20})
	// As plover serve passes the node's limit (--max-body) to both.
	r, err := repository.New(repository.Config{Dir: models, Settle: 50 * time.Millisecond, MaxBundleBytes: 1 << 20}, e.Control())
	if err != nil {
		t.Fatal(err)
	}
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	r.Scan(context.Background())
	runtime.ReadMemStats(&after)
	idx := r.Index(context.Background(), false)
	t.Logf("index: %+v", idx)
	if len(idx) == 0 || idx[0].State != repository.Unavailable || !strings.Contains(idx[0].Reason, "larger than 1048576 bytes") {
		t.Fatalf("a bundle over the limit is not UNAVAILABLE for its size: %+v", idx)
	}
	if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 32<<20 {
		t.Errorf("refusing a 64 MiB folder over a 1 MiB limit allocated %d MiB (packed in memory first)", alloc>>20)
	}
	if err := r.Load(context.Background(), "big"); errdefs.KindOf(err) != errdefs.KindTooLarge {
		t.Errorf("load of the folder over the limit: %v, want 413", err)
	}
}

// A new folder whose manifest today's rules refuse (a field's name in
// another case) is UNAVAILABLE naming it, with a load's 400: the folder
// packs as stored bytes would, and the deploy holds bytes the store lacks
// to today's rules.
func TestNewFolderHeldToTodaysRules(t *testing.T) {
	src := testkit.BundleDir(t, testkit.Manifest("fresh"), nil)
	models := filepath.Join(t.TempDir(), "models")
	copyFiles(t, src, filepath.Join(models, "fresh"), "kernels.so")
	raw, err := os.ReadFile(filepath.Join(src, "plover.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(models, "fresh", "plover.json"), append([]byte(`{"Zero_Out": true, `), raw[1:]...), 0o644); err != nil {
		t.Fatal(err)
	}
	ageAll(models)
	e := testkit.Engine(t, engine.Config{})
	r, err := repository.New(repository.Config{Dir: models, Settle: 50 * time.Millisecond}, e.Control())
	if err != nil {
		t.Fatal(err)
	}
	r.Scan(context.Background())
	idx := r.Index(context.Background(), false)
	if len(idx) == 0 || idx[0].State != repository.Unavailable || !strings.Contains(idx[0].Reason, "Zero_Out: no such field") {
		t.Fatalf("a new folder with a key in another case: %+v, want UNAVAILABLE naming Zero_Out", idx)
	}
	if err := r.Load(context.Background(), "fresh"); errdefs.KindOf(err) != errdefs.KindBadRequest {
		t.Errorf("load: %v (kind %v), want 400", err, errdefs.KindOf(err))
	}
}
