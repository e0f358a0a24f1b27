package worker

import (
	"testing"
	"time"
)

const mib = 1 << 20

// A slot the server let go of stays out of its worker's limit for
// leaveMost, as the worker may not have unmapped it yet (it does so after
// the instance's fini, which may take seconds); after that the worker's
// shared memory past its mapped slots counts again.
func TestALetGoSlotCountsAsTheServersForAWhile(t *testing.T) {
	p := &proc{d: &Device{}}
	p.mapSlot(128 * mib)
	p.dropSlot(128*mib, 0, false)
	left := p.slots.left[0].at
	for _, tt := range []struct {
		name  string
		after time.Duration
		want  int64
	}{
		{"measured before the drop", -time.Millisecond, 4 * mib},
		{"just after", time.Millisecond, 4 * mib},
		{"2 s on, its fini slow", 2 * time.Second, 4 * mib},
		{"just within leaveMost", leaveMost - time.Millisecond, 4 * mib},
		{"past it", leaveMost, 132 * mib},
		{"and after", 2 * leaveMost, 132 * mib},
	} {
		// A bundle's 4 MiB and the slot's 128, still mapped.
		if got := p.limitedRSS(132*mib, 128*mib, left.Add(tt.after)); got != tt.want {
			t.Errorf("%s: %d MiB counted, want %d", tt.name, got/mib, tt.want/mib)
		}
	}
}

// Slots let go of less than leaveMost apart each leave the limit's
// allowance leaveMost after their own drop: a stream of closing instances
// does not keep every slot it ever closed out of the limit (a bundle's own
// shared memory would hide there).
func TestLetGoSlotsLeaveOnTheirOwnClocks(t *testing.T) {
	p := &proc{d: &Device{}}
	p.mapSlot(64 * mib)
	p.mapSlot(64 * mib)
	p.dropSlot(64*mib, 0, false)
	first := p.slots.left[0].at
	// The second drop half of leaveMost later (set by hand: dropSlot
	// reads the clock).
	p.dropSlot(64*mib, 0, false)
	p.slots.left[1].at = first.Add(leaveMost / 2)
	for _, tt := range []struct {
		name  string
		after time.Duration // from the first drop
		want  int64         // of a bundle's 4 MiB and 128 MiB of slots still mapped
	}{
		{"both within leaveMost", leaveMost / 4, 4 * mib},
		{"the first's past", leaveMost, 68 * mib},
		{"both past", leaveMost * 3 / 2, 132 * mib},
	} {
		if got := p.limitedRSS(132*mib, 128*mib, first.Add(tt.after)); got != tt.want {
			t.Errorf("%s: %d MiB counted, want %d", tt.name, got/mib, tt.want/mib)
		}
	}
}

// A slot whose worker answered that it holds none of it (it refused the
// slot, or dropped it before answering) enters no allowance: a worker that
// says so and keeps it mapped pays for it.
func TestASlotTheWorkerUnmappedLeavesAtOnce(t *testing.T) {
	p := &proc{d: &Device{}}
	p.mapSlot(128 * mib)
	p.dropSlot(128*mib, 0, true)
	if got := p.limitedRSS(132*mib, 128*mib, time.Now()); got != 132*mib {
		t.Fatalf("%d MiB counted, want 132: the slot was said unmapped", got/mib)
	}
}

// The let-go list holds the drops of leaveMost at most, however many come
// and whether or not a sample settles them.
func TestTheLetGoListStaysBounded(t *testing.T) {
	var s slotMem
	t0 := time.Now()
	const every = 10 * time.Millisecond
	most := int(leaveMost / every)
	for i := range 3 * most {
		s.mapped += mib
		s.letGo(mib, false, t0.Add(time.Duration(i)*every))
		if n := len(s.left); n > most {
			t.Fatalf("after %d drops %v apart: %d listed, want at most %d", i+1, every, n, most)
		}
	}
	if s.mapped != 0 {
		t.Fatalf("mapped %d after every slot was let go of", s.mapped)
	}
}
