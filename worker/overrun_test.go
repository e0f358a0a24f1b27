package worker

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/device"
	"github.com/plover-run/plover/internal/testkit"
)

// overrunLog is "the function's bundle runs in a worker of its own" as
// overran logs it.
const overrunLog = "runs in a worker of its own, not its tenant's: its request's deadline"

// overrunDevice is tenantDevice logging to the buffer it returns.
func overrunDevice(t *testing.T) (*Device, *testkit.LogBuffer) {
	t.Helper()
	logged := &testkit.LogBuffer{}
	return loggedTenantDevice(t, slog.NewTextHandler(logged, nil)), logged
}

// A chain that runs past its request's deadline (a deadline its client
// chose) in its tenant's worker has the worker killed, its sibling with
// it, once: the function's bundle then loads in a worker of its own, and
// its next overrun ends only that worker, the sibling's serving on. Before,
// every overrun ended the shared worker again (any success in between
// cleared the function's back-off), a client's 1 ms deadline at will.
func TestTenantOverrunOnceRunsAlone(t *testing.T) {
	d, logged := overrunDevice(t)
	ms := testkit.Slow("slow", 1)
	mi := testkit.Manifest("idle")
	slowDir, idleDir := bundleFor(t, "", ms), bundleFor(t, "", mi)
	overrun := func(p device.Program) {
		t.Helper()
		sleep, err := p.Entry("sleep_ms")
		if err != nil {
			t.Fatal(err)
		}
		in := newInst(t, p, ms)
		err = in.Run(&device.Run{Output: make([]byte, 8), Chain: []device.Step{{Entry: sleep, Grid: 5000, Block: 1}}, Deadline: time.Now().Add(50 * time.Millisecond)})
		if !errors.Is(err, device.ErrDeadline) {
			t.Fatalf("a 5 s chain with a 50 ms deadline: %v", err)
		}
		awaitClosed(t, p.(*program).Exited(), "the kill of the overrunning function's worker")
	}

	slow, idle := loadDir(t, d, "t", slowDir, ms, nil), loadDir(t, d, "t", idleDir, mi, nil)
	if slow.(*program).p != idle.(*program).p {
		t.Fatal("two functions of one tenant in two workers before any overrun")
	}
	overrun(slow)
	awaitClosed(t, idle.(*program).Exited(), "the sibling's loss with the shared worker")

	// Loaded again, as the engine does after the losses.
	slow, idle = loadDir(t, d, "t", slowDir, ms, nil), loadDir(t, d, "t", idleDir, mi, nil)
	sib := idle.(*program)
	if slow.(*program).p == sib.p {
		t.Errorf("the function whose overrun ended its tenant's worker loaded into the tenant's next one (pid %d)", sib.PID())
	}
	pid := sib.PID()
	overrun(slow)
	time.Sleep(50 * time.Millisecond) // the sibling's worker, were it killed, would be reaped by now
	if !sib.Alive() || sib.PID() != pid {
		t.Fatalf("the second overrun ended the sibling's worker (%v)", sib.Death())
	}
	echoes(t, sib, mi)
	if n := strings.Count(logged.String(), overrunLog); n != 1 {
		t.Errorf("the move to a worker of its own logged %d times, want once:\n%s", n, logged.String())
	}
}

// An instance's creation that runs past its request's deadline and grace
// (plover_instance_init, 3 s) has its tenant's worker killed, as a chain's
// overrun does, and moves its function to a worker of its own likewise.
func TestTenantInstanceOverrunRunsAlone(t *testing.T) {
	d, logged := overrunDevice(t)
	ms := testkit.Manifest("sibling")
	sibDir := bundleFor(t, "", ms)
	sib := loadDir(t, d, "t", sibDir, ms, nil).(*program)
	mh := testkit.Manifest("hooks")
	mh.Library, mh.Chain = "hooks.so", []abi.Launch{{Kernel: "report", Grid: 1, Block: 1}}
	dir := t.TempDir()
	testkit.BuildLib(t, testkit.HooksSource(), dir, mh.Library, "-DSLOW_INIT_MS=3000")
	testkit.WriteManifest(t, dir, mh)
	spec := device.ProgramSpec{Dir: dir, Manifest: mh, Tenant: "t"}
	hooks, err := d.Load(context.Background(), spec)
	if err != nil {
		t.Fatal(err)
	}
	defer hooks.Close()
	if hooks.(*program).p != sib.p {
		t.Fatal("two functions of one tenant in two workers before any overrun")
	}
	in, err := hooks.NewInstance(device.InstanceConfig{MaxInput: mh.MaxInputBytes, Tmp: mh.TmpBytes, Out: mh.OutBytes, Deadline: time.Now().Add(100 * time.Millisecond)})
	if err == nil {
		in.Close()
		t.Fatal("an instance of 3 s made within its 100 ms deadline and grace")
	}
	if !errors.Is(err, device.ErrDeadline) || errors.Is(err, device.ErrNotStarted) {
		t.Fatalf("instance creation: %v, want the deadline passed while it ran", err)
	}
	awaitClosed(t, sib.Exited(), "the sibling's loss with the shared worker")

	sib = loadDir(t, d, "t", sibDir, ms, nil).(*program)
	again, err := d.Load(context.Background(), spec)
	if err != nil {
		t.Fatal(err)
	}
	defer again.Close()
	if again.(*program).p == sib.p {
		t.Fatalf("the function whose instance's creation ended its tenant's worker loaded into the tenant's next one (pid %d)", sib.PID())
	}
	if !strings.Contains(logged.String(), overrunLog) || !strings.Contains(logged.String(), "an instance of it was being created") {
		t.Errorf("the move to a worker of its own was not logged with its reason:\n%s", logged.String())
	}
}

// SameProcess compares worker processes, not pids: a program of a dead
// worker whose pid a new worker has is not of the new one's process (the
// engine would take a slot that the dead one mapped and could have
// rewritten for one of the running worker's own).
func TestSameProcessIsNotSamePID(t *testing.T) {
	running, dead := &proc{pid: 4242}, &proc{pid: 4242}
	a, b := &program{p: running}, &program{p: running}
	stale := &program{p: dead}
	switch {
	case !a.SameProcess(b):
		t.Error("two programs of one process: not the same process")
	case a.SameProcess(stale) || stale.SameProcess(a):
		t.Error("a program of a dead worker with the running one's pid: taken for the running process")
	case a.SameProcess(device.Program(nil)):
		t.Error("no program: taken for the running process")
	}
}
