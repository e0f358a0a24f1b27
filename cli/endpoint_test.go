package cli

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/plover-run/plover/engine"
	"github.com/plover-run/plover/httpapi"
	"github.com/plover-run/plover/internal/testkit"
	"github.com/plover-run/plover/objectstore"
	"github.com/plover-run/plover/registry"
)

// A flag on the command line beats the other's variable: a --server given
// with $PLOVER_STORE set (exported for plover serve) deployed to the store
// and exited 0, and the server named never saw it. Both flags given is a
// usage error; a change made in a store says which.
func TestServerOrStoreFromTheCommandLine(t *testing.T) {
	dir := testkit.BundleDir(t, testkit.Manifest("fn"), nil)
	nowhere := "http://127.0.0.1:1" // nothing listens: a deploy there fails
	tests := []struct {
		name      string
		vars      map[string]string // with STORE: the test's store URL
		args      []string          // with SERVER, STORE: the test's
		code      int
		stdout    string // in stdout
		stderr    string // in stderr
		onServer  bool   // fn deployed on the server
		inStore   bool   // fn deployed in the store
		notStdout string
	}{
		{"--server beats $PLOVER_STORE", map[string]string{"PLOVER_STORE": "STORE"}, []string{"deploy", dir, "--server", "SERVER"},
			0, "deployed fn version", "", true, false, "store"},
		{"--store beats $PLOVER_SERVER", map[string]string{"PLOVER_SERVER": nowhere}, []string{"deploy", dir, "--store", "STORE"},
			0, "to store STORE\n", "", false, true, ""},
		{"--store beats a malformed $PLOVER_SERVER", map[string]string{"PLOVER_SERVER": "ftp://x"}, []string{"deploy", dir, "--store", "STORE"},
			0, "to store STORE\n", "", false, true, ""},
		{"both flags", nil, []string{"deploy", dir, "--server", "SERVER", "--store", "STORE"},
			2, "", "plover deploy: --server and --store both given", false, false, ""},
		{"both variables: the store's, said", map[string]string{"PLOVER_SERVER": "SERVER", "PLOVER_STORE": "STORE"}, []string{"deploy", dir},
			0, "to store STORE\n", "", false, true, ""},
		{"an empty --store is none", map[string]string{"PLOVER_STORE": "STORE", "PLOVER_SERVER": "SERVER"}, []string{"deploy", dir, "--store="},
			0, "deployed fn version", "", true, false, "store"},
		{"an empty --server is none", map[string]string{"PLOVER_STORE": "STORE", "PLOVER_SERVER": nowhere}, []string{"deploy", dir, "--server="},
			0, "to store STORE\n", "", false, true, ""},
		{"an empty --server beside --store", nil, []string{"deploy", dir, "--server=", "--store", "STORE"},
			0, "to store STORE\n", "", false, true, ""},
		{"versions: an empty --server leaves $PLOVER_STORE read", map[string]string{"PLOVER_STORE": "STORE", "PLOVER_SERVER": nowhere}, []string{"versions", "fn", "--server="},
			1, "", "plover versions: function fn: no such function\n", false, false, ""},
		{"versions: --server beats $PLOVER_STORE", map[string]string{"PLOVER_STORE": "STORE"}, []string{"versions", "fn", "--server", "SERVER"},
			1, "", "server said 404 not_found", false, false, ""},
		{"gc: --server beats $PLOVER_STORE", map[string]string{"PLOVER_STORE": "STORE"}, []string{"gc", "--server", "SERVER"},
			0, "0 bundles removed\n", "", false, false, ""},
		{"gc in a store says so", nil, []string{"gc", "--store", "STORE"},
			0, "0 bundles removed from store STORE\n", "", false, false, ""},
		{"rollback: both flags", nil, []string{"rollback", "fn", "abcdefgh", "--server", "SERVER", "--store", "STORE"},
			2, "", "--server and --store both given", false, false, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			server := testkit.Serve(t, testkit.Engine(t, engine.Config{}), httpapi.Options{})
			storeDir := filepath.Join(t.TempDir(), "store")
			store := "file://" + storeDir
			fill := strings.NewReplacer("SERVER", server, "STORE", store).Replace
			vars := map[string]string{}
			for k, v := range tt.vars {
				vars[k] = fill(v)
			}
			args := make([]string, len(tt.args))
			for i, a := range tt.args {
				args[i] = fill(a)
			}
			out, errs, code := runMain(t, envOf(vars), args...)
			if code != tt.code || !strings.Contains(out, fill(tt.stdout)) || !strings.Contains(errs, tt.stderr) ||
				tt.notStdout != "" && strings.Contains(out, tt.notStdout) {
				t.Fatalf("exit %d, stdout %q, stderr %q; want exit %d, %q in stdout, %q in stderr", code, out, errs, tt.code, fill(tt.stdout), tt.stderr)
			}
			if _, _, code := runMain(t, nil, "versions", "fn", "--server", server); (code == 0) != tt.onServer {
				t.Errorf("fn on the server: %v; want %v", code == 0, tt.onServer)
			}
			if _, _, code := runMain(t, nil, "versions", "fn", "--store", store); (code == 0) != tt.inStore {
				t.Errorf("fn in the store: %v; want %v", code == 0, tt.inStore)
			}
		})
	}
}

// plover gc reads no $PLOVER_GRACE: that is plover serve's shutdown grace
// (10s by default), and a gc in a shell that exported it deleted bundles
// younger than its own 1m grace, which keeps a deploy's bundle until its
// record lands. A negative --grace, which a store's gc
// took as none and a server refused without naming the flag, is a usage
// error naming it.
func TestGCGrace(t *testing.T) {
	storeDir := filepath.Join(t.TempDir(), "store")
	store := "file://" + storeDir
	dir := testkit.BundleDir(t, testkit.Manifest("fn"), nil)
	if _, errs, code := runMain(t, nil, "deploy", dir, "--store", store); code != 0 {
		t.Fatalf("deploy: %d %s", code, errs)
	}
	st, err := openStore(context.Background(), store, objectstore.S3Options{})
	if err != nil {
		t.Fatal(err)
	}
	// The record goes; its bundle, just written, is left to gc.
	if _, err := (registry.Registry{Store: st}).Delete(context.Background(), "fn"); err != nil {
		t.Fatal(err)
	}
	out, errs, code := runMain(t, envOf(map[string]string{"PLOVER_GRACE": "0s"}), "gc", "--store", store)
	if code != 0 || !strings.Contains(out, "0 bundles removed") {
		t.Fatalf("gc with $PLOVER_GRACE=0s: exit %d, stdout %q, stderr %q; want the young bundle kept (--grace 1m)", code, out, errs)
	}
	if out, _, _ := runMain(t, nil, "gc", "--help"); !strings.Contains(out, "(the command line wins): PLOVER_CACERT, PLOVER_JSON,") {
		t.Errorf("gc --help lists PLOVER_GRACE among its variables:\n%s", out)
	}
	url := testkit.Serve(t, testkit.Engine(t, engine.Config{}), httpapi.Options{})
	for _, to := range [][]string{{"--store", store}, {"--server", url}} {
		_, errs, code := runMain(t, nil, append([]string{"gc", "--grace", "-5m"}, to...)...)
		if code != 2 || !strings.Contains(errs, "plover gc: --grace -5m0s: want 0 or a positive duration") {
			t.Errorf("gc --grace -5m %s: exit %d, stderr %q", to[0], code, errs)
		}
	}
	if out, errs, code := runMain(t, nil, "gc", "--store", store, "--grace", "0s"); code != 0 || !strings.Contains(out, "1 bundles removed") {
		t.Fatalf("gc --grace 0s: exit %d, stdout %q, stderr %q", code, out, errs)
	}
}

// The help of a command that shares a variable with plover serve says so:
// $PLOVER_TIMEOUT exported for a server sets plover invoke's deadline too.
func TestHelpSaysServeSharesAVariable(t *testing.T) {
	for _, tt := range []struct{ cmd, want string }{
		{"invoke", "PLOVER_TIMEOUT is plover serve's variable too (its --timeout)"},
		{"run", "PLOVER_CHECKED, PLOVER_TIMEOUT are plover serve's variables too (its --checked, --timeout)"},
		{"deploy", "--server wins over $PLOVER_STORE"},
	} {
		out, _, code := runMain(t, nil, tt.cmd, "--help")
		if code != 0 || !strings.Contains(strings.Join(strings.Fields(out), " "), tt.want) {
			t.Errorf("%s --help: exit %d, want %q in:\n%s", tt.cmd, code, tt.want, out)
		}
	}
}
