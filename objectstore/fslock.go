package objectstore

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"syscall"
)

// lockKey takes the exclusive lock of the object at p: flock on a lock file
// beside it, which stays (it is never removed, so every process locks the
// same inode). It waits for another holder only until ctx ends.
//
// In this process a key's writers take turns first (keyTurn), each waiting
// for its turn only until its ctx ends; the one whose turn it is waits in a
// blocking flock, woken by the kernel as soon as another process lets go.
// So at most one thread per contended key sits in flock, however many
// callers give up and retry while another process holds the lock (a
// thread per caller piles up to Go's limit, fatal), and a waiter is not
// starved by newcomers as it was when every waiter polled a non-blocking
// flock with a backoff. A turn whose caller gave up while it waited in
// flock is kept by that wait until it returns, and then handed on.
func (s *FS) lockKey(ctx context.Context, p string) (func(), error) {
	name := lockName(p)
	held := func() error {
		return fmt.Errorf("store %s: lock file %s: another writer holds it (another process writing the store, or a write stuck on the disk): %w", s, name, ctx.Err())
	}
	t := takeTurn(name)
	select {
	case t.c <- struct{}{}:
	case <-ctx.Done():
		t.leave()
		return nil, held()
	}
	done := func(lf *os.File) {
		if lf != nil {
			lf.Close() // and with it the flock
		}
		<-t.c
		t.leave()
	}
	lf, err := os.OpenFile(name, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		done(nil)
		return nil, fmt.Errorf("store %s: lock: %w", s, err)
	}
	fd := int(lf.Fd())
	if err := syscall.Flock(fd, syscall.LOCK_EX|syscall.LOCK_NB); err == nil {
		return func() { done(lf) }, nil
	} else if !errors.Is(err, syscall.EWOULDBLOCK) {
		done(lf)
		return nil, fmt.Errorf("store %s: lock file %s: %w", s, name, err)
	}
	got := make(chan error, 1)
	go func() {
		for {
			err := syscall.Flock(fd, syscall.LOCK_EX)
			if !errors.Is(err, syscall.EINTR) {
				got <- err
				return
			}
		}
	}()
	select {
	case err := <-got:
		if err != nil {
			done(lf)
			return nil, fmt.Errorf("store %s: lock file %s: %w", s, name, err)
		}
		return func() { done(lf) }, nil
	case <-ctx.Done():
		go func() {
			<-got
			done(lf)
		}()
		return nil, held()
	}
}

// keyTurn is a lock file's turn among this process's writers: a channel
// of one, so that waiting for it can end with a context.
type keyTurn struct {
	name  string
	c     chan struct{}
	users int // under turnsMu: callers holding or waiting for the turn
}

var (
	turnsMu sync.Mutex
	turns   = map[string]*keyTurn{} // by lock file; a key no caller wants is not kept
)

// takeTurn is the lock file's turn, counted as wanted until leave.
func takeTurn(name string) *keyTurn {
	turnsMu.Lock()
	defer turnsMu.Unlock()
	t := turns[name]
	if t == nil {
		t = &keyTurn{name: name, c: make(chan struct{}, 1)}
		turns[name] = t
	}
	t.users++
	return t
}

func (t *keyTurn) leave() {
	turnsMu.Lock()
	defer turnsMu.Unlock()
	if t.users--; t.users == 0 {
		delete(turns, t.name)
	}
}
