package engine_test

import (
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/call"
	"github.com/plover-run/plover/engine"
	"github.com/plover-run/plover/errdefs"
	"github.com/plover-run/plover/internal/testkit"
	"github.com/plover-run/plover/objectstore"
)

// A library that passes the static checks but cannot be loaded on this node
// (a dependency missing here, or one that lacks a symbol the library needs)
// is refused with the loader's reason, naming the library by its name in
// the bundle, not by its path in the node cache, in the reason too: dlerror
// names the file for an undefined symbol, and the model repository's index
// shows the reason to every read token.
func TestUnloadableLibraryIsNamedByBundleFile(t *testing.T) {
	for _, tc := range []struct {
		name string
		dir  func(t testing.TB, m *abi.Manifest) string
		want []string
	}{
		{"dependency missing", testkit.UnloadableBundleDir, []string{"library kernels.so:", "dlopen failed", "libploverdep.so"}},
		{"symbol missing", symbolMissingBundleDir, []string{"library kernels.so:", "dlopen failed", "kernels.so: undefined symbol: plover_probe_dep"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := testkit.Manifest("fn")
			e := testkit.Engine(t, engine.Config{})
			dir := tc.dir(t, m)
			testkit.Deploy(t, e, dir)
			err := e.Invoke(context.Background(), "fn", &call.Request{Input: []byte("x")})
			var re *errdefs.Error
			if !errors.As(err, &re) || re.Kind != errdefs.KindInvalid {
				t.Fatalf("invoke: %v, want KindInvalid", err)
			}
			for _, want := range tc.want {
				if !strings.Contains(re.Msg, want) {
					t.Errorf("message %q lacks %q", re.Msg, want)
				}
			}
			if strings.Contains(re.Msg, "cache") || strings.Contains(re.Msg, string(filepath.Separator)+"kernels.so") {
				t.Errorf("message %q shows the node's cache path", re.Msg)
			}
		})
	}
}

// symbolMissingBundleDir writes a bundle for m whose library needs
// plover_probe_dep from libploverdep.so (found by its rpath), a dependency
// rebuilt without it once the bundle's was built.
func symbolMissingBundleDir(t testing.TB, m *abi.Manifest) string {
	t.Helper()
	dep := t.TempDir()
	src := filepath.Join(dep, "dep.c")
	probe := filepath.Join(dep, "probe.h")
	for name, text := range map[string]string{
		src:   "int plover_probe_dep(void) { return 1; }\n",
		probe: "extern \"C\" int plover_probe_dep(void);\nstatic int plover_dep_probe = plover_probe_dep();\n",
	} {
		if err := os.WriteFile(name, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	testkit.BuildLib(t, src, dep, "libploverdep.so")
	dir := t.TempDir()
	testkit.BuildLib(t, testkit.KernelsSource(), dir, m.Library, "-include", probe, "-L"+dep, "-Wl,-rpath,"+dep, "-lploverdep")
	testkit.WriteManifest(t, dir, m)
	if err := os.WriteFile(src, []byte("int plover_other(void) { return 1; }\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	testkit.BuildLib(t, src, dep, "libploverdep.so")
	return dir
}

// downStore fails every read with a cause the client should see.
type downStore struct {
	objectstore.Store
	down bool
}

var errDown = errors.New("endpoint unreachable (http://127.0.0.1:9): connection refused")

func (s *downStore) Get(ctx context.Context, key string) (io.ReadCloser, error) {
	if s.down {
		return nil, errDown
	}
	return s.Store.Get(ctx, key)
}

func (s *downStore) List(ctx context.Context, prefix string) ([]objectstore.Info, error) {
	if s.down {
		return nil, errDown
	}
	return s.Store.List(ctx, prefix)
}

// A store outage is a 503 that says what failed, for a cold start and for
// a listing alike.
func TestStoreOutageMessagesCarryTheCause(t *testing.T) {
	fs, err := objectstore.NewFS(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	store := &downStore{Store: fs}
	deployer := testkit.Engine(t, engine.Config{Store: store})
	testkit.Deploy(t, deployer, testkit.BundleDir(t, testkit.Manifest("fn"), nil))
	node := testkit.Engine(t, engine.Config{Store: store}) // has never loaded fn
	store.down = true
	ctx := context.Background()
	_, listErr := node.Control().Functions(ctx)
	for what, err := range map[string]error{
		"cold invoke": node.Invoke(ctx, "fn", &call.Request{Input: []byte("x")}),
		"list":        listErr,
	} {
		var re *errdefs.Error
		if !errors.As(err, &re) || re.Kind != errdefs.KindUnavailable || !strings.Contains(re.Msg, "endpoint unreachable") {
			t.Errorf("%s: %v, want a 503 whose message names the cause", what, err)
		}
	}
}
