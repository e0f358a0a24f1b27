package worker

import (
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// threadNice is thread tid of process pid's nice level, and false once
// the thread is gone.
func threadNice(pid int, tid string) (int, bool) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/stat", pid, tid))
	if err != nil {
		return 0, false
	}
	// nice is the 17th field after the command's closing parenthesis.
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	n, err := strconv.Atoi(f[16])
	return n, err == nil
}

// A worker's nice level (CPU weights by nice level) is every thread's, and
// a thread takes its level from the thread that made it: renice must leave
// no thread at the old level, those made while it went through the list
// included. A thread that made one after the list was read and before its
// own turn came passed the old level on, and renice read the list once: on
// a process whose threads keep making threads (a bundle's pool, the Go
// runtime), some were left at the old level for good.
func TestReniceLeavesNoThreadBehind(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "spawners")
	if out, err := exec.Command("gcc", "-O2", "-Wall", "-pthread", "-o", bin, filepath.Join("testdata", "spawners.c")).CombinedOutput(); err != nil {
		t.Skipf("cannot build the test program: %v\n%s", err, out)
	}
	for try := 0; try < 3; try++ {
		cmd := exec.Command(bin)
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		pid := cmd.Process.Pid
		var r [1]byte
		if n, err := out.Read(r[:]); n != 1 || err != nil {
			cmd.Process.Kill()
			cmd.Wait()
			t.Fatalf("the test program did not start: %v", err)
		}
		time.Sleep(20 * time.Millisecond) // its threads come and go
		level := 15 + try
		_, err = renice(pid, level, false)
		var behind []string
		if tasks, rerr := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid)); rerr == nil {
			for _, task := range tasks {
				if n, ok := threadNice(pid, task.Name()); ok && n != level {
					behind = append(behind, fmt.Sprintf("%s at %d", task.Name(), n))
				}
			}
		}
		cmd.Process.Kill()
		cmd.Wait()
		if err != nil {
			t.Fatalf("renice: %v", err)
		}
		if len(behind) > 0 {
			t.Fatalf("renice to %d left %d threads at another level (%s ...)", level, len(behind), strings.Join(behind[:min(4, len(behind))], ", "))
		}
	}
}

// With nice levels a worker's level (its weight, its boost) is its
// processes' too, and a process takes its level from the one that forked
// it: renicing the tree is renicing a moving set of processes. A process
// that forked after the tree was read and before its own turn came passed
// the old level to a child the pass never saw: after a boost, that child
// ran boosted until the worker's next change, which may never come. Each
// change must leave no process of the tree at the old level.
func TestReniceTreeLeavesNoProcessBehind(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("a boost lowers nice levels: it takes CAP_SYS_NICE")
	}
	bin := filepath.Join(t.TempDir(), "forkers")
	if out, err := exec.Command("gcc", "-O2", "-Wall", "-o", bin, filepath.Join("testdata", "forkers.c")).CombinedOutput(); err != nil {
		t.Skipf("cannot build the test program: %v\n%s", err, out)
	}
	cmd := exec.Command(bin)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	startInGroup(t, cmd)
	pid := cmd.Process.Pid
	var r [1]byte
	if n, err := out.Read(r[:]); n != 1 || err != nil {
		t.Fatalf("the test program did not start: %v", err)
	}
	// Its forkers' children come and go: wait for some to be there.
	for end := time.Now().Add(10 * time.Second); len(procTree(pid)) < 50; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("the test program's tree has %d processes after 10 s", len(procTree(pid)))
		}
	}
	g := &CPUGroups{nice: true, lower: true, log: slog.New(slog.DiscardHandler), boost: LightBoost}
	c := g.Place(pid, 1)
	behind := func(level int) (n int, of int) {
		tree := procTree(pid)
		for _, k := range tree {
			if f, err := statFields(fmt.Sprintf("/proc/%d/stat", k.pid)); err == nil && f[16] != strconv.Itoa(level) {
				n++
			}
		}
		return n, len(tree)
	}
	for try := 0; try < 3; try++ {
		for _, tc := range []struct {
			boost bool
			level int
		}{{true, 1}, {false, 10}} {
			c.setBoost(tc.boost)
			if n, of := behind(tc.level); n > 0 {
				t.Fatalf("boost %v: %d of the tree's %d processes not at nice %d", tc.boost, n, of, tc.level)
			}
		}
	}
	if !g.On() {
		t.Fatal("the weights turned off")
	}
}
