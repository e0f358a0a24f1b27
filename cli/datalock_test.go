package cli

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A second server on a --data directory in use removed the first's work
// in progress and spool as a crash's leftovers and evicted bundles its
// workers were starting from (a review's finding): it is refused before
// it touches anything there, naming the lock, and the first's spool is
// left alone. Once the first closes, a server takes the directory.
func TestASecondServerIsRefusedTheData(t *testing.T) {
	ctx := context.Background()
	log := slog.New(slog.DiscardHandler)
	f := &serveFlags{data: t.TempDir()}
	first := &node{}
	if _, _, err := first.openStorage(ctx, f, log); err != nil {
		t.Fatal(err)
	}
	upload := filepath.Join(f.data, "spool", "plover-deploy-1")
	if err := os.WriteFile(upload, []byte("an upload under way"), 0o600); err != nil {
		t.Fatal(err)
	}
	second := &node{}
	_, _, err := second.openStorage(ctx, f, log)
	if err == nil || !strings.Contains(err.Error(), "another plover serve uses it") {
		t.Fatalf("a second server on the same --data: %v, want it refused naming the lock", err)
	}
	if _, err := os.Stat(upload); err != nil {
		t.Fatalf("the first server's upload after the second's start: %v", err)
	}
	first.close()
	third := &node{}
	if _, _, err := third.openStorage(ctx, f, log); err != nil {
		t.Fatalf("a server after the first closed: %v", err)
	}
	third.close()
}
