package worker

import (
	"errors"
	"fmt"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	"github.com/plover-run/plover/abi"
)

// CPUGroups gives each worker process a cgroup of its own whose CPU weight
// follows its function's share and priority, so that the OS divides the
// CPU among workers as the device scheduler divides the device: a worker
// that spins threads beyond its runs takes them out of its own weight, not
// its neighbours'. The server creates a group when a worker takes a
// function and removes it when the worker is gone. cgroup v1 (cpu.shares)
// and v2 (cpu.weight) are both handled; where neither can be written (no
// root, a read-only hierarchy) the server says so once and runs without.
type CPUGroups struct {
	dir  string // the server's parent group, plover-<server pid>
	file string // "cpu.shares" (v1) or "cpu.weight" (v2)
	v2   bool
	log  *slog.Logger

	mu     sync.Mutex
	broken error // set once a write failed: logged once, then not tried again
}

// cgroupRoot is where cgroup hierarchies are mounted (a variable for tests).
var cgroupRoot = "/sys/fs/cgroup"

// NewCPUGroups finds the machine's cgroup CPU controller and makes the
// server's parent group; nil (logged) when there is none it can use.
func NewCPUGroups(log *slog.Logger) *CPUGroups {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	name := fmt.Sprintf("plover-%d", os.Getpid())
	var g *CPUGroups
	if ctl, err := os.ReadFile(filepath.Join(cgroupRoot, "cgroup.controllers")); err == nil {
		if !containsWord(string(ctl), "cpu") {
			log.Warn("worker CPU weights off: the cgroup v2 hierarchy has no cpu controller", "controllers", strings.TrimSpace(string(ctl)))
			return nil
		}
		g = &CPUGroups{dir: filepath.Join(cgroupRoot, name), file: "cpu.weight", v2: true, log: log}
	} else if _, err := os.Stat(filepath.Join(cgroupRoot, "cpu", "cpu.shares")); err == nil {
		g = &CPUGroups{dir: filepath.Join(cgroupRoot, "cpu", name), file: "cpu.shares", log: log}
	} else {
		log.Warn("worker CPU weights off: no cgroup cpu controller found", "root", cgroupRoot)
		return nil
	}
	sweep(filepath.Dir(g.dir))
	if err := os.Mkdir(g.dir, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		log.Warn("worker CPU weights off: cannot create a cgroup", "dir", g.dir, "error", err)
		return nil
	}
	if g.v2 {
		// Children get the cpu controller only if their parent passes it
		// down: the root to us, and we to them.
		for _, d := range []string{cgroupRoot, g.dir} {
			if err := os.WriteFile(filepath.Join(d, "cgroup.subtree_control"), []byte("+cpu"), 0o644); err != nil {
				log.Warn("worker CPU weights off: cannot enable the cpu controller", "dir", d, "error", err)
				os.Remove(g.dir)
				return nil
			}
		}
	}
	// The server itself (HTTP, the device schedulers) gets a weight above
	// any one function's, so that heavy workers cannot starve the front
	// door that admits everyone's runs; workers it starts leave for their
	// own groups when they take a function.
	if err := g.placeAt(filepath.Join(g.dir, "server"), os.Getpid(), serverWeight); err != nil {
		log.Warn("worker CPU weights off: cannot place the server in a cgroup", "error", err)
		os.Remove(filepath.Join(g.dir, "server"))
		os.Remove(g.dir)
		return nil
	}
	log.Info("worker CPU weights on", "cgroup", g.dir, "file", g.file)
	return g
}

// sweep removes the groups of servers that are gone (one killed before
// its Close): empty groups go, groups that still hold a process stay.
func sweep(parent string) {
	des, _ := os.ReadDir(parent)
	for _, de := range des {
		pid, ok := strings.CutPrefix(de.Name(), "plover-")
		if n, err := strconv.Atoi(pid); !ok || err != nil || !de.IsDir() || processExists(n) {
			continue
		}
		dir := filepath.Join(parent, de.Name())
		kids, _ := os.ReadDir(dir)
		for _, k := range kids {
			if k.IsDir() {
				os.Remove(filepath.Join(dir, k.Name()))
			}
		}
		os.Remove(dir)
	}
}

func processExists(pid int) bool {
	_, err := os.Stat(fmt.Sprintf("/proc/%d", pid))
	return err == nil
}

func containsWord(s, w string) bool {
	for _, f := range strings.Fields(s) {
		if f == w {
			return true
		}
	}
	return false
}

// Weight is a function's CPU weight relative to a default function's 1:
// its share, times 8 for the latency class and over 8 for batch, so that
// a latency function's worker wins the CPU as its runs win the device.
func Weight(m *abi.Manifest) float64 {
	w := m.Weight()
	switch m.Priority {
	case "latency":
		w *= 8
	case "batch":
		w /= 8
	}
	return w
}

// value is weight w in the controller's units: v1 shares (1024 a default
// function, 2..262144), v2 weight (100, 1..10000).
func (g *CPUGroups) value(w float64) string {
	if g.v2 {
		return strconv.Itoa(int(math.Min(10000, math.Max(1, math.Round(100*w)))))
	}
	return strconv.Itoa(int(math.Min(262144, math.Max(2, math.Round(1024*w)))))
}

// Place moves process pid into a group of its own weighted for m and
// returns the function that removes the group once pid has exited (a
// no-op when there is no group). A failure is logged once and leaves pid
// where it was.
func (g *CPUGroups) Place(pid int, m *abi.Manifest) func() {
	if g == nil {
		return func() {}
	}
	g.mu.Lock()
	broken := g.broken
	g.mu.Unlock()
	if broken != nil {
		return func() {}
	}
	dir := filepath.Join(g.dir, strconv.Itoa(pid))
	if err := g.placeAt(dir, pid, Weight(m)); err != nil {
		os.Remove(dir)
		g.mu.Lock()
		if g.broken == nil {
			g.broken = err
			g.log.Warn("worker CPU weights off: cannot place a worker in a cgroup", "function", m.Name, "pid", pid, "error", err)
		}
		g.mu.Unlock()
		return func() {}
	}
	// An empty group (its process reaped) can be removed; a group still
	// holding a process that forked away is left for Close's sweep.
	return func() { os.Remove(dir) }
}

// serverWeight is the server process's CPU weight: a default function's 8.
const serverWeight = 8

// placeAt makes group dir with weight w and moves process pid into it.
func (g *CPUGroups) placeAt(dir string, pid int, w float64) error {
	err := os.Mkdir(dir, 0o755)
	if err == nil || errors.Is(err, os.ErrExist) {
		err = os.WriteFile(filepath.Join(dir, g.file), []byte(g.value(w)), 0o644)
	}
	if err == nil {
		err = os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0o644)
	}
	return err
}

// Dir is the server's parent group ("" for nil).
func (g *CPUGroups) Dir() string {
	if g == nil {
		return ""
	}
	return g.dir
}

// Close removes the server's groups (every worker is gone by then).
func (g *CPUGroups) Close() {
	if g == nil {
		return
	}
	// The server leaves its own group first: a group holding a process
	// cannot be removed.
	os.WriteFile(filepath.Join(filepath.Dir(g.dir), "cgroup.procs"), []byte(strconv.Itoa(os.Getpid())), 0o644)
	des, _ := os.ReadDir(g.dir)
	for _, de := range des {
		if de.IsDir() {
			os.Remove(filepath.Join(g.dir, de.Name()))
		}
	}
	os.Remove(g.dir)
}
