package worker

import (
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/plover-run/plover/device"
	"github.com/plover-run/plover/worker/wire"
)

// A run reply's timing is the worker's word, and bundle code can write the
// reply: whatever figures it carries, what answer leaves in the run is
// within bounds (each time in [0, the run's wall time], the bytes copied
// on the host in [0, its slot's size]), with the server's own copy-in
// added, and figures within them pass unchanged. A reply that is not a
// success (the chain's failure) is bounded too: its timing is reported.
func TestReplyTimingIsBounded(t *testing.T) {
	const maxIn, out = 64, 64
	mem := make([]byte, device.SlotSize(maxIn, out))
	slot := int64(len(mem))
	const wall = 3 * time.Millisecond
	const copiedIn, copyIn = 5, 7 * time.Microsecond // the server's own copy-in
	edges := []int64{math.MinInt64, -1, 0, 1, int64(wall) - 1, int64(wall), int64(wall) + 1, slot, slot + 1, math.MaxInt64}
	rng := rand.New(rand.NewPCG(1, 2))
	pick := func() int64 {
		if rng.IntN(3) == 0 {
			return int64(rng.Uint64()) // any bits at all
		}
		return edges[rng.IntN(len(edges))]
	}
	in := func(v, lo, hi int64) bool { return v >= lo && v <= hi }
	i := &instance{maxIn: maxIn, out: out}
	for n := range 2000 {
		sent := device.Timing{CopyIn: time.Duration(pick()), Kernels: time.Duration(pick()), CopyOut: time.Duration(pick()), Copied: pick()}
		st := wire.StOK
		if n%4 == 3 {
			st = wire.StKernel
		}
		i.seq++
		rep := wire.EncodeReply(make([]byte, 0, wire.ReplyMax), st, &device.Run{Timing: sent}, i.seq, 0, 0, "")
		r := &device.Run{Output: make([]byte, out)}
		err := i.answer(r, rep, mem, copiedIn, copyIn, wall)
		if (err == nil) != (st == wire.StOK) {
			t.Fatalf("reply %+v, status %d: %v", sent, st, err)
		}
		got := r.Timing
		if !in(int64(got.CopyIn), int64(copyIn), int64(wall+copyIn)) || !in(int64(got.Kernels), 0, int64(wall)) ||
			!in(int64(got.CopyOut), 0, int64(wall)) || !in(got.Copied, copiedIn, slot+copiedIn) {
			t.Fatalf("reply %+v (wall %v, slot %d) left %+v", sent, wall, slot, got)
		}
		for _, f := range []struct {
			name      string
			sent, got int64
			hi        int64
			own       int64
		}{
			{"copy-in", int64(sent.CopyIn), int64(got.CopyIn), int64(wall), int64(copyIn)},
			{"kernels", int64(sent.Kernels), int64(got.Kernels), int64(wall), 0},
			{"copy-out", int64(sent.CopyOut), int64(got.CopyOut), int64(wall), 0},
			{"copied", sent.Copied, got.Copied, slot, copiedIn},
		} {
			if in(f.sent, 0, f.hi) && f.got != f.sent+f.own {
				t.Fatalf("%s: the worker's %d, within bounds, became %d", f.name, f.sent, f.got-f.own)
			}
		}
	}
}
