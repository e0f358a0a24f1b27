package objectstore

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
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
			dir, s, lf := heldStore(t)
			ctx := context.Background()
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
			if !errors.Is(err2, context.DeadlineExceeded) {
				t.Fatalf("%s: %v, want a DeadlineExceeded", op, err2)
			}
			// It names the key, the store, the lock file and why.
			for _, w := range []string{"functions/f.json", "file://" + dir, filepath.Join(dir, "functions", ".lock-f.json"), "another writer holds"} {
				if !strings.Contains(err2.Error(), w) {
					t.Errorf("%s: %q does not say %q", op, err2, w)
				}
			}
			// The lock is the holder's still: it lets go, and the
			// next write goes through (the abandoned wait took nothing).
			// Bounded, so that a wait that never ends fails here rather
			// than hanging the test binary.
			if err := syscall.Flock(int(lf.Fd()), syscall.LOCK_UN); err != nil {
				t.Fatal(err)
			}
			fctx, fcancel := context.WithTimeout(ctx, 10*time.Second)
			defer fcancel()
			if err := s.Delete(fctx, "functions/f.json"); err != nil {
				t.Fatal(err)
			}
			if err := s.PutIf(fctx, "functions/f.json", bytes.NewReader([]byte("{}")), 2, ""); err != nil {
				t.Fatalf("a write after the holder let go: %v", err)
			}
		})
	}
}

// fdCount is the number of file descriptors this process has open.
func fdCount(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skipf("cannot count file descriptors: %v", err)
	}
	return len(ents)
}

// threadCount is the number of OS threads of this process.
func threadCount(t *testing.T) int {
	t.Helper()
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Skipf("cannot count threads: %v", err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "Threads:"); ok {
			n, err := strconv.Atoi(strings.TrimSpace(v))
			if err != nil {
				t.Fatalf("threads: %q: %v", l, err)
			}
			return n
		}
	}
	t.Skip("no thread count in /proc/self/status")
	return 0
}

// waitFor polls cond (a state of the process, which the runtime settles
// on its own time) until it holds or d has passed; it reports whether it
// held.
func waitFor(d time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		runtime.Gosched()
	}
	return true
}

// A lock wait given up by its context leaves nothing behind: no goroutine
// (and so no OS thread) blocked in flock, no open lock file. Before, each
// abandoned wait left a goroutine in a blocking flock, holding a thread
// and an fd until the holder let go: with a holder that never does and
// callers retrying, threads piled up to Go's 10,000-thread limit (fatal).
func TestFSLockWaitGivenUpLeavesNothing(t *testing.T) {
	_, s, lf := heldStore(t)
	ctx := context.Background()
	defer syscall.Flock(int(lf.Fd()), syscall.LOCK_UN) // lets a leaked wait end

	goroutines, fds, threads := runtime.NumGoroutine(), fdCount(t), threadCount(t)
	const calls = 200
	for i := 0; i < calls; i++ {
		cctx, cancel := context.WithTimeout(ctx, time.Millisecond)
		var err error
		if i%2 == 0 {
			err = s.PutIf(cctx, "functions/f.json", bytes.NewReader([]byte("[]")), 2, "")
		} else {
			err = s.Delete(cctx, "functions/f.json")
		}
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("call %d: %v, want DeadlineExceeded", i, err)
		}
	}
	// Go keeps the threads it made: a wait that blocked one in flock
	// shows as growth here even after it ended.
	if n := threadCount(t); n > threads+calls/10 {
		t.Errorf("%d OS threads after %d abandoned lock waits, %d before: waits held threads in flock", n, calls, threads)
	}
	if !waitFor(5*time.Second, func() bool { return runtime.NumGoroutine() <= goroutines }) {
		t.Errorf("%d goroutines after %d abandoned lock waits, %d before: waits left blocked in flock", runtime.NumGoroutine(), calls, goroutines)
	}
	if !waitFor(5*time.Second, func() bool { return fdCount(t) <= fds }) {
		t.Errorf("%d open fds after %d abandoned lock waits, %d before: lock files left open", fdCount(t), calls, fds)
	}

	// The holder lets go: the next write goes through.
	if err := syscall.Flock(int(lf.Fd()), syscall.LOCK_UN); err != nil {
		t.Fatal(err)
	}
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := s.PutIf(cctx, "functions/f.json", bytes.NewReader([]byte("[]")), 2, ""); !errors.Is(err, ErrPrecondition) {
		t.Fatalf("create over an existing record after the holder let go: %v, want ErrPrecondition", err)
	}
	in, err := s.Stat(cctx, "functions/f.json")
	if err != nil {
		t.Fatal(err)
	}
	if err := s.PutIf(cctx, "functions/f.json", bytes.NewReader([]byte("[]")), 2, in.ETag); err != nil {
		t.Fatalf("a write after the holder let go: %v", err)
	}
}

// heldStore is a file store holding functions/f.json whose key's lock is
// held by another open file, as another writer would hold it (flock locks
// belong to the open file, so this process's own second open waits too).
// The holder is closed when the test ends.
func heldStore(t *testing.T) (string, *FS, *os.File) {
	t.Helper()
	dir := t.TempDir()
	s, err := NewFS(dir)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.PutIf(context.Background(), "functions/f.json", bytes.NewReader([]byte("{}")), 2, ""); err != nil {
		t.Fatal(err)
	}
	lf, err := os.OpenFile(filepath.Join(dir, "functions", ".lock-f.json"), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lf.Close() })
	if err := syscall.Flock(int(lf.Fd()), syscall.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	return dir, s, lf
}
