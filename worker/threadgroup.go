package worker

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"sync"

	"golang.org/x/sys/unix"
)

// ThreadGroups weighs the server's own threads by CPU group while they
// move a function's bytes (package ioshare's Threads): a thread moves into
// io-L, a group of the server's whose weight is that of nice level L (the
// function's weight in factors of 1.25, as NiceLevel rounds it), and back
// to the server's group after the piece. In a group of its own the
// server's work on a flood's bytes weighs against the workers' groups as
// the flood's worker does, not at the server's weight, which is above
// every function's so that the front door is never starved.
//
// cgroup v1 only: there a thread's group is its own (its tasks file), and
// moving one costs microseconds. Under v2 a thread may leave its process's
// group only inside a threaded subtree, and the workers' groups beside the
// server's are domains: not built there (ThreadGroups is nil).
type ThreadGroups struct {
	g *CPUGroups

	mu    sync.Mutex
	tasks map[int]*os.File // each group's tasks file by level; serverLevel the server's
}

// serverLevel is the server's own group's level in ThreadGroups: below
// every function's (0..19).
const serverLevel = -1

// Threads returns the server's thread groups, or nil where threads cannot
// be weighed by group (no cgroups, cgroup v2, weights turned off).
func (g *CPUGroups) Threads() *ThreadGroups {
	if g == nil || g.nice || g.v2 || g.off() {
		return nil
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.threads == nil {
		g.threads = &ThreadGroups{g: g, tasks: map[int]*os.File{}}
	}
	return g.threads
}

// Base is the server's group's level, and whether a thread can be moved
// out of it and back: tried once, on a thread that ends after the try
// (its goroutine stays locked), so that a thread stranded by a failed
// move back never runs the server's other work.
func (t *ThreadGroups) Base() (int, bool) {
	ok := make(chan bool)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with the goroutine
		ok <- t.Set(niceBase) == nil && t.Set(serverLevel) == nil
	}()
	return serverLevel, <-ok
}

// Set moves the calling thread into level's group (serverLevel: the
// server's), making the group on first use.
func (t *ThreadGroups) Set(level int) error {
	f, err := t.file(level)
	if err != nil {
		return err
	}
	_, err = f.WriteString(strconv.Itoa(unix.Gettid()))
	if err != nil {
		return fmt.Errorf("move a thread into %s: %w", f.Name(), err)
	}
	return nil
}

// file is level's group's tasks file, kept open: a move is one write.
func (t *ThreadGroups) file(level int) (*os.File, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if f := t.tasks[level]; f != nil {
		return f, nil
	}
	dir := filepath.Join(t.g.dir, "server")
	if level != serverLevel {
		if level < 0 || level > 19 {
			return nil, fmt.Errorf("thread level %d is out of 0..19", level)
		}
		dir = filepath.Join(t.g.dir, "io-"+strconv.Itoa(level))
		if err := os.Mkdir(dir, 0o755); err != nil && !os.IsExist(err) {
			return nil, err
		}
		w := math.Pow(1.25, float64(niceBase-level))
		if err := os.WriteFile(filepath.Join(dir, t.g.file), []byte(t.g.value(w)), 0o644); err != nil {
			return nil, err
		}
	}
	f, err := os.OpenFile(filepath.Join(dir, "tasks"), os.O_WRONLY, 0)
	if err != nil {
		return nil, err
	}
	t.tasks[level] = f
	return f, nil
}

// close closes the groups' files (CPUGroups.Close removes the groups).
func (t *ThreadGroups) close() {
	if t == nil {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	for l, f := range t.tasks {
		f.Close()
		delete(t.tasks, l)
	}
}
