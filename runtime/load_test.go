package runtime_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/plover-run/plover/internal/testkit"
	"github.com/plover-run/plover/runtime"
)

// A library that passes the static checks but cannot be loaded on this node
// (a dependency missing here) is refused with the loader's reason, naming
// the library by its name in the bundle, not by its path in the node cache.
func TestUnloadableLibraryIsNamedByBundleFile(t *testing.T) {
	dir := t.TempDir()
	dep := filepath.Join(dir, "dep.c")
	os.WriteFile(dep, []byte("int plover_probe_dep(void) { return 1; }\n"), 0o644)
	testkit.BuildLib(t, dep, dir, "libploverdep.so")
	m := testkit.Manifest("fn")
	bdir := t.TempDir()
	testkit.BuildLib(t, testkit.KernelsSource(), bdir, m.Library, "-L"+dir, "-Wl,--no-as-needed", "-lploverdep")
	testkit.WriteManifest(t, bdir, m)
	os.Remove(filepath.Join(dir, "libploverdep.so"))
	e := testkit.Engine(t, runtime.Config{})
	testkit.Deploy(t, e, bdir)
	err := e.Invoke(context.Background(), "fn", &runtime.Request{Input: []byte("x")})
	var re *runtime.Error
	if !errors.As(err, &re) || re.Kind != runtime.KindInvalid {
		t.Fatalf("invoke: %v, want KindInvalid", err)
	}
	for _, want := range []string{"library kernels.so:", "dlopen failed", "libploverdep.so"} {
		if !strings.Contains(re.Msg, want) {
			t.Errorf("message %q lacks %q", re.Msg, want)
		}
	}
	if strings.Contains(re.Msg, "cache") {
		t.Errorf("message %q shows the node's cache path", re.Msg)
	}
}
