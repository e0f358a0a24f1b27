package objectstore

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// A file store's conditional write and delete of a record wait for its
// lock (another process, or a writer stuck in a hung disk, holds it) only
// until their context ends: a deploy's deadline bounds it, as it bounds
// every S3 request. Before, flock waited for ever.
func TestFSLockHonoursTheContext(t *testing.T) {
	for _, op := range []string{"put if", "delete"} {
		t.Run(op, func(t *testing.T) {
			dir := t.TempDir()
			s, err := NewFS(dir)
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			if err := s.PutIf(ctx, "functions/f.json", bytes.NewReader([]byte("{}")), 2, ""); err != nil {
				t.Fatal(err)
			}
			// Hold the key's lock as another writer would (flock locks
			// belong to the open file, so this process's own second open
			// waits too).
			lf, err := os.OpenFile(filepath.Join(dir, "functions", ".lock-f.json"), os.O_RDWR, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer lf.Close()
			if err := syscall.Flock(int(lf.Fd()), syscall.LOCK_EX); err != nil {
				t.Fatal(err)
			}
			cctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
			defer cancel()
			done := make(chan error, 1)
			go func() {
				if op == "delete" {
					done <- s.Delete(cctx, "functions/f.json")
				} else {
					done <- s.PutIf(cctx, "functions/f.json", bytes.NewReader([]byte("[]")), 2, "")
				}
			}()
			var err2 error
			select {
			case err2 = <-done:
			case <-time.After(10 * time.Second):
				syscall.Flock(int(lf.Fd()), syscall.LOCK_UN) // let it finish
				t.Fatalf("%s still waits for the lock 10s past its context's 100ms deadline", op)
			}
			if !errors.Is(err2, context.DeadlineExceeded) || !bytes.Contains([]byte(err2.Error()), []byte("functions/f.json")) {
				t.Fatalf("%s: %v, want a DeadlineExceeded naming the key", op, err2)
			}
			// The lock is the holder's still: it lets go, and the
			// next write goes through (the abandoned wait took nothing).
			if err := syscall.Flock(int(lf.Fd()), syscall.LOCK_UN); err != nil {
				t.Fatal(err)
			}
			if err := s.Delete(ctx, "functions/f.json"); err != nil {
				t.Fatal(err)
			}
			if err := s.PutIf(ctx, "functions/f.json", bytes.NewReader([]byte("{}")), 2, ""); err != nil {
				t.Fatalf("a write after the holder let go: %v", err)
			}
		})
	}
}
