package device

import (
	"bytes"
	"testing"

	"github.com/plover-run/plover/abi"
)

// An instance's stream takes its function's priority class: latency the
// context's greatest priority, batch its least, default midway, so that
// where functions share a context (a tenant's worker) the GPU prefers a
// latency function's waiting kernels. A run on a prioritised stream,
// direct, captured and replayed, computes what any other does (a graph
// runs at the priority of the stream it is launched into; the fake driver
// models no priority inside a graph, so there this checks only that such a
// stream captures and replays).
func testStreamPriorities(t *testing.T, e *bundleEnv) {
	g := e.gpu(t)
	t.Logf("stream priorities %d (least) to %d (greatest)", g.prioLeast, g.prioGreatest)
	if g.prioGreatest > g.prioLeast {
		t.Fatalf("the range %d to %d: the greatest priority is the smaller number", g.prioLeast, g.prioGreatest)
	}
	if e.fake && (g.prioLeast != 0 || g.prioGreatest != -5) {
		t.Fatalf("the fake driver's range read as %d to %d, want 0 to -5", g.prioLeast, g.prioGreatest)
	}
	got := map[string]int{}
	for _, class := range []string{abi.PriorityLatency, "", abi.PriorityDefault, abi.PriorityBatch} {
		inst := newInst(t, g, e, InstanceConfig{MaxInput: 256, Tmp: 256, Out: 256, Priority: class})
		p, err := inst.streamPriority()
		if err != nil {
			t.Fatal(err)
		}
		if want := g.streamPriority(class); p != want {
			t.Errorf("class %q: the stream's priority %d, want %d", class, p, want)
		}
		got[class] = p
		chain := []Step{e.step(t, "pl_load", 1, 256), e.step(t, "pl_inc", 1, 256), e.step(t, "pl_store", 1, 256)}
		for range 3 { // direct, captured, replayed
			in := []byte("prioritised")
			out := make([]byte, 256)
			mustRun(t, inst, &Run{Input: in, Output: out, Chain: chain, TmpLen: 256, ChainKey: 1})
			if want := chainOut(in, nil, 256, 256, false); !bytes.Equal(out, want) {
				t.Errorf("class %q: %s", class, firstDiff(out, want))
			}
		}
		if s := inst.stats.load(); s.Direct != 1 || s.Captured != 1 || s.Replayed != 1 {
			t.Errorf("class %q: runs %+v, want one direct, one captured, one replayed", class, s)
		}
	}
	if got[""] != got[abi.PriorityDefault] || !(got[abi.PriorityLatency] <= got[""] && got[""] <= got[abi.PriorityBatch]) {
		t.Errorf("priorities by class %v: want latency ≤ default (\"\" alike) ≤ batch", got)
	}
	if e.fake && (got[abi.PriorityLatency] != -5 || got[""] != -2 || got[abi.PriorityBatch] != 0) {
		t.Errorf("on the fake driver's 0 to -5: %v, want latency -5, default -2, batch 0", got)
	}
}

// A program hands its manifest's class to each instance it makes: the
// worker makes instances through its program, not the device.
func TestProgramGivesItsInstancesItsPriority(t *testing.T) {
	var seen InstanceConfig
	dev := &seeingDevice{seen: &seen}
	p := &program{dev: dev, ents: &Entries{}, priority: abi.PriorityLatency}
	if _, err := p.NewInstance(InstanceConfig{MaxInput: 1, Out: 1}); err != nil {
		t.Fatal(err)
	}
	if seen.Priority != abi.PriorityLatency || seen.Entries != p.ents {
		t.Errorf("the device was asked for %+v; want the program's class %q and entries", seen, abi.PriorityLatency)
	}
}

// seeingDevice keeps the last InstanceConfig it was asked for.
type seeingDevice struct {
	rawDevice
	seen *InstanceConfig
}

func (d *seeingDevice) NewInstance(cfg InstanceConfig) (Instance, error) {
	*d.seen = cfg
	return nil, nil
}
