package main_test

// A function that daemonizes (hostile.cu's daemonize: fork, leave the
// group, fork) leaves a process outside its worker's process group, which
// killing the group does not reach (in the worker's session: the worker's
// seccomp filter refuses setsid). Whatever the containment in force (a
// PID namespace per worker, or subreapers where there is none), the daemon
// must end when its worker does: at `plover rm`, at a crash of the worker,
// at the server's SIGTERM, and, for a server that was SIGKILLed, at the
// latest when the next server of the data directory starts.

import (
	"fmt"
	"net/http"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/plover-run/plover/internal/testkit"
)

// daemonGone bounds the wait for a daemon to be gone once it should be.
const daemonGone = 10 * time.Second

func TestDaemonEndsWithItsWorker(t *testing.T) {
	if testing.Short() {
		t.Skip("builds binaries and starts servers")
	}
	bin := buildPlover(t)
	lib := testkit.BuildLib(t, testkit.HostileSource(), t.TempDir(), "hostile.so", "-Wall", "-Wextra")
	for _, mode := range []struct {
		name, logs string // logs: what the server says when the mode is in force
		args       []string
	}{
		{"pid-namespaces", "a PID namespace per worker", nil},
		{"subreapers", "mechanism=subreaper", []string{"--pid-namespaces=false"}},
	} {
		t.Run(mode.name, func(t *testing.T) {
			args := append([]string{"--isolation", "process", "--standby-workers", "1"}, mode.args...)
			h := &isoHarness{mode: "process", bin: bin, hostile: lib, args: args, client: &http.Client{Timeout: 20 * time.Second}}
			h.srv = startIsoServer(t, bin, t.TempDir(), nil, args...)
			if !strings.Contains(h.srv.log.String(), mode.logs) {
				t.Skipf("not in force here (the server log does not say %q):\n%s", mode.logs, h.srv.log)
			}
			t.Run("rm", func(t *testing.T) {
				name := h.daemonize(t, "dz-rm")
				run(t, h.bin, []string{"PLOVER_SERVER=" + h.srv.url}, "rm", "dz-rm")
				waitDaemonGone(t, name, "plover rm")
			})
			t.Run("worker-crash", func(t *testing.T) {
				name := h.daemonize(t, "dz-crash")
				expectError(t, h.overrideChain(t, "dz-crash", []byte("x"), launch("segv", 1, 1)), 500, "worker_crashed", "dz-crash")
				waitDaemonGone(t, name, "its worker's crash")
			})
			t.Run("server-sigterm", func(t *testing.T) {
				name := h.daemonize(t, "dz-term")
				h.srv.signalAndWait(t, syscall.SIGTERM)
				waitDaemonGone(t, name, "the server's SIGTERM")
			})
			t.Run("server-sigkill-restart", func(t *testing.T) {
				h.srv = startIsoServer(t, bin, t.TempDir(), nil, args...)
				name := h.daemonize(t, "dz-kill")
				h.srv.signalAndWait(t, syscall.SIGKILL)
				if pids := daemonPIDs(name); len(pids) > 0 {
					// Subreapers: its worker died with the server and the
					// daemon went to the machine's init; the next server
					// must end it.
					t.Logf("daemon %v outlived the SIGKILLed server; restarting it on the same data directory", pids)
				} else {
					t.Logf("the daemon ended with the SIGKILLed server (its namespace's init did)")
				}
				h.srv = startIsoServer(t, bin, h.srv.data, nil, args...)
				waitDaemonGone(t, name, "the restart of the SIGKILLed server")
			})
		})
	}
}

// daemonize deploys fn (daemonize) and invokes it, and returns the name the
// daemon took, once it runs outside its worker's process group: what
// killing the group alone would miss.
func (h *isoHarness) daemonize(t *testing.T, fn string) string {
	t.Helper()
	h.mustDeploy(t, hostileManifest(fn, launch("daemonize", 1, 1)), h.hostile)
	name := "pld" + randHex(4)
	t.Cleanup(func() { // should the test fail, nothing is left running
		for _, pid := range daemonPIDs(name) {
			syscall.Kill(pid, syscall.SIGKILL)
		}
	})
	r := h.invoke(t, fn, []byte(name), crashTimeout)
	if r.code != 200 || cstr(r.body) != "daemonized" {
		t.Fatalf("daemonize: %d %.300s", r.code, r.body)
	}
	var pid int
	waitFor(t, daemonGone, "the daemon "+name+" to run", func() bool {
		pids := daemonPIDs(name)
		if len(pids) > 1 {
			t.Fatalf("%d processes named %s", len(pids), name)
		}
		if len(pids) == 1 {
			pid = pids[0]
		}
		return pid != 0
	})
	worker := h.functionView(t, fn).Workers
	if len(worker) != 1 {
		t.Fatalf("%s has workers %+v, want one", fn, worker)
	}
	pgid, sid, ok := groupOf(pid)
	wpgid, wsid, wok := groupOf(worker[0].PID)
	if !ok || !wok || pgid == wpgid {
		t.Fatalf("daemon %d: group %d session %d; its worker %d: group %d session %d: want a group of its own", pid, pgid, sid, worker[0].PID, wpgid, wsid)
	}
	t.Logf("daemon %s is pid %d (group %d, session %d); its worker %d (group %d, session %d)", name, pid, pgid, sid, worker[0].PID, wpgid, wsid)
	return name
}

// daemonPIDs lists the processes named name (/proc/PID/comm), zombies
// left out.
func daemonPIDs(name string) []int {
	ents, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		comm, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
		if err != nil || strings.TrimSpace(string(comm)) != name {
			continue
		}
		if st, _, ok := procStat(fmt.Sprintf("/proc/%d/stat", pid)); ok && st != 'Z' && st != 'X' {
			pids = append(pids, pid)
		}
	}
	return pids
}

func waitDaemonGone(t *testing.T, name, after string) {
	t.Helper()
	waitFor(t, daemonGone, "the daemon "+name+" to end after "+after, func() bool { return len(daemonPIDs(name)) == 0 })
}

// groupOf is the process group and session of pid (/proc/PID/stat).
func groupOf(pid int) (pgid, sid int, ok bool) {
	f := statFields(fmt.Sprintf("/proc/%d/stat", pid))
	if len(f) < 4 {
		return 0, 0, false
	}
	pgid, err1 := strconv.Atoi(f[2])
	sid, err2 := strconv.Atoi(f[3])
	return pgid, sid, err1 == nil && err2 == nil
}

// signalAndWait sends sig to the server and waits for its exit.
func (s *isoServer) signalAndWait(t *testing.T, sig syscall.Signal) {
	t.Helper()
	s.stopOnce.Do(func() {
		s.cmd.Process.Signal(sig)
		select {
		case <-s.exited:
		case <-time.After(20 * time.Second):
			s.cmd.Process.Kill()
			<-s.exited
			t.Errorf("server pid %d did not exit within 20s of %v", s.pid, sig)
		}
	})
}
