package worker

import (
	"testing"
	"time"
)

// A slot the server let go of stays out of its worker's limit for
// leaveGrace, as the worker may not have unmapped it yet; after that the
// worker's shared memory past its mapped slots counts again.
func TestALetGoSlotCountsAsTheServersForAWhile(t *testing.T) {
	const mib = 1 << 20
	p := &proc{d: &Device{}}
	p.mapSlot(128 * mib)
	p.dropSlot(128*mib, 0)
	left := p.slots.left[0].at
	for _, tt := range []struct {
		name  string
		after time.Duration
		want  int64
	}{
		{"measured before the drop", -time.Millisecond, 4 * mib},
		{"just after", time.Millisecond, 4 * mib},
		{"within the grace", leaveGrace - time.Millisecond, 4 * mib},
		{"past it", leaveGrace, 132 * mib},
		{"and after", 2 * leaveGrace, 132 * mib},
	} {
		// A bundle's 4 MiB and the slot's 128, still mapped.
		if got := p.limitedRSS(132*mib, 128*mib, left.Add(tt.after)); got != tt.want {
			t.Errorf("%s: %d MiB counted, want %d", tt.name, got/mib, tt.want/mib)
		}
	}
}

// Slots let go of less than a grace apart each leave the limit's allowance
// a grace after their own drop: a stream of closing instances does not
// keep every slot it ever closed out of the limit (a bundle's own shared
// memory would hide there).
func TestLetGoSlotsLeaveOnTheirOwnClocks(t *testing.T) {
	const mib = 1 << 20
	p := &proc{d: &Device{}}
	p.mapSlot(64 * mib)
	p.mapSlot(64 * mib)
	p.dropSlot(64*mib, 0)
	first := p.slots.left[0].at
	// The second drop half a grace later (set by hand: dropSlot reads
	// the clock).
	p.dropSlot(64*mib, 0)
	p.slots.left[1].at = first.Add(leaveGrace / 2)
	for _, tt := range []struct {
		name  string
		after time.Duration // from the first drop
		want  int64         // of a bundle's 4 MiB and 128 MiB of slots still mapped
	}{
		{"both within their grace", leaveGrace / 4, 4 * mib},
		{"the first's past", leaveGrace, 68 * mib},
		{"both past", leaveGrace * 3 / 2, 132 * mib},
	} {
		if got := p.limitedRSS(132*mib, 128*mib, first.Add(tt.after)); got != tt.want {
			t.Errorf("%s: %d MiB counted, want %d", tt.name, got/mib, tt.want/mib)
		}
	}
}
