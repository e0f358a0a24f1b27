package cli

import (
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/ioshare"
	"github.com/plover-run/plover/sched"
	"github.com/plover-run/plover/worker"
	"golang.org/x/sys/unix"
)

// The CPU weights a case runs under, each built by worker.NewCPUGroupsAt
// over a fake cgroup tree of plain files and directories.
type cpuTree int

const (
	v1Movable    cpuTree = iota // cgroup v1 whose groups have tasks files: a thread moves
	v1Stuck                     // cgroup v1 whose groups have no tasks file: Base says no
	v2                          // cgroup v2 with the cpu controller
	niceLevels                  // no hierarchy: nice levels
	weightsOff                  // --cpu-weights=false: no CPUGroups at all
	weightsBroke                // cgroup v1 whose weights were turned off by a failed write
)

func (c cpuTree) String() string {
	return [...]string{"v1", "v1 stuck", "v2", "nice", "weights off", "weights broke"}[c]
}

// buildCPU makes tree's CPUGroups and the v1 server group's directory
// ("" for the others), closed when the test ends.
func buildCPU(t *testing.T, tree cpuTree, log *slog.Logger) (*worker.CPUGroups, string) {
	t.Helper()
	root := t.TempDir()
	server := fmt.Sprintf("plover-%d", os.Getpid())
	var cpu *worker.CPUGroups
	var dir string
	switch tree {
	case weightsOff:
		return nil, ""
	case niceLevels:
		cpu = worker.NewCPUGroupsAt(filepath.Join(root, "none"), log)
	case v2:
		home := filepath.Join(root, worker.OwnGroup(""))
		if err := os.MkdirAll(home, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, "cgroup.controllers"), []byte("cpuset cpu io memory pids\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		cpu = worker.NewCPUGroupsAt(root, log)
	case v1Movable, v1Stuck, weightsBroke:
		home := filepath.Join(root, "cpu", worker.OwnGroup("cpu"))
		if err := os.MkdirAll(home, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, "cpu", "cpu.shares"), []byte("1024\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		cpu = worker.NewCPUGroupsAt(root, log)
		dir = filepath.Join(home, server)
	}
	t.Cleanup(cpu.Close)
	want := map[cpuTree]string{v1Movable: "cgroup v1", v1Stuck: "cgroup v1", weightsBroke: "cgroup v1", v2: "cgroup v2", niceLevels: "nice"}[tree]
	if got := cpu.Mechanism(); got != want {
		t.Fatalf("the fake %s tree gave CPU weights by %q, want %q", tree, got, want)
	}
	switch tree {
	case v1Movable:
		// A group's tasks file is the kernel's, made with the group: here
		// each group ThreadGroups makes (the server's, io-1..io-19) has one
		// beforehand, a plain file that takes the "0" of a move.
		for level := range 20 {
			g := filepath.Join(dir, "io-"+strconv.Itoa(level))
			if level == 0 {
				g = filepath.Join(dir, "server")
			}
			if err := os.MkdirAll(g, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(g, "tasks"), nil, 0o644); err != nil {
				t.Fatal(err)
			}
		}
	case weightsBroke:
		// A worker's weight that cannot be written (its cpu.shares made
		// a directory once it was placed) turns the weights off. (A
		// leftover group of its name is no such failure: a worker takes
		// a fresh name beside it.)
		g := cpu.Place(4242, 1)
		if g == nil {
			t.Fatal("a worker not placed in a fresh tree")
		}
		shares := filepath.Join(dir, "4242", "cpu.shares")
		if err := os.Remove(shares); err != nil {
			t.Fatal(err)
		}
		if err := os.Mkdir(shares, 0o755); err != nil {
			t.Fatal(err)
		}
		g.Weigh(&abi.Manifest{Name: "f", Share: 2})
		if got := cpu.Mechanism(); got != "off" {
			t.Fatalf("CPU weights by %q after a failed write, want off", got)
		}
	}
	return cpu, dir
}

// testWriter is a slog handler's writer into the test's log.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Helper()
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// TestIOSharesByCPUWeights: --io-shares auto turns the server's I/O shares
// on where its threads can be weighed as the workers are (nice levels it
// may take back; cgroup v1 thread groups a thread moves into and back),
// and off under cgroup v2, without CPU weights or with them turned off,
// where v1 threads cannot move, and with --sched off; on turns them on
// everywhere, weighed only where threads can be; off turns them off. Where
// they are on and weighed, Threads is the mechanism's, Nice gives a
// function's nice level and Log is the server's; elsewhere none is set.
// Thread groups are only tried (io-L groups made) where they may be used.
//
// The nice-level cases depend on ioshare.CanWeigh, which a process at nice
// 19 never may (it cannot raise a thread's level): the test runs once as
// it is (CanWeigh yes with CAP_SYS_NICE, as root; else as RLIMIT_NICE
// allows) and once more in a child of its own binary with every thread at
// nice 19, where it says no, so both answers are tested anywhere.
func TestIOSharesByCPUWeights(t *testing.T) {
	const atNice19 = "PLOVER_TEST_IOSHARES_NICE19"
	child := os.Getenv(atNice19) == "1"
	if child {
		niceAllThreads(t, 19)
	}
	canWeigh := ioshare.CanWeigh()
	t.Logf("ioshare.CanWeigh() = %v", canWeigh)
	if child && canWeigh {
		t.Fatal("ioshare.CanWeigh() says yes with every thread at nice 19")
	}
	// What nice levels give: on where the process may take a thread's
	// level back, by NiceLevels; else off (auto), or on unweighed (on).
	niceThreads, niceAutoOff := "", true
	if canWeigh {
		niceThreads, niceAutoOff = "nice", false
	}

	tests := []struct {
		ioShares, sched string
		tree            cpuTree
		off             bool
		threads         string // "groups" (*worker.ThreadGroups), "nice" (ioshare.NiceLevels), "" (nil)
		tried           bool   // v1Movable: thread groups made (io-L's cpu.shares written)
	}{
		{"auto", "fair", v1Movable, false, "groups", true},
		{"auto", "fair-no-reserve", v1Movable, false, "groups", true},
		{"auto", "fair", v1Stuck, true, "", false},
		{"auto", "fair", v2, true, "", false},
		{"auto", "fair", niceLevels, niceAutoOff, niceThreads, false},
		{"auto", "fair", weightsOff, true, "", false},
		{"auto", "fair", weightsBroke, true, "", false},
		{"auto", "off", v1Movable, true, "", false},
		{"auto", "off", niceLevels, true, "", false},

		{"on", "fair", v1Movable, false, "groups", true},
		{"on", "fair", v1Stuck, false, "", false},
		{"on", "fair", v2, false, "", false},
		{"on", "fair", niceLevels, false, niceThreads, false},
		{"on", "fair", weightsOff, false, "", false},
		{"on", "off", v1Movable, false, "", false},
		{"on", "off", niceLevels, false, "", false},

		{"off", "fair", v1Movable, true, "", false},
		{"off", "fair", v2, true, "", false},
		{"off", "fair", niceLevels, true, "", false},
		{"off", "fair", weightsOff, true, "", false},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("%s/%s/sched-%s", tt.ioShares, tt.tree, tt.sched), func(t *testing.T) {
			log := slog.New(slog.NewTextHandler(testWriter{t}, nil))
			cpu, dir := buildCPU(t, tt.tree, log)
			f := &serveFlags{ioShares: tt.ioShares, sched: tt.sched, cpuWeights: tt.tree != weightsOff}
			// Off starts at the opposite of the answer, so that an Off
			// left as it was fails.
			cfg := ioshare.Config{Off: !tt.off}
			ioShares(f, cpu, &cfg, log)

			if cfg.Off != tt.off {
				t.Errorf("Off = %v, want %v (CPU weights by %s)", cfg.Off, tt.off, cpu.Mechanism())
			}
			switch th := cfg.Threads.(type) {
			case nil:
				if tt.threads != "" {
					t.Errorf("Threads nil, want %s", tt.threads)
				}
			case *worker.ThreadGroups:
				if tt.threads != "groups" {
					t.Errorf("Threads %T, want %q", th, tt.threads)
				} else if th != cpu.Threads() {
					t.Errorf("Threads %p, not the CPU groups' own %p", th, cpu.Threads())
				} else if level, ok := th.Base(); level != 0 || !ok {
					t.Errorf("Threads' Base = %d, %v; want 0, true", level, ok)
				}
			case ioshare.NiceLevels:
				if tt.threads != "nice" {
					t.Errorf("Threads %T, want %q", th, tt.threads)
				}
			default:
				t.Errorf("Threads %T, want %q", th, tt.threads)
			}
			if set := cfg.Threads != nil; (cfg.Nice != nil) != set || (cfg.Log != nil) != set || (cfg.Weighing != nil) != set {
				t.Errorf("Nice set %v, Log set %v and Weighing set %v, want all %v (Threads %T)", cfg.Nice != nil, cfg.Log != nil, cfg.Weighing != nil, set, cfg.Threads)
			}
			if cfg.Weighing != nil && cfg.Weighing() != cpu.On() {
				t.Errorf("Weighing says %v where the workers' weights are on: %v", cfg.Weighing(), cpu.On())
			}
			if cfg.Log != nil && cfg.Log != log {
				t.Error("Log is not the server's")
			}
			if cfg.Nice != nil {
				// A default function's weight is nice 10; latency's 8x is
				// 9 levels of 1.25 lighter, batch's 1/8 9 heavier.
				for class, want := range map[sched.Class]int{sched.Default: 10, sched.Latency: 1, sched.Batch: 19} {
					if got := cfg.Nice(1, class); got != want {
						t.Errorf("Nice(1, %s) = %d, want %d", class, got, want)
					}
				}
				if got := cfg.Nice(2, sched.Default); got != 7 {
					t.Errorf("Nice(2, default) = %d, want 7", got)
				}
			}
			if tt.tree == v1Movable {
				_, err := os.Stat(filepath.Join(dir, "io-"+strconv.Itoa(10), "cpu.shares"))
				if tried := err == nil; tried != tt.tried {
					t.Errorf("thread groups made: %v, want %v", tried, tt.tried)
				}
			}
		})
	}
	if child {
		return
	}
	t.Run("at nice 19", func(t *testing.T) {
		cmd := exec.Command(os.Args[0], "-test.run=^TestIOSharesByCPUWeights$", "-test.count=1", "-test.v")
		cmd.Env = append(os.Environ(), atNice19+"=1")
		out, err := cmd.CombinedOutput()
		if err != nil || !strings.Contains(string(out), "--- PASS: TestIOSharesByCPUWeights ") ||
			!strings.Contains(string(out), "ioshare.CanWeigh() = false") {
			t.Fatalf("the table at nice 19: %v\n%s", err, out)
		}
	})
}

// niceAllThreads puts every thread of this process at nice level n (a
// thread's own on Linux; a thread inherits its creator's), twice over in
// case a thread was started from one not yet moved.
func niceAllThreads(t *testing.T, n int) {
	t.Helper()
	for range 2 {
		tasks, err := os.ReadDir("/proc/self/task")
		if err != nil {
			t.Fatal(err)
		}
		for _, task := range tasks {
			tid, err := strconv.Atoi(task.Name())
			if err != nil {
				continue
			}
			if err := unix.Setpriority(unix.PRIO_PROCESS, tid, n); err != nil && err != unix.ESRCH {
				t.Fatalf("nice thread %d to %d: %v", tid, n, err)
			}
		}
	}
}
