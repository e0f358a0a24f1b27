package main

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// A pod, as the fair-nice modes stand in for one: the server in a CPU
// cgroup of its own that it is not given (--cgroup-root at an empty
// directory), so that it weighs its workers by nice level, as in a
// Kubernetes pod's container. Not in the machine's root CPU cgroup, where
// the suite itself may run: there the kernel schedules each session as a
// group (autogroups, where on: /proc/sys/kernel/sched_autogroup_enabled),
// which a pod's processes never are, and the server's threads, whatever
// their nice levels, weigh as its session's whole group against each
// worker's (a worker leads a session of its own), so that its I/O on a
// flood's bytes, at the flood's level among its own threads, weighs as the
// server against a light worker. fair-nice-root keeps that placement (the
// server in this program's cgroup, as every mode before 2026-12-02), for
// comparison.
type pod struct {
	// procs is the group's cgroup.procs ("" where none could be made:
	// why says why).
	procs, why string
}

// cgroupV1CPU is where the suite makes its pod: the v1 cpu hierarchy.
// Under cgroup v2 a group of one's own needs the cpu controller passed
// down to it from the group this program runs in, which must then hold
// no process: the pod is not made there (the fair-nice modes say so).
var cgroupV1CPU = "/sys/fs/cgroup/cpu"

// makePod makes the pod's group under this program's own, at the default
// weight (1024), or says why it could not.
func makePod() pod {
	own, err := ownV1CPUGroup()
	if err != nil {
		return pod{why: err.Error()}
	}
	dir := filepath.Join(cgroupV1CPU, own, fmt.Sprintf("plover-bench-pod-%d", os.Getpid()))
	if err := os.Mkdir(dir, 0o755); err != nil && !os.IsExist(err) {
		return pod{why: fmt.Sprintf("cannot make a CPU cgroup: %v", err)}
	}
	return pod{procs: filepath.Join(dir, "cgroup.procs")}
}

// ownV1CPUGroup is this program's group in the v1 cpu hierarchy.
func ownV1CPUGroup() (string, error) {
	if _, err := os.Stat(filepath.Join(cgroupV1CPU, "cpu.shares")); err != nil {
		return "", fmt.Errorf("no cgroup v1 cpu hierarchy at %s", cgroupV1CPU)
	}
	f, err := os.Open("/proc/self/cgroup")
	if err != nil {
		return "", err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		p := strings.SplitN(sc.Text(), ":", 3)
		if len(p) == 3 && p[0] != "0" {
			for _, c := range strings.Split(p[1], ",") {
				if c == "cpu" {
					return p[2], nil
				}
			}
		}
	}
	return "", fmt.Errorf("/proc/self/cgroup names no v1 cpu group")
}

// wrap is the command that starts argv inside the pod: a shell that moves
// itself into the group and then becomes the server, so that the server
// and every worker it starts are in it from their first instruction.
func (p pod) wrap(argv []string) []string {
	if p.procs == "" {
		return argv
	}
	return append([]string{"/bin/sh", "-c", `echo $$ > "$0" && exec "$@"`, p.procs}, argv...)
}

// remove removes the group (empty once its servers are gone), or says
// it could not: a group left behind holds no process, and weighs nothing.
func (p pod) remove() {
	if p.procs == "" {
		return
	}
	if err := os.Remove(filepath.Dir(p.procs)); err != nil && !os.IsNotExist(err) {
		logf("the pod's CPU cgroup was not removed: %v", err)
	}
}

// inPod reports whether a mode's server runs in the pod: the nice-level
// modes but fair-nice-root.
func inPod(mode string) bool {
	return strings.HasPrefix(mode, "fair-nice") && !strings.HasPrefix(mode, "fair-nice-root")
}

// podFor is the pod a mode's server runs in: o's for inPod modes, else
// none (where this program runs).
func (o *options) podFor(mode string) pod {
	if inPod(mode) {
		return o.pod
	}
	return pod{}
}
