package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/plover-run/plover/internal/testkit"
)

// Direct trials open a fresh copy of the bundle each time, which the
// loader refuses for a library with GNU unique symbols of its own: such a
// bundle is refused before the first, saying what to do, not at the
// second with the loader's message; one without them is taken.
func TestDirectTrialsRefuseABundleOfUniqueSymbols(t *testing.T) {
	for _, tc := range []struct {
		name, body, want string
	}{
		{"unique symbols of its own", "inline int &bench_counter() { static int n; return n; }\nPLOVER_ENTRY(echo) { (void)grid; (void)block; (void)s; bench_counter()++; }\n", "--trials 1"},
		{"none", "PLOVER_ENTRY(echo) { (void)grid; (void)block; (void)s; }\n", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			src := filepath.Join(dir, "b.cu")
			if err := os.WriteFile(src, []byte("#include \"plover.h\"\nPLOVER_BUNDLE(\"host\");\n"+tc.body), 0o644); err != nil {
				t.Fatal(err)
			}
			m := testkit.Manifest("b")
			testkit.BuildLib(t, src, dir, m.Library)
			testkit.WriteManifest(t, dir, m)
			err := fitForCopies(dir)
			if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
				t.Fatalf("fitForCopies: %v, want %q", err, tc.want)
			}
		})
	}
}
