package worker

import (
	"context"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"log/slog"

	"github.com/plover-run/plover/ioshare"
	"github.com/plover-run/plover/sched"
)

// threadGroup is the calling thread's cpu group under cgroup v1.
func threadGroup(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile("/proc/thread-self/cgroup")
	if err != nil {
		t.Fatal(err)
	}
	path, ok := procGroup(string(b), func(_ bool, ctls []string) bool { return slices.Contains(ctls, "cpu") })
	if ok {
		return path
	}
	t.Fatalf("no cpu group in %q", b)
	return ""
}

// TestThreadGroupsMoveAThreadAndBack, on the machine's own cgroup v1 cpu
// hierarchy: a thread the server moves for a piece is in the group of
// that level, whose weight is the level's (share 1.25^(10-level)), and
// back in the server's group after; the server's other threads never
// left it; Close removes the groups. Where cgroups are not v1 and
// writable (a container, cgroup v2), Threads is nil and the test is
// skipped.
func TestThreadGroupsMoveAThreadAndBack(t *testing.T) {
	g := NewCPUGroups(slog.New(slog.DiscardHandler))
	if g == nil || g.Mechanism() != "cgroup v1" {
		g.Close()
		t.Skip("no writable cgroup v1 cpu hierarchy here")
	}
	defer g.Close()
	tg := g.Threads()
	if tg == nil {
		t.Fatal("no thread groups on cgroup v1")
	}
	if level, ok := tg.Base(); !ok || level != 0 {
		t.Fatalf("Base = %d, %v", level, ok)
	}
	server := threadGroup(t)
	if !strings.HasSuffix(server, "/server") {
		t.Fatalf("the test's thread is in %q, want the server's group", server)
	}
	type seen struct{ during, after, shares string }
	c := make(chan seen)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		var s seen
		if err := tg.Set(3); err != nil {
			t.Error(err)
		}
		s.during = threadGroup(t)
		b, _ := os.ReadFile(filepath.Join(g.dir, "io-3", "cpu.shares"))
		s.shares = strings.TrimSpace(string(b))
		if err := tg.Set(0); err != nil {
			t.Error(err)
		}
		s.after = threadGroup(t)
		c <- s
	}()
	s := <-c
	if !strings.HasSuffix(s.during, "/io-3") || s.after != server {
		t.Fatalf("the thread was in %q during its piece and in %q after, want .../io-3 and %q", s.during, s.after, server)
	}
	if want := g.value(1.25 * 1.25 * 1.25 * 1.25 * 1.25 * 1.25 * 1.25); s.shares != want {
		t.Fatalf("io-3's cpu.shares %s, want %s", s.shares, want)
	}
	if got := threadGroup(t); got != server {
		t.Fatalf("the test's own thread moved to %q", got)
	}
	dir := g.dir
	g.Close()
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Fatalf("the server's groups outlived Close: %v", err)
	}
}

// TestThreadGroupsStayHomeOnceWeightsAreOff: once the workers' CPU weights
// are turned off after a failed write (CPUGroups.fail), workers placed
// from then on stay in the server's group, at its weight, above every
// function's: a piece's thread moved into an io group then would move a
// function's bytes at a small fraction of what the workers beside it get
// (io-10's 1024 against the server group's 262144), so that the server's
// I/O starves behind them. Set must then leave a thread in the server's
// group (an error: ioshare moves the piece at the server's weight), and
// still take one back there.
func TestThreadGroupsStayHomeOnceWeightsAreOff(t *testing.T) {
	g := NewCPUGroups(slog.New(slog.DiscardHandler))
	if g == nil || g.Mechanism() != "cgroup v1" {
		g.Close()
		t.Skip("no writable cgroup v1 cpu hierarchy here")
	}
	defer g.Close()
	tg := g.Threads()
	if _, ok := tg.Base(); !ok {
		t.Fatal("Base says threads cannot move")
	}
	server := threadGroup(t)
	g.fail(nil, os.ErrPermission, "a worker's weight could not be written (test)")
	if m := g.Mechanism(); m != "off" {
		t.Fatalf("Mechanism %q after a failure, want off", m)
	}
	// A function's piece beside another's, as the server moves them
	// (ioshare asks Weighing, which the server sets to CPUGroups.On).
	sh := ioshare.New(ioshare.Config{Slots: 3, Hold: time.Minute, Threads: tg, Weighing: g.On,
		Nice: func(float64, sched.Class) int { return 10 }})
	f, other := sh.Flow("f"), sh.Flow("other")
	f.Set(1, sched.Default)
	busy, err := other.Turn(context.Background(), time.Time{}, nil, false)
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Done()
	c := make(chan [2]string)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		tn, err := f.Turn(context.Background(), time.Time{}, nil, false)
		if err != nil {
			t.Error(err)
		}
		during := threadGroup(t)
		tn.Done()
		c <- [2]string{during, threadGroup(t)}
	}()
	if s := <-c; s[0] != server || s[1] != server {
		t.Fatalf("with the weights off, a function's piece moved on a thread in %q (after: %q); want %q, the server's", s[0], s[1], server)
	}
}
