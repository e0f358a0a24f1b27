package repository

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/plover-run/plover/fileutil"
)

// What a restart makes of an unload kept in Config.StateFile: it stays
// while the folder is as it was; a change of the folder meanwhile, a load
// before the restart, or a state file torn, missing or another
// repository's load the model (a file of its own never stops the server).
func TestUnloadKeptAcrossRestarts(t *testing.T) {
	ctx := context.Background()
	for _, c := range []struct {
		name     string
		between  func(t *testing.T, r *Repository, models, state string)
		unloaded bool
	}{
		{"as left", func(*testing.T, *Repository, string, string) {}, true},
		{"folder changed meanwhile", func(t *testing.T, _ *Repository, models, _ string) {
			writeBundle(t, filepath.Join(models, "cnn"), "cnn", false)
			os.WriteFile(filepath.Join(models, "cnn", "b.bin"), []byte("other constants"), 0o644)
			age(t, models)
		}, false},
		{"loaded before", func(t *testing.T, r *Repository, _, _ string) {
			if err := r.Load(ctx, "cnn"); err != nil {
				t.Fatal(err)
			}
		}, false},
		// A print kept by a server that read no status change times
		// (before 2026-12-06), read by one that does, and a chmod
		// meanwhile (a kubelet's fsGroup chown at the pod's start): the
		// folder's contents are as unloaded.
		{"a print kept before status change times, and a chmod", func(t *testing.T, _ *Repository, models, state string) {
			b, _ := os.ReadFile(state)
			old := regexp.MustCompile(`:[0-9a-f]{64}"`).ReplaceAllString(string(b), `"`)
			if old == string(b) {
				t.Fatalf("no status change times' part in the kept print: %s", b)
			}
			os.WriteFile(state, []byte(old), 0o600)
			statusTimes = true
			t.Cleanup(func() { statusTimes = false })
			os.Chmod(filepath.Join(models, "cnn", "b.bin"), 0o600)
		}, true},
		{"file torn", func(t *testing.T, _ *Repository, _, state string) { os.WriteFile(state, []byte(`{"dir": `), 0o600) }, false},
		{"file missing", func(t *testing.T, _ *Repository, _, state string) { os.Remove(state) }, false},
		{"another repository's", func(t *testing.T, _ *Repository, _, state string) {
			b, _ := os.ReadFile(state)
			os.WriteFile(state, []byte(strings.Replace(string(b), `"dir":"`, `"dir":"/elsewhere`, 1)), 0o600)
		}, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			r, cfg, node := unloadedCNN(t, "kept")
			models, state := cfg.Dir, cfg.StateFile
			c.between(t, r, models, state)
			r2, err := New(cfg, node)
			if err != nil {
				t.Fatalf("restart: %v", err)
			}
			runStarted(t, r2)
			got := index(r2)
			want := "cnn/1 READY; kept/1 READY; "
			if c.unloaded {
				want = "cnn/ UNAVAILABLE (unloaded); kept/1 READY; "
			}
			if got != want || (node.current("cnn") == "") != c.unloaded {
				t.Errorf("after the restart: index %q, cnn deployed %v; want %q", got, node.current("cnn") != "", want)
			}
		})
	}
}

// unloadedCNN is a repository (run, no poll) keeping its unloads in
// DATA/repository-unloaded.json, with models cnn and extra deployed and cnn
// unloaded.
func unloadedCNN(t *testing.T, extra ...string) (*Repository, Config, *fakeNode) {
	t.Helper()
	d := t.TempDir()
	models := filepath.Join(d, "models")
	os.Mkdir(filepath.Join(d, "data"), 0o700)
	for _, name := range append([]string{"cnn"}, extra...) {
		writeBundle(t, filepath.Join(models, name), name, false)
	}
	age(t, models)
	node := newFakeNode()
	cfg := Config{Dir: models, StateFile: filepath.Join(d, "data", "repository-unloaded.json")}
	r, _ := New(cfg, node)
	runStarted(t, r)
	if err := r.Unload(context.Background(), "cnn"); err != nil {
		t.Fatal(err)
	}
	return r, cfg, node
}

// warnCount counts the log's warnings that the state file was not written.
type warnCount struct{ n *atomic.Int32 }

func (h warnCount) Enabled(context.Context, slog.Level) bool { return true }
func (h warnCount) Handle(_ context.Context, rec slog.Record) error {
	if rec.Level == slog.LevelWarn && strings.Contains(rec.Message, "cannot keep the unloaded models") {
		h.n.Add(1)
	}
	return nil
}
func (h warnCount) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h warnCount) WithGroup(string) slog.Handler      { return h }

// A state file that cannot be written (DATA gone, full, read-only) is said
// once in the log until a write succeeds, not at every scan (or index
// answer) that tries again; a failure after a success is said again.
func TestUnwritableStateWarnsOnce(t *testing.T) {
	ctx := context.Background()
	models := filepath.Join(t.TempDir(), "models")
	writeBundle(t, filepath.Join(models, "a"), "a", false)
	writeBundle(t, filepath.Join(models, "b"), "b", false)
	age(t, models)
	data := filepath.Join(t.TempDir(), "data")
	var n atomic.Int32
	r, _ := New(Config{Dir: models, Poll: time.Hour, Settle: time.Millisecond, StateFile: filepath.Join(data, "state.json"), Log: slog.New(warnCount{&n})}, newFakeNode())
	r.Scan(ctx)
	r.Unload(ctx, "a")
	for range 5 {
		r.Scan(ctx)
		r.Index(ctx, false)
	}
	first := n.Load()
	os.Mkdir(data, 0o700)
	r.Scan(ctx) // written
	os.RemoveAll(data)
	r.Unload(ctx, "b")
	r.Scan(ctx)
	if first != 1 || n.Load() != 2 {
		t.Errorf("%d warnings over 5 scans and index answers, then %d after a write and another failure; want 1, then 2", first, n.Load())
	}
}

// What a restart makes of its state file's extremes: temporary files a
// crash left beside it are removed; a file over 16 MiB is not read (every
// folder loads); a kept reason is cut as every reason is.
func TestStateFileBounds(t *testing.T) {
	for _, c := range []struct {
		name  string
		write func(t *testing.T, state, kept string)
		want  string
	}{
		{"temporary files left", func(t *testing.T, state, kept string) {
			os.WriteFile(state, []byte(kept), 0o600)
			for _, f := range []string{".repository-unloaded.json.tmp-123", ".repository-unloaded.json.tmp-4567"} {
				os.WriteFile(filepath.Join(filepath.Dir(state), f), []byte("torn"), 0o600)
			}
		}, "cnn/ UNAVAILABLE (unloaded); "},
		{"over 16 MiB", func(t *testing.T, state, kept string) {
			pad := `,"pad":"` + strings.Repeat("x", maxKeptBytes) + `"}`
			os.WriteFile(state, []byte(strings.TrimSuffix(kept, "}")+pad), 0o600)
		}, "cnn/1 READY; "},
		{"long reason", func(t *testing.T, state, kept string) {
			os.WriteFile(state, []byte(strings.Replace(kept, `"reason":"unloaded"`, `"reason":"`+strings.Repeat("r", 5000)+`"`, 1)), 0o600)
		}, "cnn/ UNAVAILABLE (" + strings.Repeat("r", maxReason) + " [3976 more bytes cut]); "},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, cfg, node := unloadedCNN(t)
			state := cfg.StateFile
			kept, _ := os.ReadFile(state)
			c.write(t, state, string(kept))
			r2, _ := New(cfg, node)
			runStarted(t, r2)
			ents, _ := os.ReadDir(filepath.Dir(state))
			if got := index(r2); got != c.want || len(ents) != 1 {
				t.Errorf("after the restart: index %.200q, %d files in DATA; want %.200q, 1", got, len(ents), c.want)
			}
		})
	}
}

// A write of the state file that failed after its rename landed (the
// directory's fsync): the file said what was written, but saved still
// what it said before, and a change back to that (an unload, then a load)
// was taken for nothing to write: the restart left the loaded model
// unloaded (or, the other way round, deployed an unloaded one).
func TestWriteFailedAfterItsRenameIsWrittenAgain(t *testing.T) {
	ctx := context.Background()
	models := filepath.Join(t.TempDir(), "models")
	writeBundle(t, filepath.Join(models, "cnn"), "cnn", false)
	state := filepath.Join(t.TempDir(), "state.json")
	r, _ := New(Config{Dir: models, Poll: time.Hour, Settle: time.Millisecond, StateFile: state}, newFakeNode())
	r.Scan(ctx)
	writeAtomic = func(path string, b []byte, perm os.FileMode) error {
		if err := fileutil.WriteAtomic(path, b, perm); err != nil {
			return err
		}
		return fmt.Errorf("%w: sync: input/output error", fileutil.ErrNotDurable)
	}
	defer func() { writeAtomic = fileutil.WriteAtomic }()
	if err := r.Unload(ctx, "cnn"); err != nil {
		t.Fatal(err)
	}
	writeAtomic = fileutil.WriteAtomic
	if err := r.Load(ctx, "cnn"); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(state); strings.Contains(string(b), `"cnn"`) {
		t.Errorf("cnn loaded, yet the state file keeps it unloaded: %s", b)
	}
}
