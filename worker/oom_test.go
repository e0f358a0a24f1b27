package worker

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"testing"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/device"
	"github.com/plover-run/plover/worker/contain"
)

// Every process that runs bundle code is the OOM killer's first choice:
// the worker a function loads in, a child its bundle forks and a standby
// worker, on the host and the CUDA device alike; the server's own score
// (this test's) is left as it was. At the server's score, where the
// server and its workers share a memory limit (a pod's), a bundle that
// forked children each a little smaller than the server had the kernel
// kill the server.
func TestWorkersAreTheOOMKillersFirstChoice(t *testing.T) {
	server := oomScore(t, os.Getpid())
	if server == contain.OOMScoreAdj {
		t.Skipf("the test runs at oom_score_adj %d already: a worker's score would prove nothing", server)
	}
	for _, tc := range []struct {
		name string
		// load loads a function on a device that keeps a standby
		// worker, and names the processes that run its bundle's code.
		load func(t *testing.T) (*Device, map[string]int)
	}{
		{"host", hostBundleProcs},
		{"cuda", cudaBundleProcs},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d, procs := tc.load(t)
			procs["a standby worker"] = peekStandbyPID(t, d)
			for what, pid := range procs {
				if got := oomScore(t, pid); got != contain.OOMScoreAdj {
					t.Errorf("%s (pid %d) runs at oom_score_adj %d, want %d", what, pid, got, contain.OOMScoreAdj)
				}
			}
			if got := oomScore(t, os.Getpid()); got != server {
				t.Errorf("the server's oom_score_adj went from %d to %d", server, got)
			}
		})
	}
}

// hostBundleProcs loads the hostile bundle on the host device and has it
// fork a child that holds 1 MiB (fork_hog).
func hostBundleProcs(t *testing.T) (*Device, map[string]int) {
	d := newDevice(t, 1)
	p, m := loadHostile(t, d, "fork_hog")
	name := fmt.Sprintf("oom%d", os.Getpid())
	out := make([]byte, m.OutBytes)
	err := newInst(t, p, m).Run(&device.Run{Input: []byte(name), Output: out, TmpLen: m.TmpBytes,
		Chain: []device.Step{{Entry: 0, Grid: 1, Block: 1}}})
	if said := string(bytes.TrimRight(out, "\x00")); err != nil || said != "held" {
		t.Fatalf("fork_hog: %v, said %q; want its child holding its memory", err, said)
	}
	kids := procsNamed(name)
	if len(kids) != 1 {
		t.Fatalf("processes named %s: %v, want fork_hog's child alone", name, kids)
	}
	procs := map[string]int{"the worker": p.(*program).PID()}
	for pid := range kids {
		procs["the child its bundle forked"] = pid
	}
	return d, procs
}

// cudaBundleProcs loads the fake CUDA bundle in a worker on the fake
// driver.
func cudaBundleProcs(t *testing.T) (*Device, map[string]int) {
	d, dir := fakeCUDA(t)
	p, err := d.Load(context.Background(), device.ProgramSpec{Dir: dir,
		Manifest: fakeManifest(abi.Launch{Kernel: "pl_load", Grid: 1, Block: 64})})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return d, map[string]int{"the CUDA worker": p.(*program).PID()}
}

// peekStandbyPID is the pid of a ready standby worker of d's, once it has
// one.
func peekStandbyPID(t *testing.T, d *Device) int {
	t.Helper()
	var q *proc
	waitFor(t, "a standby worker", func() bool { q = peekStandby(d); return q != nil })
	return q.pid
}

// peekStandby is a ready standby worker of d's, left in the pool; nil when
// it has none, or the pool refilled while the one taken was looked at
// (that one is then ended).
func peekStandby(d *Device) *proc {
	select {
	case q := <-d.standby:
		select {
		case d.standby <- q:
			return q
		default:
			q.kill("test: the pool refilled while this one was looked at")
			return nil
		}
	default:
		return nil
	}
}

func oomScore(t *testing.T, pid int) int {
	t.Helper()
	v, err := contain.OOMScore(pid)
	if err != nil {
		t.Fatalf("pid %d: %v", pid, err)
	}
	return v
}
