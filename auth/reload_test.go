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

// A reload used to take the whole new file or keep the whole old table:
// a leaked token's line deleted in the same edit as a typo elsewhere, or
// every line commented out to lock the server down, left the revoked
// tokens valid (a review's finding). A failed reload now keeps only the
// previous tokens the file still names; a file of comments alone is taken.
func TestAReloadRevokesWhatTheFileNoLongerNames(t *testing.T) {
	const leaked, kept = "leaked-token", "kept-token"
	start := "ops admin " + auth.Hash(leaked) + "\nci invoke " + auth.Hash(kept) + " cnn rate=5\n"
	for _, tc := range []struct {
		name, file       string
		errWant          string // "" for a reload taken
		leakedIn, keptIn bool
		keptLimitedToCNN bool
	}{
		{"deleted beside a typo", "ci invoke " + auth.Hash(kept) + " cnn rate=5\nnew invoke,raed " + auth.Hash("new") + "\n",
			"1 whose lines the file no longer has as they were were dropped, 1 kept", false, true, true},
		{"commented out beside a typo", "# ops admin " + auth.Hash(leaked) + "\nci invoke " + auth.Hash(kept) + " cnn rate=5\nbad\n",
			"1 whose lines the file no longer has as they were were dropped", false, true, true},
		// Kept, it would keep the rights it had: dropped until the file
		// parses.
		{"narrowed beside a typo", "ops read " + auth.Hash(leaked) + " cnn\nci invoke " + auth.Hash(kept) + " cnn rate=5\nbad\n",
			"were dropped, 1 kept", false, true, true},
		{"a note left without its #", "revoked: ops admin " + auth.Hash(leaked) + "\nci invoke " + auth.Hash(kept) + " cnn rate=5\n",
			"were dropped, 1 kept", false, true, true},
		{"a typo on the kept token's own line", "ops admin " + auth.Hash(leaked) + "\nci invoke,raed " + auth.Hash(kept) + " cnn\n",
			"were dropped, 1 kept", true, false, false},
		{"every line commented out", "# locked down 12-06\n# ops admin " + auth.Hash(leaked) + "\n",
			"", false, false, false},
		{"a typo, nothing revoked", start + "bad line\n", "the tokens loaded before are kept", true, true, true},
		{"emptied", "", "empty", true, true, true},
		{"blank lines alone", "\n\n", "empty", true, true, true},
		// A writer caught after its first line: the file changes while
		// the reload looks at it again.
		{"comments alone, still being written", "# tokens of 12-06\n", "changed", true, true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "tokens")
			if err := os.WriteFile(path, []byte(start), 0o600); err != nil {
				t.Fatal(err)
			}
			s, err := auth.Load(path)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(path, []byte(tc.file), 0o600); err != nil {
				t.Fatal(err)
			}
			if strings.Contains(tc.name, "still being written") {
				defer auth.WhileReloadWaits(func() {
					if err := os.WriteFile(path, []byte(tc.file+start), 0o600); err != nil {
						t.Error(err)
					}
				})()
			}
			err = s.Reload()
			switch {
			case tc.errWant == "" && err != nil:
				t.Fatalf("Reload: %v, want it taken", err)
			case tc.errWant != "" && (err == nil || !strings.Contains(err.Error(), tc.errWant)):
				t.Fatalf("Reload: %v, want an error saying %q", err, tc.errWant)
			}
			if got := s.Lookup([]byte(leaked)) != nil; got != tc.leakedIn {
				t.Errorf("the leaked token valid: %v, want %v", got, tc.leakedIn)
			}
			p := s.Lookup([]byte(kept))
			if got := p != nil; got != tc.keptIn {
				t.Fatalf("the kept token valid: %v, want %v", got, tc.keptIn)
			}
			// Kept as it was loaded: a line that no longer parses grants
			// nothing new.
			if p != nil && tc.keptLimitedToCNN && (p.Allow(auth.Invoke, "other") == nil || p.Limits.Rate != 5) {
				t.Errorf("the kept token: functions %q, limits %+v, want those loaded before (cnn, rate 5)", p.Functions, p.Limits)
			}
		})
	}
}
