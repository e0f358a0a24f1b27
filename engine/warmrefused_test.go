package engine_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/bundle"
	"github.com/plover-run/plover/engine"
	"github.com/plover-run/plover/internal/testkit"
	"github.com/plover-run/plover/objectstore"
	"github.com/plover-run/plover/registry"
)

// warmRefusalCase makes an engine whose pre-warm of a function with
// min_instances 1 (a deploy's or a start's) failed, and names the function.
type warmRefusalCase struct {
	name string
	// setup returns the engine, logging to log, and the function.
	setup func(t *testing.T, log *slog.Logger) (*engine.Engine, string)
	// refused: a refusal that no try mends, so that the reaper is to try
	// the version no more; else it is tried again (its back-off's).
	refused bool
	want    string // in the refusal the function's listing shows
}

// cacheEngine is an engine over store whose bundle cache keeps limit bytes.
func cacheEngine(t *testing.T, store objectstore.Store, limit int64, log *slog.Logger) *engine.Engine {
	t.Helper()
	c, err := bundle.NewCache(t.TempDir(), 0, limit)
	if err != nil {
		t.Fatal(err)
	}
	return testkit.Engine(t, engine.Config{Store: store, Cache: c, Log: log})
}

// keptWarm is name's test manifest with min_instances 1.
func keptWarm(name string) *abi.Manifest {
	m := testkit.Manifest(name)
	m.MinInstances = 1
	return m
}

// deployBig deploys name with min_instances 1 and a MiB of constants that
// pack as large.
func deployBig(t *testing.T, e *engine.Engine, name string) {
	t.Helper()
	m := keptWarm(name)
	m.Constants = "c.bin"
	consts := make([]byte, 1<<20)
	rand.Read(consts)
	testkit.Deploy(t, e, testkit.BundleDir(t, m, consts))
}

// startedOn is a node over store, logging to log, once its start's
// pre-warm (Prewarm) ended.
func startedOn(t *testing.T, store objectstore.Store, log *slog.Logger) *engine.Engine {
	t.Helper()
	e := testkit.Engine(t, engine.Config{Store: store, Log: log}) // the host device only
	if err := e.Prewarm(context.Background()); err != nil {
		t.Fatal(err)
	}
	return e
}

func newFS(t *testing.T) *objectstore.FS {
	t.Helper()
	fs, err := objectstore.NewFS(filepath.Join(t.TempDir(), "store"))
	if err != nil {
		t.Fatal(err)
	}
	return fs
}

var warmRefusalCases = []warmRefusalCase{
	{"library refused at load", func(t *testing.T, log *slog.Logger) (*engine.Engine, string) {
		e := testkit.Engine(t, engine.Config{Log: log})
		testkit.Deploy(t, e, testkit.UnloadableBundleDir(t, keptWarm("bad")))
		return e, "bad"
	}, true, "libploverdep.so"},
	{"bundle alone past --cache-limit", func(t *testing.T, log *slog.Logger) (*engine.Engine, string) {
		e := cacheEngine(t, newFS(t), 1<<19, log)
		deployBig(t, e, "big")
		return e, "big"
	}, true, "larger than this node's --cache-limit"},
	{"bundle damaged in the store", func(t *testing.T, log *slog.Logger) (*engine.Engine, string) {
		fs := newFS(t)
		fi := testkit.Deploy(t, testkit.Engine(t, engine.Config{Store: fs}), testkit.BundleDir(t, keptWarm("dmg"), nil))
		junk := "damaged in the store"
		if err := fs.Put(context.Background(), bundle.ObjectKey(fi.SHA256), strings.NewReader(junk), int64(len(junk))); err != nil {
			t.Fatal(err)
		}
		return startedOn(t, fs, log), "dmg"
	}, true, "sha256 mismatch"},
	{"manifest with a field from a newer server", func(t *testing.T, log *slog.Logger) (*engine.Engine, string) {
		fs := newFS(t)
		m := keptWarm("future")
		storeAsOldServer(t, fs, m, withKey(t, m, "future_field", "1"))
		return startedOn(t, fs, log), "future"
	}, true, "future_field: no such field"},
	{"built for no device of this node, its record older than targets", func(t *testing.T, log *slog.Logger) (*engine.Engine, string) {
		fs := newFS(t)
		m := keptWarm("gpu")
		dir := testkit.BundleDir(t, m, nil)
		m.Target = abi.TargetCUDA
		testkit.WriteManifest(t, dir, m)
		raw, sha, pm, err := bundle.PackBytes(dir)
		if err != nil {
			t.Fatal(err)
		}
		pm.Target = "" // the record says nothing of it: the bundle does
		if _, err := (registry.Registry{Store: fs}).PublishWith(context.Background(), pm, bytes.NewReader(raw), sha, int64(len(raw)), registry.PublishOptions{}); err != nil {
			t.Fatal(err)
		}
		return startedOn(t, fs, log), "gpu"
	}, true, "no such device"},
	{"crowded out of --cache-limit by a bundle in use", func(t *testing.T, log *slog.Logger) (*engine.Engine, string) {
		e := cacheEngine(t, newFS(t), 3<<19, log) // one bundle in use, not two
		deployBig(t, e, "first")
		deployBig(t, e, "second")
		return e, "second"
	}, false, ""},
}

// A pre-warm refused in a way no try mends (its library or bundle
// refused, its manifest one only a newer server runs, its bundle alone
// past --cache-limit, no device here for it) is
// warned of once, kept in the function's listing, and not tried again by
// the reaper, whatever its back-off; before, the reaper tried it at every
// back-off, to about 10 minutes, warning each time, for as long as the
// version was current. One that may mend (crowded out of the cache by
// bundles in use, which may unload) is tried again as before.
func TestAPrewarmRefusedForGoodIsNotTriedAgain(t *testing.T) {
	for _, tc := range warmRefusalCases {
		t.Run(tc.name, func(t *testing.T) {
			var logs testkit.LogBuffer
			e, name := tc.setup(t, slog.New(slog.NewTextHandler(&logs, nil)))
			waitUntil(t, "the pre-warm to end", func() bool { return !e.ToppingUp(name) })
			warned := func() (n int) {
				for _, line := range strings.Split(logs.String(), "\n") {
					if strings.Contains(line, "cannot make the instances") && strings.Contains(line, "function="+name+" ") {
						n++
					}
				}
				return n
			}
			if n := warned(); n != 1 {
				t.Fatalf("the pre-warm's failure logged %d times, want once:\n%s", n, logs.String())
			}
			fi := info(t, e, name)
			if tc.refused != (fi.WarmRefused != "") || !strings.Contains(fi.WarmRefused, tc.want) {
				t.Errorf("listing's warm_refused %q; want refused %v, saying %q", fi.WarmRefused, tc.refused, tc.want)
			}
			t0 := time.Now()
			if !tc.refused {
				e.Reap(t0)
				waitUntil(t, "a top-up to fail", func() bool { return !e.ToppingUp(name) && e.TopUpFails(name) == 1 })
				return
			}
			// A top-up begins within Reap (ToppingUp) and counts its
			// failure before it ends: neither, right after Reap, is none.
			for _, at := range []time.Duration{0, 25 * time.Second, 11 * time.Minute, time.Hour} {
				e.Reap(t0.Add(at))
				if e.ToppingUp(name) || e.TopUpFails(name) != 0 {
					t.Fatalf("a top-up was tried %v after the pre-warm was refused for good", at)
				}
			}
			if n := warned(); n != 1 {
				t.Errorf("logged %d times, want once:\n%s", n, logs.String())
			}
		})
	}
}

// A pre-warm refused for its bundle alone past --cache-limit leaves the
// function to its first request, which loads it anyway: from then on the
// version is kept at its min_instances as any loaded one is, and its
// listing no longer says it is refused.
func TestARequestLoadEndsACacheLimitRefusal(t *testing.T) {
	e := cacheEngine(t, newFS(t), 1<<19, nil)
	deployBig(t, e, "big")
	if fi := info(t, e, "big"); fi.WarmRefused == "" || fi.Loaded {
		t.Fatalf("after deploy: loaded %v, warm_refused %q; want refused, not loaded", fi.Loaded, fi.WarmRefused)
	}
	invoke(t, e, "big", []byte("x"))
	if fi := info(t, e, "big"); fi.WarmRefused != "" || !fi.Loaded {
		t.Fatalf("after a request: loaded %v, warm_refused %q; want loaded, not refused", fi.Loaded, fi.WarmRefused)
	}
}
