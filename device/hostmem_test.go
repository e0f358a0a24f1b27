package device

import (
	"os"
	"path/filepath"
	"testing"
)

// groupMemory finds the least limit on the process's group's path, in
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
			root := t.TempDir()
			for f, v := range tc.files {
				p := filepath.Join(root, f)
				if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(p, []byte(v), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			if got := groupMemory(tc.proc, root); got != tc.want {
				t.Errorf("groupMemory = %d, want %d", got, tc.want)
			}
		})
	}
}
