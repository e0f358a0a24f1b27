package worker

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/plover-run/plover/abi"
)

// Weights turned off by a failed write are off as from the start, where
// every worker weighs as the server: workers placed from then on stay in
// the server's group (no group of their own), and those weighed before
// get the server's weight, boost ended, rather than keep their functions'
// weights for good beside new workers at the server's (a 256th of their
// CPU under cgroup v1). Later writes leave it there; the log names why,
// and each worker. Against a fake v1 hierarchy (plain files).
func TestWeightsOffAfterAFailureAsFromTheStart(t *testing.T) {
	root := fakeCgroups(t, "1:cpu:/\n")
	os.MkdirAll(filepath.Join(root, "cpu"), 0o755)
	os.WriteFile(filepath.Join(root, "cpu", "cpu.shares"), []byte("1024"), 0o644)
	log, said := logTo()
	g := NewCPUGroupsAt(root, log)
	if g == nil || g.Mechanism() != "cgroup v1" {
		t.Fatalf("no v1 groups on a writable fake hierarchy: %v", g.Mechanism())
	}
	g.boost = LightBoost // no loop: boosts are set by hand
	defer g.Close()
	shares := func(c *Group) string { return readString(filepath.Join(c.dir, "cpu.shares")) }
	failing, other := g.Place(1001, 0), g.Place(1002, 0)
	failing.Weigh(&abi.Manifest{Name: "f"})
	other.Weigh(&abi.Manifest{Name: "g", Priority: "latency"})
	other.setBoost(true)
	if got := shares(other); got != "65536" {
		t.Fatalf("a boosted latency function's cpu.shares %s, want 65536", got)
	}
	// The failing worker's weight can no longer be written (a directory
	// where the file was: root passes any file mode).
	os.Remove(filepath.Join(failing.dir, "cpu.shares"))
	os.Mkdir(filepath.Join(failing.dir, "cpu.shares"), 0o755)
	failing.Weigh(&abi.Manifest{Name: "f", Share: 2})
	if m := g.Mechanism(); m != "off" {
		t.Fatalf("mechanism %q after a failed write, want off", m)
	}
	if got := shares(other); got != "262144" || other.boosted {
		t.Fatalf("a worker weighed before the weights went off: cpu.shares %s, boosted %v; want the server's 262144, unboosted", got, other.boosted)
	}
	other.Weigh(&abi.Manifest{Name: "h", Share: 3})
	other.setBoost(true)
	other.Dying()
	if got := shares(other); got != "262144" {
		t.Fatalf("writes after the weights went off left cpu.shares %s, want the server's 262144", got)
	}
	if c := g.Place(1003, 1); c != nil {
		t.Fatalf("a worker placed once the weights were off got a group, %s", c.dir)
	}
	if _, err := os.Stat(filepath.Join(g.dir, "1003")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a group made for a worker placed once the weights were off: %v", err)
	}
	if said("worker CPU weights off: cannot set a worker's CPU weight") != 1 || said("function=f pid=1001 error=\"weigh worker 1001:") != 1 ||
		said("worker CPU weight set to the server's, the weights being off\" function=g pid=1002 why=\"weigh worker 1001:") != 1 {
		t.Error("the log does not say once that the weights are off for worker 1001's failed write, nor that worker 1002 of function g got the server's weight for it")
	}
}

// With nice levels, a worker weighed before the weights went off (here
// boosted, its child with it) goes to the server's level, as a worker
// placed from then on stays; later writes leave it there.
func TestWeightsOffAfterAFailureByNiceLevel(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("lowering a nice level takes CAP_SYS_NICE")
	}
	log, said := logTo()
	g := &CPUGroups{nice: true, lower: true, log: log, boost: LightBoost}
	w := exec.Command("sh", "-c", "sleep 60 & wait")
	startInGroup(t, w)
	child := firstChild(t, w.Process.Pid, "the worker's child")
	c := g.Place(w.Process.Pid, 0)
	c.Weigh(&abi.Manifest{Name: "f"})
	c.setBoost(true)
	if n, k := niceOf(t, w.Process.Pid), niceOf(t, child); n != 1 || k != 1 {
		t.Fatalf("a boosted default function's worker at nice %d, its child at %d; want 1", n, k)
	}
	g.fail(nil, errors.New("another worker's level could not be set (test)"), "test")
	if n, k := niceOf(t, w.Process.Pid), niceOf(t, child); n != 0 || k != 0 || c.boosted {
		t.Fatalf("once the weights went off, the worker at nice %d, its child at %d, boosted %v; want the server's 0, unboosted", n, k, c.boosted)
	}
	c.Weigh(&abi.Manifest{Name: "f", Priority: "batch"})
	if n, k := niceOf(t, w.Process.Pid), niceOf(t, child); n != 0 || k != 0 {
		t.Fatalf("a worker weighed at batch after the weights went off: nice %d, its child %d; want the server's 0", n, k)
	}
	if g.Place(w.Process.Pid, 1) != nil || niceOf(t, w.Process.Pid) != 0 {
		t.Fatal("a worker placed once the weights were off was given a level")
	}
	if said(fmt.Sprintf("worker nice level set to the server's, the weights being off\" function=f pid=%d nice=0 why=\"another worker's level could not be set (test)\"", w.Process.Pid)) != 1 {
		t.Error("the log does not name the worker, its function and why it went to the server's level")
	}
}
