package bundle

import (
	"context"
	"errors"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// Unpacks under way claim their files' room: one that starts beside them
// finds the disk's free space less what they have still to write, not the
// same free space each (a poll's pre-warms, started together, each passed
// the check and together filled the disk). A claim shrinks as its bytes
// are written and is given up when its file is done.
func TestRoomCountsWhatOtherUnpacksHaveStillToWrite(t *testing.T) {
	dir := t.TempDir()
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil || st.Blocks == 0 {
		t.Skipf("the disk does not say its free space: %v", err)
	}
	free := int64(st.Bavail * uint64(st.Frsize))
	size := free / 10 * 6 // two do not fit together
	a, err := room(filepath.Join(dir, "a"), size)
	if err != nil || a == nil {
		t.Fatalf("the first claim of %d of %d free bytes: %v", size, free, err)
	}
	if _, err := room(filepath.Join(dir, "b"), size); !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("a second claim of %d beside the first's unwritten %d, %d free: %v, want ENOSPC", size, size, free, err)
	}
	a.wrote(size / 2) // as if written: the test writes nothing, the disk's free space stays
	b, err := room(filepath.Join(dir, "b"), size)
	if err != nil {
		t.Fatalf("a second claim of %d beside the first's unwritten %d: %v", size, size-size/2, err)
	}
	a.done()
	b.done()
	if n := len(unwritten.by); n != 0 {
		t.Errorf("claims left counted after their files were done: %v", unwritten.by)
	}
}

// Gets that fetch (a cold start, a poll's pre-warm) take FetchTurns turns:
// past them a Get waits for one, within its context, and says so at its
// deadline. Before, every Get fetched and unpacked at once.
func TestFetchesTakeTurns(t *testing.T) {
	store, _, c := storedBundle(t)
	shas := []string{putBundle(t, store, 1, 4<<10), putBundle(t, store, 2, 4<<10), putBundle(t, store, 3, 4<<10)}
	gs := gatedStore{Store: store, calls: make(chan chan error)}
	results := make(chan error, FetchTurns)
	var gates []chan error
	for _, sha := range shas[:FetchTurns] {
		go func() { results <- cacheGet(c, gs, sha) }()
		gates = append(gates, <-gs.calls)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	late := make(chan error, 1)
	go func() { _, _, _, err := c.Get(ctx, gs, shas[FetchTurns]); late <- err }()
	select {
	case gate := <-gs.calls:
		gate <- errors.New("refused by the test")
		t.Fatalf("a Get fetched while %d others did", FetchTurns)
	case err := <-late:
		var fe *FetchError
		if !errors.As(err, &fe) || !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("a Get past the turns, at its deadline: %v, want a FetchError of the deadline", err)
		}
	}
	for _, g := range gates {
		g <- nil
	}
	for range FetchTurns {
		if err := <-results; err != nil {
			t.Fatal(err)
		}
	}
	go func() { late <- cacheGet(c, gs, shas[FetchTurns]) }()
	(<-gs.calls) <- nil // a turn is free again
	if err := <-late; err != nil {
		t.Fatal(err)
	}
}
