package main_test

// A worker must not reach another process without a signal either: the
// kernel lets a process change the resource limits and nice level of any
// process of its uid, and neither Landlock nor its signal scope sees those
// calls. Without a PID namespace (a server without CAP_SYS_ADMIN: the usual
// container) every worker sees every other, and workers share
// --worker-user: one function could set another's RLIMIT_CPU to 1 s, and
// the kernel then kills that worker by SIGXCPU. Nor may it leave objects
// another finds by key (System V IPC, POSIX queues, keyrings).

import (
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/plover-run/plover/internal/testkit"
	"github.com/plover-run/plover/worker/contain"
)

func TestWorkerCannotReachOtherProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("builds binaries and starts servers")
	}
	bin := buildPlover(t)
	lib := testkit.BuildLib(t, testkit.HostileSource(), t.TempDir(), "hostile.so", "-Wall", "-Wextra")
	for _, mode := range []struct {
		name string
		args []string
	}{
		{"pid-namespaces", nil},
		{"subreapers", []string{"--pid-namespaces=false"}},
	} {
		t.Run(mode.name, func(t *testing.T) {
			args := append([]string{"--isolation", "process", "--standby-workers", "1"}, mode.args...)
			h := &isoHarness{mode: "process", bin: bin, hostile: lib, args: args, client: &http.Client{Timeout: 20 * time.Second}}
			h.srv = startIsoServer(t, bin, t.TempDir(), nil, args...)
			h.mustDeploy(t, hostileManifest("victim", launch("whoami", 1, 1)), h.hostile)
			h.mustDeploy(t, hostileManifest("poker", launch("poke", 1, 1)), h.hostile)
			h.mustDeploy(t, hostileManifest("ipc", launch("ipc", 1, 1)), h.hostile)
			victim := strconv.Itoa(h.pidOf(t, "victim"))
			limits := func(pid string) string {
				b, err := os.ReadFile("/proc/" + pid + "/limits")
				if err != nil {
					t.Fatal(err)
				}
				return string(b)
			}
			before := limits(victim)
			for _, op := range []string{"cpu", "nice"} {
				for _, target := range []struct{ what, pid string }{
					{"the server", strconv.Itoa(h.srv.pid)},
					{"another function's worker", victim},
				} {
					r := h.invoke(t, "poker", []byte(op+" "+target.pid), crashTimeout)
					if r.code != 200 || !strings.HasPrefix(cstr(r.body), "ERR") {
						t.Errorf("%s on %s (pid %s): %d %q, want the kernel to refuse", op, target.what, target.pid, r.code, cstr(r.body))
					}
				}
			}
			// Its own autogroup's weight (which the server sets, where the
			// kernel schedules sessions as groups, to the worker's level)
			// the kernel lets any process raise to nice 0 that may write
			// the file: Landlock keeps /proc read-only to workers, whose
			// own files are root's besides. In a PID namespace the others'
			// are not there at all (ENOENT); a refusal is EACCES, not
			// EAGAIN (the kernel's limit on unprivileged writes).
			if contain.LandlockABI() >= 1 {
				for _, target := range []struct{ op, what, pid, want string }{
					{"autogroup", "the server", strconv.Itoa(h.srv.pid), "EACCES ENOENT"},
					{"autogroup", "another function's worker", victim, "EACCES ENOENT"},
					{"myautogroup", "itself", "2", "EACCES"},
				} {
					r := h.invoke(t, "poker", []byte(target.op+" "+target.pid), crashTimeout)
					errno, refused := strings.CutPrefix(cstr(r.body), "ERR ")
					if r.code != 200 || !refused || !slices.Contains(strings.Fields(target.want), errno) {
						t.Errorf("autogroup nice level of %s: %d %q, want it refused (%s)", target.what, r.code, cstr(r.body), target.want)
					}
				}
			}
			// Joining the other worker's process group, to renice the
			// group as one's own (setpriority PRIO_PGRP 0 passes the filter),
			// is refused: each worker has a session of its own.
			if r := h.invoke(t, "poker", []byte("pgrp "+victim), crashTimeout); r.code != 200 || !strings.HasPrefix(cstr(r.body), "ERR") {
				t.Errorf("pgrp on another function's worker (pid %s): %d %q, want the kernel to refuse", victim, r.code, cstr(r.body))
			}
			// Objects the kernel keeps for the node, not the process (System
			// V IPC, POSIX queues, the uid's keyrings), would outlive a
			// worker and let another tenant's find them by key: every call
			// that makes or finds one is ENOSYS, as on a kernel without them.
			if r := h.invoke(t, "ipc", nil, crashTimeout); r.code != 200 {
				t.Errorf("ipc: %d %q", r.code, r.body)
			} else {
				got := strings.Fields(cstr(r.body))
				if len(got) != 9 {
					t.Errorf("ipc: %q, want 9 calls' answers", cstr(r.body))
				}
				for _, call := range got {
					if name, errno, _ := strings.Cut(call, "="); errno != "ENOSYS" {
						t.Errorf("ipc: %s answered %s, want ENOSYS", name, errno)
					}
				}
			}
			if after := limits(victim); after != before {
				t.Errorf("the other function's worker's limits changed:\n%s\nwere:\n%s", after, before)
			}
			if pid := strconv.Itoa(h.pidOf(t, "victim")); pid != victim {
				t.Errorf("the other function's worker changed: %s, was %s", pid, victim)
			}
		})
	}
}
