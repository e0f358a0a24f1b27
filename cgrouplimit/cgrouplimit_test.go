package cgrouplimit

import (
	"os"
	"path/filepath"
	"runtime"
	"testing"
)

// memory finds the least limit on the process's group's path, in
// either hierarchy, and takes "max" and v1's "no limit" for none.
func TestGroupMemory(t *testing.T) {
	for _, tc := range []struct {
		name, proc string
		files      map[string]string
		want       int64
	}{
		{"v2, the pod's limit above the container's group", "0::/kubepods/pod1/ctr\n",
			map[string]string{"kubepods/pod1/memory.max": "1073741824\n", "kubepods/pod1/ctr/memory.max": "max\n"}, 1 << 30},
		{"v2, the group's own the least", "0::/a/b\n",
			map[string]string{"a/memory.max": "4294967296", "a/b/memory.max": "536870912"}, 512 << 20},
		{"v2 in a namespace: the mount's root is the group", "0::/\n",
			map[string]string{"memory.max": "2147483648"}, 2 << 30},
		{"v2, no limit", "0::/a\n", map[string]string{"a/memory.max": "max"}, 0},
		{"v1", "12:cpu,cpuacct:/x\n9:memory:/kubepods/pod1\n1:name=systemd:/y\n",
			map[string]string{"memory/kubepods/pod1/memory.limit_in_bytes": "805306368", "memory/memory.limit_in_bytes": "9223372036854771712"}, 768 << 20},
		{"v1, no limit", "9:memory:/u\n", map[string]string{"memory/u/memory.limit_in_bytes": "9223372036854771712"}, 0},
		{"no memory hierarchy", "12:cpu:/x\n", nil, 0},
		{"unreadable text", "garbage", nil, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := writeTree(t, tc.files)
			if got := memory(tc.proc, root); got != tc.want {
				t.Errorf("memory = %d, want %d", got, tc.want)
			}
		})
	}
}

// cpus finds the least quota on the group's path, in either hierarchy,
// under the controller's own name or the joined names of its mount.
func TestCPUs(t *testing.T) {
	for _, tc := range []struct {
		name, proc string
		files      map[string]string
		want       float64
	}{
		{"v2, the pod's quota above the container's group", "0::/kubepods/pod1/ctr\n",
			map[string]string{"kubepods/pod1/cpu.max": "150000 100000\n", "kubepods/pod1/ctr/cpu.max": "max 100000\n"}, 1.5},
		{"v2, the group's own the least", "0::/a/b\n",
			map[string]string{"a/cpu.max": "400000 100000", "a/b/cpu.max": "50000 100000"}, 0.5},
		{"v2, no quota", "0::/a\n", map[string]string{"a/cpu.max": "max 100000"}, 0},
		{"v1 under cpu", "3:cpuset:/\n2:cpu,cpuacct:/kubepods/pod1\n",
			map[string]string{"cpu/kubepods/pod1/cpu.cfs_quota_us": "200000\n", "cpu/kubepods/pod1/cpu.cfs_period_us": "100000\n",
				"cpu/cpu.cfs_quota_us": "-1", "cpu/cpu.cfs_period_us": "100000"}, 2},
		{"v1 under the joined names", "2:cpu,cpuacct:/p\n",
			map[string]string{"cpu,cpuacct/p/cpu.cfs_quota_us": "300000", "cpu,cpuacct/p/cpu.cfs_period_us": "100000"}, 3},
		{"v1, no quota", "1:cpu:/u\n", map[string]string{"cpu/u/cpu.cfs_quota_us": "-1", "cpu/u/cpu.cfs_period_us": "100000"}, 0},
		{"v1 cpuacct alone is not cpu", "2:cpuacct:/p\n", map[string]string{"cpuacct/p/cpu.cfs_quota_us": "100000", "cpuacct/p/cpu.cfs_period_us": "100000"}, 0},
		{"a zero period", "0::/a\n", map[string]string{"a/cpu.max": "100000 0"}, 0},
		{"unreadable text", "garbage", nil, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := cpus(tc.proc, writeTree(t, tc.files)); got != tc.want {
				t.Errorf("cpus = %v, want %v", got, tc.want)
			}
		})
	}
}

// CPUs is at least one and at most the CPUs the process may run on.
func TestCPUsBounds(t *testing.T) {
	if n := CPUs(); n < 1 || n > runtime.NumCPU() {
		t.Errorf("CPUs() = %d, want 1..%d", n, runtime.NumCPU())
	}
}

// writeTree writes files (path: text) under a new directory, its root.
func writeTree(t *testing.T, files map[string]string) string {
	root := t.TempDir()
	for f, v := range files {
		p := filepath.Join(root, f)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(v), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root
}
