package worker

import (
	"bytes"
	"fmt"
	"os"
	"runtime"
	"testing"

	"golang.org/x/sys/unix"
)

// A worker cannot change how the server's threads are scheduled where
// they share a uid and the server holds no capability the worker does not
// (a pod's server, not root): into SCHED_IDLE, to nice 19 by
// sched_setattr, onto one CPU, into the idle I/O class. The calls act on
// one thread, named by its id (/proc/<server>/task lists them), so the
// server's pid alone is not what must be refused. Each change outlived
// the worker, and a server so treated starved beside any busy worker (a
// review's probe). Before, the calls succeeded. The server here is this
// test's process, root with every capability, which the kernel already
// guards (its cap_safe_nice); a thread of it without any stands in for a
// pod's server.
func TestAWorkerCannotRescheduleTheServer(t *testing.T) {
	tid := caplessThread(t)
	d := newDevice(t, 0)
	p, m := loadHostile(t, d, "poke")
	in := newInst(t, p, m)
	before := schedOf(t, tid)
	for _, op := range []string{"sched", "schedattr", "cpus", "ioprio"} {
		r := oneStep(t, p, m, "poke")
		r.Input = fmt.Appendf(nil, "%s %d", op, tid)
		if err := in.Run(r); err != nil {
			t.Fatal(err)
		}
		said := string(bytes.TrimRight(r.Output, "\x00"))
		if after := schedOf(t, tid); after != before {
			before.put(t, tid)
			t.Errorf("%s on a thread of the server's (%d) changed it: %+v, was %+v", op, tid, after, before)
		}
		if d.filterLogged.Load() {
			t.Skip("this kernel has no seccomp filters")
		}
		if said != "ERR EPERM" {
			t.Errorf("%s on a thread of the server's (%d): %q, want ERR EPERM", op, tid, said)
		}
	}
}

// caplessThread starts a thread of this process that holds no
// capability, as a server not running as root holds none, and returns its
// id; the thread ends with the test.
func caplessThread(t *testing.T) int {
	t.Helper()
	for range 2 {
		tid := make(chan int)
		go func() {
			runtime.LockOSThread()
			me := unix.Gettid()
			if me == os.Getpid() {
				// The main thread, which never ends: held until the
				// test ends, so that the next try lands on another.
				tid <- 0
				<-t.Context().Done()
				runtime.UnlockOSThread()
				return
			}
			// Capabilities are a thread's own: this drops only its.
			// Locked and never unlocked, the thread ends with the
			// goroutine, and no other goroutine runs on it.
			hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
			var none [2]unix.CapUserData
			if err := unix.Capset(&hdr, &none[0]); err != nil {
				t.Errorf("capset: %v", err)
				me = -1
			}
			tid <- me
			<-t.Context().Done()
		}()
		switch id := <-tid; {
		case id < 0:
			t.FailNow()
		case id > 0:
			return id
		}
	}
	t.Fatal("no thread but the main one")
	return 0
}

// threadSched is what poke's scheduler calls change in a thread.
type threadSched struct {
	policy uint32
	nice   int32
	cpus   unix.CPUSet
	ioprio uintptr
}

func schedOf(t *testing.T, tid int) threadSched {
	t.Helper()
	attr, err := unix.SchedGetAttr(tid, 0)
	if err != nil {
		t.Fatalf("sched_getattr(%d): %v", tid, err)
	}
	s := threadSched{policy: attr.Policy, nice: attr.Nice}
	if err := unix.SchedGetaffinity(tid, &s.cpus); err != nil {
		t.Fatalf("sched_getaffinity(%d): %v", tid, err)
	}
	io, _, e := unix.Syscall(unix.SYS_IOPRIO_GET, 1 /* IOPRIO_WHO_PROCESS */, uintptr(tid), 0)
	if e != 0 {
		t.Fatalf("ioprio_get(%d): %v", tid, e)
	}
	s.ioprio = io
	return s
}

// put gives thread tid back what s holds (this test's process runs as
// root: a thread in SCHED_IDLE may leave it).
func (s threadSched) put(t *testing.T, tid int) {
	t.Helper()
	if err := unix.SchedSetAttr(tid, &unix.SchedAttr{Policy: s.policy, Nice: s.nice}, 0); err != nil {
		t.Errorf("sched_setattr(%d): %v", tid, err)
	}
	if err := unix.SchedSetaffinity(tid, &s.cpus); err != nil {
		t.Errorf("sched_setaffinity(%d): %v", tid, err)
	}
	if _, _, e := unix.Syscall(unix.SYS_IOPRIO_SET, 1, uintptr(tid), s.ioprio); e != 0 {
		t.Errorf("ioprio_set(%d): %v", tid, e)
	}
}
