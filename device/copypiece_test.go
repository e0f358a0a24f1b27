package device

import (
	"bytes"
	"math/rand/v2"
	"sync/atomic"
	"testing"
)

// With a copy piece, a run's copy in and copy out go as async copies of at
// most that size, back to back, and the bytes come out exactly (the
// unaligned tail included), whether the chain runs directly, is captured
// or is replayed; with none, one copy each way. The fake driver counts the
// copies; a GPU shows the driver takes the pieces and their offsets.
func testCopyPieces(t *testing.T, e *bundleEnv) {
	var copies *[2][3]int64 // {calls, bytes, largest}: to device, to host
	if e.fake {
		p, err := e.lib.Symbol("fakecu_copies")
		if err != nil {
			t.Fatal(err)
		}
		copies = (*[2][3]int64)(p)
	}
	const n = 1<<20 + 123
	tests := []struct {
		name           string
		piece          int64
		calls, largest int64
	}{
		{"whole", 0, 1, n},
		{"64 KiB", 64 << 10, 17, 64 << 10},
		{"a piece above the body", 4 << 20, 1, n},
	}
	rng := rand.New(rand.NewPCG(21, 22))
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := e.gpu(t)
			g.SetCopyPiece(tt.piece)
			inst := newInst(t, g, e, InstanceConfig{MaxInput: n, Out: n})
			chain := []Step{e.step(t, "pl_copy", 1, 256)}
			for i, ran := range []string{"direct", "captured", "replayed"} {
				in := randBytes(rng, n)
				out := make([]byte, n)
				if copies != nil {
					for d := range copies {
						for k := range copies[d] {
							atomic.StoreInt64(&copies[d][k], 0)
						}
					}
				}
				r := &Run{Input: in, Output: out, Chain: chain, ChainKey: 21}
				mustRun(t, inst, r)
				if !bytes.Equal(out, in) {
					t.Fatalf("run %d (%s): output %s", i, ran, firstDiff(out, in))
				}
				t.Logf("run %d (%s): copy in %v, copy out %v", i, ran, r.Timing.CopyIn, r.Timing.CopyOut)
				if copies == nil {
					continue
				}
				for d, way := range []string{"host to device", "device to host"} {
					calls, bytes, largest := atomic.LoadInt64(&copies[d][0]), atomic.LoadInt64(&copies[d][1]), atomic.LoadInt64(&copies[d][2])
					if calls != tt.calls || bytes != n || largest != tt.largest {
						t.Errorf("run %d (%s), %s: %d copies of %d bytes, the largest %d; want %d of %d, the largest %d",
							i, ran, way, calls, bytes, largest, tt.calls, n, tt.largest)
					}
				}
			}
			if s := inst.stats.load(); s.Captured != 1 || s.Replayed != 1 {
				t.Errorf("graph runs: %+v, want one captured and one replayed", s)
			}
		})
	}
}
