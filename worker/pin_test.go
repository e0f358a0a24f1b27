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
	left := p.slots.leftAt
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
