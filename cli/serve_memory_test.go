package cli

import (
	"bytes"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"runtime/debug"
	"strings"
	"testing"
)

// Over a fake cgroup tree: the server's Go memory limit is 90% of its
// group's memory limit (v2's memory.max, v1's memory.limit_in_bytes, a
// pod's above its container's), or its budgets where they need more; none
// where the group has no limit, where GOMEMLIMIT is the operator's, or
// where the budgets exceed the group's limit (a warning says so), and each
// set limit is logged with its figure.
func TestServerMemoryLimit(t *testing.T) {
	const gib = int64(1) << 30
	defer debug.SetMemoryLimit(debug.SetMemoryLimit(-1))
	for _, tc := range []struct {
		name          string
		self          string            // /proc/self/cgroup ("": none to read)
		files         map[string]string // under the cgroup root
		env           string            // GOMEMLIMIT
		body, pipe    int64             // --max-body-memory, --max-pipeline-memory (MiB)
		want          int64             // the limit set (MaxInt64: none)
		logs, notLogs string
	}{
		{"v2: 90% of the pod's limit", "0::/kubepods/pod1/ctr\n",
			map[string]string{"kubepods/pod1/memory.max": "4294967296\n", "kubepods/pod1/ctr/memory.max": "max\n"},
			"", 1024, 1024, 4 * gib / 10 * 9, "limit_mib=3686 cgroup_mib=4096 budgets_mib=2048", ""},
		{"v1: 90% of the group's, an unbounded budget counting nothing", "9:memory:/srv\n0::/\n",
			map[string]string{"memory/srv/memory.limit_in_bytes": "2147483648\n"},
			"", 1024, 0, 2 * gib / 10 * 9, "limit_mib=1843 cgroup_mib=2048 budgets_mib=1024", ""},
		{"the budgets where more than 90%", "0::/srv\n",
			map[string]string{"srv/memory.max": "2254857830\n"}, // 2.1 GiB
			"", 1024, 1024, 2 * gib, "limit_mib=2048", ""},
		{"budgets past the group's limit: a warning, no limit", "0::/srv\n",
			map[string]string{"srv/memory.max": "1073741824\n"},
			"", 1024, 1024, math.MaxInt64, `level=WARN msg="no Go memory limit set`, "limit_mib"},
		{"no limit on the group", "0::/srv\n", map[string]string{"srv/memory.max": "max\n"},
			"", 1024, 1024, math.MaxInt64, "", "memory limit"},
		{"GOMEMLIMIT is the operator's", "0::/srv\n", map[string]string{"srv/memory.max": "4294967296\n"},
			"3GiB", 1024, 1024, math.MaxInt64, "as GOMEMLIMIT says", "cgroup_mib"},
		{"no /proc/self/cgroup", "", nil, "", 1024, 1024, math.MaxInt64, "", "memory limit"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			debug.SetMemoryLimit(math.MaxInt64)
			t.Setenv("GOMEMLIMIT", tc.env)
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
			old := procSelfCgroup
			t.Cleanup(func() { procSelfCgroup = old })
			procSelfCgroup = filepath.Join(root, "no such file")
			if tc.self != "" {
				procSelfCgroup = filepath.Join(t.TempDir(), "cgroup")
				if err := os.WriteFile(procSelfCgroup, []byte(tc.self), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			var buf bytes.Buffer
			setMemoryLimit(&serveFlags{cgroupRoot: root, maxBodyMemMB: tc.body, maxPipeMemMB: tc.pipe}, slog.New(slog.NewTextHandler(&buf, nil)))
			if got := debug.SetMemoryLimit(-1); got != tc.want {
				t.Errorf("Go memory limit %d, want %d", got, tc.want)
			}
			log := buf.String()
			if !strings.Contains(log, tc.logs) || tc.notLogs != "" && strings.Contains(log, tc.notLogs) {
				t.Errorf("log %q: want %q in it, and not %q", log, tc.logs, tc.notLogs)
			}
		})
	}
}
