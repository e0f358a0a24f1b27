package worker

import (
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"testing"
	"time"
)

// hookWalkingKin puts f where a tree's walk comes to each process
// (walkingKin) until the test ends.
func hookWalkingKin(t *testing.T, f func(c *Group, k kin)) {
	old := walkingKin
	walkingKin = f
	t.Cleanup(func() { walkingKin = old })
}

// bigTree starts a worker with n children (sleeps, in its process group:
// ended with the test) and returns its pid once all show in its tree.
func bigTree(t *testing.T, n int) int {
	t.Helper()
	cmd := exec.Command("sh", "-c", fmt.Sprintf(`i=0; while [ $i -lt %d ]; do sleep 60 & i=$((i+1)); done; wait`, n))
	startInGroup(t, cmd)
	pid := cmd.Process.Pid
	waitFor(t, fmt.Sprintf("the worker's %d children", n), func() bool { return len(procTree(pid)) == n+1 })
	return pid
}

// walkCase is what a case of TestATreeWalkHoldsOffNothing works on: the
// groups, c the one of the worker with the large tree and other another
// worker's, and p c's worker as a tenant's.
type walkCase struct {
	g        *CPUGroups
	c, other *Group
	p        *proc
}

// With nice levels each write of a worker's weight walks its whole tree
// (up to 1,024 processes, each thread of each set in passes): measured,
// 76-86 ms for 500 processes, and up to a second for threads that keep
// raising their own levels. Made under the group's lock, and for a
// tenant's worker under the worker's too, it held off for as long the
// group's Dying, a kill at a deadline, every run's CPU readings (each run
// takes the worker's lock twice) and, on the boost loop's one goroutine,
// every other worker's boost. Each must complete while a walk of a
// 200-process tree is held at its first child; the walk then goes on
// where nothing superseded it, and stops where a later write (Dying)
// did, leaving the tree to it.
func TestATreeWalkHoldsOffNothing(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("a boost and Dying take nice levels back down: CAP_SYS_NICE")
	}
	notNiced(t)
	const kids = 200
	const holdFor = 10 * time.Second // the walk is held at most this long
	reweigh := func(w walkCase) { w.p.reweigh(time.Now()) }
	for _, tc := range []struct {
		name string
		// walk writes c's weight (from a default function's, nice 10),
		// walking its tree; during must complete while that walk is held.
		walk, during func(w walkCase)
		want         int // c's children's level after (-1: killed)
	}{
		{"the group's Dying", func(w walkCase) { w.c.setWeight(1.0/8, []string{"f"}) },
			func(w walkCase) { w.c.Dying() }, 10},
		{"a run of the tenant's worker", reweigh,
			func(w walkCase) { w.p.runEnded(w.p.runBegan(), false) }, 19},
		{"a kill at a deadline", reweigh,
			func(w walkCase) { w.p.killFor(nil, "its deadline passed") }, -1},
		{"another worker's boost", func(w walkCase) {
			w.g.setBoosts([]*Group{w.c, w.other}, []bool{true, true}, make([]lightRecord, 2))
		}, func(w walkCase) {
			for end := time.Now().Add(3 * holdFor); !w.other.atLevel(1) && time.Now().Before(end); {
				time.Sleep(time.Millisecond)
			}
		}, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pid := bigTree(t, kids)
			other := exec.Command("sleep", "60")
			startInGroup(t, other)
			g := &CPUGroups{nice: true, lower: true, log: slog.New(slog.DiscardHandler), boost: LightBoost}
			w := walkCase{g: g, c: g.Place(pid, 1), other: g.Place(other.Process.Pid, 1)}
			w.p = tenantProc(w.c, weighWindow)
			w.p.pid, w.p.cpu.on = pid, true
			weighedProgram(w.p, "f", 1.0/8)

			held, timedOut := false, false
			done := make(chan struct{})
			hookWalkingKin(t, func(walker *Group, _ kin) {
				if walker != w.c || held {
					return
				}
				held = true
				go func() { tc.during(w); close(done) }()
				select {
				case <-done:
				case <-time.After(holdFor):
					timedOut = true
				}
			})
			tc.walk(w)
			if !held {
				t.Fatal("the walk never came to the worker's children")
			}
			<-done
			if timedOut {
				t.Fatalf("it waited for the walk of the worker's tree (held %v)", holdFor)
			}
			if tc.want < 0 {
				return
			}
			for _, k := range procTree(pid)[1:] {
				if n := niceOf(t, k.pid); n != tc.want {
					t.Fatalf("child %d at nice %d after the walk, want %d", k.pid, n, tc.want)
				}
			}
		})
	}
}

// atLevel reports whether c's worker was last set to nice level n.
func (c *Group) atLevel(n int) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.level == n
}
