package repository

import (
	"encoding/json"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/api"
	"github.com/plover-run/plover/bundle"
	"github.com/plover-run/plover/engine"
	"github.com/plover-run/plover/httpapi"
	"github.com/plover-run/plover/internal/testkit"
)

// What the repository cannot read is the node's failure (its volume, its
// permissions), never the client's: a load answers 503 for it, whether
// it is the model's folder (it answered 400, as for a bundle refused) or
// a file in a version folder (503), naming the model, the entry and the
// errno, and the index says the same; neither quotes the server's paths
// (DIR, where a link leads), which the log has.
func TestUnreadableIsTheNodesFailure(t *testing.T) {
	for _, c := range []struct {
		what  string
		model string
		fail  func(t *testing.T, models string)
		want  string // the reason, in the load's answer and the index
	}{
		{"model folder", "locked", func(t *testing.T, models string) {
			failStat(t, filepath.Join(models, "locked"))
		}, "models/locked: unreadable (permission denied): tried again when it changes"},
		{"file in a version folder", "locked", func(t *testing.T, models string) {
			repackWithin = func(dir, name string, w io.Writer) (*abi.Manifest, error) {
				return nil, &fs.PathError{Op: "openat", Path: "b.bin", Err: syscall.EACCES}
			}
			t.Cleanup(func() { repackWithin = bundle.RepackWithin })
		}, "models/locked/1/b.bin: unreadable (permission denied): tried again at the next scan"},
	} {
		t.Run(c.what, func(t *testing.T) {
			d := t.TempDir()
			models := filepath.Join(d, "models")
			os.MkdirAll(models, 0o755)
			// The model folder is a link: its target's path is the
			// server's, as DIR's is.
			target := filepath.Join(d, "releases", "locked-v1")
			writeBundle(t, filepath.Join(target, "1"), "locked", false)
			if err := os.Symlink(target, filepath.Join(models, "locked")); err != nil {
				t.Fatal(err)
			}
			age(t, d)
			c.fail(t, models)
			var log testkit.LogBuffer
			e := testkit.Engine(t, engine.Config{})
			r, err := New(Config{Dir: models, Poll: time.Hour, Settle: time.Millisecond, Log: slog.New(slog.NewTextHandler(&log, nil))}, e.Control())
			if err != nil {
				t.Fatal(err)
			}
			url := testkit.Serve(t, e, httpapi.Options{Repository: r})

			resp, b := testkit.Post(t, "POST", url+"/v2/repository/models/"+c.model+"/load", "application/json", nil)
			var out struct{ Error string }
			json.Unmarshal(b, &out)
			if resp.StatusCode != 503 || !strings.Contains(out.Error, "load "+c.model+": "+c.want) || strings.Contains(out.Error, d) {
				t.Errorf("load: %d %s; want 503 saying %q, and not the server's path %s", resp.StatusCode, b, c.want, d)
			}

			resp, b = testkit.Post(t, "POST", url+"/v2/repository/index", "application/json", nil)
			var idx []api.RepositoryModel
			if err := json.Unmarshal(b, &idx); err != nil || resp.StatusCode != 200 {
				t.Fatalf("index: %d %s", resp.StatusCode, b)
			}
			found := false
			for _, m := range idx {
				found = found || (m.Name == c.model && m.State == Unavailable && m.Reason == c.want)
			}
			if !found || strings.Contains(string(b), d) {
				t.Errorf("index %s; want %s UNAVAILABLE (%s), and not the server's path %s", b, c.model, c.want, d)
			}
			if !strings.Contains(log.String(), d) {
				t.Errorf("the log does not say which path failed: %s", log.String())
			}
		})
	}
}
