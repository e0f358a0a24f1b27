package auth_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/plover-run/plover/auth"
)

// Review scratch: an operator revokes a token with an editor that does not
// end the file with a newline (VS Code's default, nano -L, printf): the
// SIGHUP reload is refused and the revoked token keeps working, while a
// restart loads the very same file.
func TestRVRevokeWithEditorWithoutFinalNewline(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tokens")
	keep, revoke := "ci invoke "+auth.Hash("keep")+" cnn", "old invoke "+auth.Hash("leaked")+" cnn"
	os.WriteFile(path, []byte(keep+"\n"+revoke+"\n"), 0o600)
	s, err := auth.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(path, []byte(keep), 0o600) // the leaked token's line deleted, saved without a final newline
	rerr := s.Reload()
	if s.Lookup([]byte("leaked")) != nil {
		t.Errorf("after the reload (%v) the revoked token still authenticates", rerr)
	}
	if _, err := auth.Load(path); err != nil {
		t.Errorf("startup refuses the file too: %v", err)
	} else {
		t.Logf("a restart loads the same file without complaint")
	}
}
