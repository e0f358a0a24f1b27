package worker

// The server's cgroup v2 groups pass controllers down (cpu here, pids and
// memory in ctlGroups), which the server takes back as it stops.

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
)

// passDown passes controller ctl down from the server's home group to its
// own (plover-<pid>) and on to the workers' groups in it: a group gets a
// controller only if its parent passes it. It notes whether home passed
// it before: Close takes back only what the server passed (takeBack).
func (g *CPUGroups) passDown(ctl string) error {
	had := slices.Contains(subtreeControllers(g.home), ctl)
	if err := enableController(g.home, ctl); err != nil {
		return err
	}
	if !had {
		g.mu.Lock()
		g.passed = append(g.passed, ctl)
		g.mu.Unlock()
	}
	return enableController(g.dir, ctl)
}

// subtreeControllers is the controllers group dir passes down (its
// cgroup.subtree_control; a fake hierarchy's file holds what was last
// written, "+ctl").
func subtreeControllers(dir string) []string {
	b, _ := os.ReadFile(filepath.Join(dir, "cgroup.subtree_control"))
	var ctls []string
	for _, f := range strings.Fields(string(b)) {
		ctls = append(ctls, strings.TrimPrefix(f, "+"))
	}
	return ctls
}

// takeBack stops the server's own group passing controllers down, then its
// home group passing those the server passed (passDown), so that the
// server may go back home: the kernel moves no process into a group that
// passes controllers down while a group in it holds one (cgroup v2's
// no-internal-process rule, EBUSY), and the server's own group holds it.
// Its own group first: a group cannot take back a controller that a group
// in it still passes down. Failures are logged: the server then stays in
// its group, and its groups until the next start's sweep.
func (g *CPUGroups) takeBack() {
	g.mu.Lock()
	passed := slices.Clone(g.passed)
	g.mu.Unlock()
	for _, d := range []struct {
		dir  string
		ctls []string
	}{{g.dir, subtreeControllers(g.dir)}, {g.home, passed}} {
		for _, ctl := range d.ctls {
			if err := os.WriteFile(filepath.Join(d.dir, "cgroup.subtree_control"), []byte("-"+ctl), 0o644); err != nil {
				g.log.Warn("the server's cgroups: cannot stop passing a controller down", "dir", d.dir, "controller", ctl, "error", err)
			}
		}
	}
}

// enableController passes controller ctl down from cgroup v2 group dir to
// the groups in it, or says why not (whyNotEnabled).
func enableController(dir, ctl string) error {
	err := os.WriteFile(filepath.Join(dir, "cgroup.subtree_control"), []byte("+"+ctl), 0o644)
	if err == nil {
		return nil
	}
	if why := whyNotEnabled(ctl, err); why != "" {
		return fmt.Errorf("enable the %s controller in %s: %w: %s", ctl, dir, err, why)
	}
	return fmt.Errorf("enable the %s controller in %s: %w", ctl, dir, err)
}

// whyNotEnabled is the cause of err, a failed write passing controller ctl
// down, that the kernel's errno names ("" where it names none): a hint
// that named processes in the group for every failure sent an operator
// whose parent group did not delegate the controller (ENOENT) looking for
// processes that were not there.
func whyNotEnabled(ctl string, err error) string {
	switch {
	case errors.Is(err, syscall.ENOENT):
		return "the group's parent does not pass the " + ctl + " controller down (it is not in the group's cgroup.controllers): delegate it to the server's group (systemd: Delegate=" + ctl + ")"
	case errors.Is(err, syscall.EBUSY):
		return "the group holds processes, which a group passing this controller down may not (cgroup v2): run the server in a group of its own"
	case errors.Is(err, syscall.EACCES), errors.Is(err, syscall.EPERM), errors.Is(err, syscall.EROFS):
		return "the server may not write the group (a read-only hierarchy, or another owner's)"
	case errors.Is(err, syscall.EOPNOTSUPP):
		return "the group is in a threaded subtree, where this controller cannot be passed down"
	}
	return ""
}
