package charttest

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// TestFindHelm: the version install-helm.sh pins, from its cache, comes
// before a helm on PATH (another version, whose output the chart test was
// not checked against); then PATH; then the cache's newest version by
// number, v3.22 after v3.9 (a string sort put v3.9 last).
func TestFindHelm(t *testing.T) {
	pinned, err := pinnedHelmVersion(installHelm)
	if err != nil || pinned == "" {
		t.Fatalf("the pinned version: %q, %v", pinned, err)
	}
	cache := t.TempDir()
	put := func(version string) string {
		p := filepath.Join(cache, "helm-"+version, "helm")
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte("#!/bin/sh\n"), 0o755); err != nil {
			t.Fatal(err)
		}
		return p
	}
	onPath := func(string) (string, error) { return "/usr/local/bin/helm", nil }
	noPath := func(string) (string, error) { return "", errors.New("not found") }

	put("v3.9.4")
	v310, v322 := put("v3.10.1"), put("v3.22.0")
	if got := findHelm(cache, "v3.10.1", onPath); got != v310 {
		t.Errorf("with the pinned version cached and a helm on PATH: %s, want %s", got, v310)
	}
	if got := findHelm(cache, "v3.99.0", onPath); got != "/usr/local/bin/helm" {
		t.Errorf("without the pinned version, a helm on PATH: %s, want PATH's", got)
	}
	if got := findHelm(cache, "v3.99.0", noPath); got != v322 {
		t.Errorf("neither: %s, want the newest cached, %s", got, v322)
	}
	if got := findHelm(t.TempDir(), pinned, noPath); got != "" {
		t.Errorf("nothing anywhere: %q", got)
	}
	for _, c := range []struct {
		a, b string
		want int
	}{
		{"helm-v3.9.4", "helm-v3.22.0", -1},
		{"helm-v3.22.0", "helm-v3.22.0", 0},
		{"helm-v3.22.1", "helm-v3.22.0", 1},
		{"helm-v3.10.0", "helm-v3.9.10", 1},
	} {
		if got := compareVersions(c.a, c.b); got != c.want {
			t.Errorf("compareVersions(%s, %s) = %d, want %d", c.a, c.b, got, c.want)
		}
	}
}
