package worker

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
)

// ctlGroups is where the workers' groups of one cgroup controller (pids,
// memory) go, made as each worker starts, before it runs bundle code, and
// removed once it is gone: under cgroup v1 a group of its own in the
// controller's hierarchy, inside the group the server runs in (plover-
// <server pid>/<worker pid>), so that a limit set on the server's own
// group holds its workers too; where the controller shares cpu's v1
// hierarchy (co-mounted, or a root leading both to one directory), the
// worker's CPU group, as the two would be one directory; under v2 the
// worker's CPU group (CPUGroups), the controller passed down to it, as a
// process is in one group of a v2 hierarchy.
type ctlGroups struct {
	ctl    string     // the controller: "pids", "memory"
	dir    string     // v1: the workers' groups' parent; "" otherwise
	cpu    *CPUGroups // v2, or v1 sharing cpu's hierarchy: the workers' CPU groups, which hold the controller's files
	shared bool       // v1, the controller in cpu's hierarchy
	log    *slog.Logger

	mu     sync.Mutex
	broken error // the groups failed (logged once): none from then on
}

func (c *ctlGroups) off() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.broken
}

// warnOnce logs msg the first time *said (under mu) is found false.
func (c *ctlGroups) warnOnce(said *bool, msg string, args ...any) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !*said {
		*said = true
		c.log.Warn(msg, args...)
	}
}

// ready readies the controller's groups under root (the cgroup mount), or
// says why it cannot.
func (c *ctlGroups) ready(root string, cpu *CPUGroups) error {
	if ctl, err := os.ReadFile(filepath.Join(root, "cgroup.controllers")); err == nil {
		if !slices.Contains(strings.Fields(string(ctl)), c.ctl) {
			return fmt.Errorf("the cgroup v2 hierarchy at %s has no %s controller", root, c.ctl)
		}
		if cpu.Mechanism() != "cgroup v2" {
			return fmt.Errorf("under cgroup v2 the %s limit is set in each worker's CPU group, and workers have none (--cpu-weights=false, or its cgroups cannot be written: see its line)", c.ctl)
		}
		// As for cpu: the server's group passes the controller to ours,
		// ours to the workers'.
		if err := cpu.passDown(c.ctl); err != nil {
			return err
		}
		c.cpu = cpu
		return nil
	}
	// The server stays in its own group (v1 lets a group hold processes
	// beside groups): a limit set on it holds the workers' too.
	home := filepath.Join(root, c.ctl, OwnGroup(c.ctl))
	fi, err := os.Stat(filepath.Join(home, "cgroup.procs"))
	if err != nil {
		return fmt.Errorf("no cgroup v1 %s hierarchy: %w", c.ctl, err)
	}
	if cpu.Mechanism() == "cgroup v1" {
		if cfi, err := os.Stat(filepath.Join(cpu.home, "cgroup.procs")); err == nil && os.SameFile(fi, cfi) {
			c.cpu, c.shared = cpu, true
			return nil
		}
	}
	var servers []string // where a live server's own group would be (sweep)
	if cpu != nil && cpu.home != "" {
		servers = append(servers, cpu.home)
	}
	sweep(home, c.log, servers...)
	dir := filepath.Join(home, fmt.Sprintf("plover-%d", os.Getpid()))
	if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return fmt.Errorf("make a %s cgroup: %w", c.ctl, err)
	}
	c.dir = dir
	return nil
}

// mechanism is "cgroup v2" or "cgroup v1", once ready.
func (c *ctlGroups) mechanism() string {
	if c.cpu != nil && !c.shared {
		return "cgroup v2"
	}
	return "cgroup v1"
}

// place readies the controller's group of process pid, whose CPU group is
// cg (nil: none), with set, which writes the controller's files in the
// group's directory: its CPU group (own nil), or under v1 a group of its
// own, which pid is then moved into (own, for the caller to empty and
// remove once pid exited). dir is where the files are.
func (c *ctlGroups) place(pid int, cg *Group, set func(dir string) error) (own *ownGroup, dir string, err error) {
	if c.cpu != nil {
		switch {
		case cg != nil && cg.dir != "":
			return nil, cg.dir, set(cg.dir)
		case c.cpu.off():
			return nil, "", fmt.Errorf("it has no CPU group to hold its %s limit: the CPU groups are off (see their line)", c.ctl)
		}
		return nil, "", errNoCPUGroup
	}
	dir, err = makeGroup(filepath.Join(c.dir, strconv.Itoa(pid)))
	if err == nil {
		err = set(dir)
	}
	if err == nil {
		err = os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0o644)
	}
	if err != nil {
		os.Remove(dir)
		return nil, "", err
	}
	return &ownGroup{dir: dir}, dir, nil
}

// close removes the server's groups of the controller (every worker is
// gone by then).
func (c *ctlGroups) close() {
	if c.dir != "" {
		removeGroups(c.dir)
	}
}

// ownGroup is one worker's group of its own in a v1 hierarchy (pids,
// memory).
type ownGroup struct{ dir string }

// Empty kills every process left in the group, once its process exited,
// and returns once they are gone (emptyGroup).
func (c *ownGroup) Empty() error {
	if c == nil {
		return nil
	}
	return emptyGroup(c.dir)
}

// Remove removes the group once its process has exited (a zombie keeps
// no group populated). One still holding a live process (one Empty could
// not kill) is left for Close or the next server's sweep.
func (c *ownGroup) Remove() {
	if c != nil {
		os.Remove(c.dir)
	}
}
