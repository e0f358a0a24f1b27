package auth_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/plover-run/plover/auth"
)

// An operator revokes a token with an editor that does not end the file
// with a newline (VS Code's default, nano -L, printf): the file, the same a
// moment later, is taken at the SIGHUP, as at a restart (it was refused,
// and the revoked token kept working).
func TestRevokeSavedWithoutAFinalNewline(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tokens")
	keep, revoke := "ci invoke "+auth.Hash("keep")+" cnn", "old invoke "+auth.Hash("leaked")+" cnn"
	os.WriteFile(path, []byte(keep+"\n"+revoke+"\n"), 0o600)
	s, err := auth.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(path, []byte(keep), 0o600) // the leaked token's line deleted, saved without a final newline
	rerr := s.Reload()
	if rerr != nil || s.Lookup([]byte("leaked")) != nil {
		t.Errorf("after the reload (%v) the revoked token still authenticates", rerr)
	}
	if _, err := auth.Load(path); err != nil {
		t.Errorf("startup refuses the file too: %v", err)
	} else {
		t.Logf("a restart loads the same file without complaint")
	}
}
