package repository

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
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
		{"file torn", func(t *testing.T, _ *Repository, _, state string) { os.WriteFile(state, []byte(`{"dir": `), 0o600) }, false},
		{"file missing", func(t *testing.T, _ *Repository, _, state string) { os.Remove(state) }, false},
		{"another repository's", func(t *testing.T, _ *Repository, _, state string) {
			b, _ := os.ReadFile(state)
			os.WriteFile(state, []byte(strings.Replace(string(b), `"dir":"`, `"dir":"/elsewhere`, 1)), 0o600)
		}, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			d := t.TempDir()
			models, state := filepath.Join(d, "models"), filepath.Join(d, "data", "repository-unloaded.json")
			os.Mkdir(filepath.Join(d, "data"), 0o700)
			writeBundle(t, filepath.Join(models, "cnn"), "cnn", false)
			writeBundle(t, filepath.Join(models, "kept"), "kept", false)
			age(t, models)
			node := newFakeNode()
			cfg := Config{Dir: models, StateFile: state}
			r, _ := New(cfg, node)
			r.Run(ctx)
			if err := r.Unload(ctx, "cnn"); err != nil {
				t.Fatal(err)
			}
			c.between(t, r, models, state)
			r2, err := New(cfg, node)
			if err != nil {
				t.Fatalf("restart: %v", err)
			}
			r2.Run(ctx)
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
