// Package cgrouplimit reads what this process's cgroup lets it use: its
// memory and its CPUs. A pod's limits are its cgroup's, where the node's
// RAM and CPU count (sysinfo, runtime.NumCPU) are the node's: a server
// that sized itself by the node met the pod's memory limit through the
// OOM killer, and ran twice the node's CPUs of runs on a pod's one.
package cgrouplimit

import (
	"math"
	"os"
	"path"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
)

// root is where the cgroup hierarchies are mounted.
const root = "/sys/fs/cgroup"

// Memory is the memory this process's cgroup may use, 0 when no limit is
// set or none can be read.
func Memory() int64 {
	b, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return 0
	}
	return memory(string(b), root)
}

// CPUs is how many CPUs this process may keep busy: the node's (those
// its affinity allows), or fewer where its cgroup's CPU quota says so
// (rounded up: a quota of 1.5 CPUs keeps two CPUs partly busy). Read
// once: a pod's limit is fixed for its life.
var CPUs = sync.OnceValue(func() int {
	n := runtime.NumCPU()
	if b, err := os.ReadFile("/proc/self/cgroup"); err == nil {
		if q := cpus(string(b), root); q > 0 && int(math.Ceil(q)) < n {
			n = int(math.Ceil(q))
		}
	}
	return max(n, 1)
})

// memory is the least memory limit on the process's group's path from
// the hierarchy's root (v2's memory.max, v1's memory.limit_in_bytes of
// the memory controller), 0 when none is set or the files cannot be
// read. procCgroup is /proc/self/cgroup's text, root where the
// hierarchies are mounted.
func memory(procCgroup, root string) int64 {
	var least int64
	eachGroup(procCgroup, root, "memory", func(dir string, v2 bool) {
		file := "memory.limit_in_bytes"
		if v2 {
			file = "memory.max"
		}
		if v := readInt(filepath.Join(dir, file)); v > 0 && v < 1<<62 && (least == 0 || v < least) {
			least = v
		}
	})
	return least
}

// cpus is the least CPU quota on the process's group's path, in CPUs
// (v2's cpu.max "quota period", v1's cpu.cfs_quota_us over
// cpu.cfs_period_us of the cpu controller), 0 when none is set.
func cpus(procCgroup, root string) float64 {
	var least float64
	eachGroup(procCgroup, root, "cpu", func(dir string, v2 bool) {
		var quota, period int64
		if v2 {
			b, err := os.ReadFile(filepath.Join(dir, "cpu.max"))
			if err != nil {
				return
			}
			f := strings.Fields(string(b))
			if len(f) != 2 { // "max 100000" parses as no quota below
				return
			}
			quota, _ = strconv.ParseInt(f[0], 10, 64)
			period, _ = strconv.ParseInt(f[1], 10, 64)
		} else {
			quota = readInt(filepath.Join(dir, "cpu.cfs_quota_us")) // -1: none
			period = readInt(filepath.Join(dir, "cpu.cfs_period_us"))
		}
		if quota <= 0 || period <= 0 {
			return
		}
		if c := float64(quota) / float64(period); least == 0 || c < least {
			least = c
		}
	})
	return least
}

// eachGroup calls f with the directory of the process's group of
// controller and of each group above it (a pod's limit is set on the
// pod's group, its containers' below it), in v2 (one hierarchy) or in
// v1 (the controller's own).
func eachGroup(procCgroup, root, controller string, f func(dir string, v2 bool)) {
	for _, line := range strings.Split(strings.TrimSpace(procCgroup), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 || !strings.HasPrefix(parts[2], "/") {
			continue
		}
		base, v2 := root, false
		switch {
		case parts[0] == "0" && parts[1] == "":
			v2 = true
		case slices.Contains(strings.Split(parts[1], ","), controller):
			// Mounted under the controller's name, or under the joined
			// names (cpu,cpuacct) where no link of the one name is made.
			base = filepath.Join(root, controller)
			if _, err := os.Stat(base); err != nil {
				base = filepath.Join(root, parts[1])
			}
		default:
			continue
		}
		for p := path.Clean(parts[2]); ; p = path.Dir(p) {
			f(filepath.Join(base, p), v2)
			if p == "/" {
				break
			}
		}
	}
}

// readInt reads a file holding one integer; 0 for "max", an unreadable
// file or text that is not one.
func readInt(file string) int64 {
	b, err := os.ReadFile(file)
	if err != nil {
		return 0
	}
	v, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		return 0
	}
	return v
}
