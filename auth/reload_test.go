package auth_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/plover-run/plover/auth"
)

// A SIGHUP that lands while the auth file is being written reads a last
// line cut short, and a line cut after SHA256 is a valid line whose
// FUNCTIONS default to "*" (and whose LIMITS are gone): Reload reads a file
// whose last line has no newline again a moment later, and keeps the old
// table when it changed meanwhile (a writer still at work).
func TestReloadKeepsTheTableForAFileCutMidLine(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tokens")
	const tok = "hunt-rD-token"
	full := "ci invoke " + auth.Hash(tok) + " cnn rate=5,concurrency=1\n"
	if err := os.WriteFile(path, []byte(full), 0o600); err != nil {
		t.Fatal(err)
	}
	s, err := auth.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, cut := range []string{
		strings.TrimSuffix(full, " cnn rate=5,concurrency=1\n"), // after SHA256
		strings.TrimSuffix(full, " rate=5,concurrency=1\n"),     // after FUNCTIONS
		strings.TrimSuffix(full, ",concurrency=1\n"),            // inside LIMITS
	} {
		if err := os.WriteFile(path, []byte(cut), 0o600); err != nil {
			t.Fatal(err)
		}
		// The writer finishes its line while the reload waits to see the
		// file again.
		restore := auth.WhileReloadWaits(func() {
			if err := os.WriteFile(path, []byte(full), 0o600); err != nil {
				t.Error(err)
			}
		})
		reloadErr := s.Reload()
		restore()
		if reloadErr == nil || !strings.Contains(reloadErr.Error(), "being written") {
			t.Errorf("file cut to %q, then finished: Reload %v, want it refused as being written", cut, reloadErr)
		}
		p := s.Lookup([]byte(tok))
		if p == nil {
			t.Fatalf("file cut to %q: the token is gone", cut)
		}
		if err := p.Allow(auth.Invoke, "other-tenants-fn"); err == nil || p.Limits.Concurrency != 1 {
			t.Errorf("file cut mid-write to %q: Reload %v; the token now invokes %v (functions %q), limits %+v; "+
				"want the old table kept (functions [cnn], concurrency 1)", cut, reloadErr, err == nil, p.Functions, p.Limits)
		}
	}
}

func TestAdminLineRefusesFunctions(t *testing.T) {
	for _, tc := range []struct {
		line string
		ok   bool
	}{
		{"ops admin " + auth.Hash("t") + " cnn\n", false},
		{"ops admin " + auth.Hash("t") + " *\n", true},
		{"ops admin " + auth.Hash("t") + "\n", true},
		{"ops deploy,invoke " + auth.Hash("t") + " cnn\n", true},
	} {
		_, err := auth.Parse(strings.NewReader(tc.line), "tokens")
		if tc.ok != (err == nil) || (err != nil && !strings.Contains(err.Error(), "admin token acts on every function")) {
			t.Errorf("%q: %v, want ok %v", tc.line, err, tc.ok)
		}
	}
}
