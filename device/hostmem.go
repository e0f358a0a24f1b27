package device

import (
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// groupMemory is the memory this process's cgroup may use: the least
// memory limit on its path from the hierarchy's root (v2's memory.max,
// v1's memory.limit_in_bytes of the memory controller), 0 when none is
// set or the files cannot be read. procCgroup is /proc/self/cgroup's
// text, root where the hierarchies are mounted. A pod's memory limit is
// its cgroup's: the host device's budget went by the node's RAM, and the
// kernel's OOM killer, not eviction, met the pod's limit.
func groupMemory(procCgroup, root string) int64 {
	var least int64
	for _, line := range strings.Split(strings.TrimSpace(procCgroup), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 || !strings.HasPrefix(parts[2], "/") {
			continue
		}
		dir, file := root, "memory.max"
		switch {
		case parts[0] == "0" && parts[1] == "": // v2
		case slices.Contains(strings.Split(parts[1], ","), "memory"): // v1
			dir, file = filepath.Join(root, "memory"), "memory.limit_in_bytes"
		default:
			continue
		}
		// The group and each above it: a pod's limit is set on the pod's
		// group, its containers' below it.
		for p := path.Clean(parts[2]); ; p = path.Dir(p) {
			if v := readLimit(filepath.Join(dir, p, file)); v > 0 && (least == 0 || v < least) {
				least = v
			}
			if p == "/" {
				break
			}
		}
	}
	return least
}

// readLimit reads a memory limit file: 0 for "max", an unreadable file or
// v1's "no limit" (a number near the largest int64, past any machine).
func readLimit(file string) int64 {
	b, err := os.ReadFile(file)
	if err != nil {
		return 0
	}
	v, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	if err != nil || v <= 0 || v >= 1<<62 {
		return 0
	}
	return v
}
