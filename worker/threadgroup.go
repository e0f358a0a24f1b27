package worker

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"sync"
)

// ThreadGroups weighs the server's own threads by CPU group while they
// move a function's bytes (package ioshare's Threads): a thread moves into
// io-L, a group of the server's whose weight is that of nice level L (the
// function's weight in factors of 1.25, as NiceLevel rounds it), and back
// to the server's group after the piece. In such a group the server's work
// on a flood's bytes weighs against the workers' groups as the flood's
// worker does, not at the server's weight, which is above every
// function's so that the front door is never starved. A group is per
// level, not per function: the pieces moving at one level at once share
// its weight.
//
// Level 0 (the heaviest functions) is the server's own group, as the
// server's nice level 0 is where threads are weighed by nice level: the
// weight of a function's worker can be above an io group's, and the
// server's is above both.
//
// cgroup v1 only: there a thread's group is its own (its tasks file), and
// a thread moves itself in microseconds (it writes 0, itself: the kernel
// then takes no lock over the whole machine, which for another thread's
// id waits for an RCU grace period, milliseconds on an idle machine).
// Under v2 a thread may leave its process's group only inside a threaded
// subtree, and the workers' groups beside the server's are domains: not
// built there (ThreadGroups is nil).
type ThreadGroups struct {
	g *CPUGroups

	once  sync.Once
	err   error
	tasks [20]*os.File // each level's group's tasks file, 0 the server's; set by once
}

// Threads returns the server's thread groups, or nil where threads cannot
// be weighed by group (no cgroups, cgroup v2, weights turned off).
func (g *CPUGroups) Threads() *ThreadGroups {
	if g == nil || g.nice || g.v2 || g.off() {
		return nil
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.threads == nil {
		g.threads = &ThreadGroups{g: g}
	}
	return g.threads
}

// Base is the server's group's level, 0, and whether threads can be moved
// out of it and back: the groups are made, and a thread moved into one and
// back, once (logged if not); the thread that tried ends after the try
// (its goroutine stays locked), so that a thread stranded by a failed move
// back never runs the server's other work.
func (t *ThreadGroups) Base() (int, bool) {
	t.once.Do(func() {
		t.err = t.make()
		if t.err == nil {
			t.err = t.try()
		}
		if t.err != nil {
			t.g.log.Warn("the server's I/O cannot move at its functions' CPU weights: its threads cannot be moved between CPU groups", "error", t.err)
		}
	})
	return 0, t.err == nil
}

// try moves a thread of its own out of the server's group and back.
func (t *ThreadGroups) try() error {
	c := make(chan error)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with the goroutine
		err := t.Set(niceBase)
		if err == nil {
			err = t.Set(0)
		}
		c <- err
	}()
	return <-c
}

// make makes the groups of levels 1..19 and opens every tasks file.
func (t *ThreadGroups) make() error {
	for level := range t.tasks {
		dir := filepath.Join(t.g.dir, "server")
		if level > 0 {
			dir = filepath.Join(t.g.dir, "io-"+strconv.Itoa(level))
			if err := os.Mkdir(dir, 0o755); err != nil && !os.IsExist(err) {
				return err
			}
			w := math.Pow(1.25, float64(niceBase-level))
			if err := os.WriteFile(filepath.Join(dir, t.g.file), []byte(t.g.value(w)), 0o644); err != nil {
				return err
			}
		}
		f, err := os.OpenFile(filepath.Join(dir, "tasks"), os.O_WRONLY, 0)
		if err != nil {
			return err
		}
		t.tasks[level] = f
	}
	return nil
}

// Set moves the calling thread, locked to its goroutine, into level's
// group (0: the server's). Base must have said yes. (Whether to move one
// at all is the caller's: ioshare asks Config.Weighing, CPUGroups.On.)
func (t *ThreadGroups) Set(level int) error {
	if level < 0 || level >= len(t.tasks) || t.tasks[level] == nil {
		return fmt.Errorf("no CPU group for thread level %d", level)
	}
	f := t.tasks[level]
	if _, err := f.WriteString("0"); err != nil {
		return fmt.Errorf("move a thread into %s: %w", f.Name(), err)
	}
	return nil
}

// close closes the groups' files (CPUGroups.Close removes the groups); a
// Set after it fails, and its thread stays where it is.
func (t *ThreadGroups) close() {
	if t == nil {
		return
	}
	t.once.Do(func() { t.err = os.ErrClosed })
	for _, f := range t.tasks {
		if f != nil {
			f.Close()
		}
	}
}
