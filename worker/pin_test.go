package worker

import (
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/plover-run/plover/device"
	"github.com/plover-run/plover/internal/testkit"
	"github.com/plover-run/plover/worker/wire"
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

// Whether a slot is pinned is its worker's word, which bundle code can
// forge: the device's count does not read it. On a device that pins, a
// pool slot keeps its reservation for its life and an instance's own slot
// counts at its size, whether the worker says it pinned it, refused, or
// that there was nothing to pin, until each is let go of; so a worker
// cannot lower the count of what it may hold pinned (saying it pinned
// nothing) nor move it otherwise, and the limit holds. On a device that
// pins nothing, nothing counts, whatever the worker says. A refusal's
// reason, the worker's text, is logged bounded.
func TestPinCountIsNotTheWorkersWord(t *testing.T) {
	const size = 4 * mib
	long := strings.Repeat("\xffwhy", 10000)
	for _, pin := range []wire.Pin{{State: wire.PinNone}, {State: wire.PinDone}, {State: wire.PinRefused, Why: long}} {
		t.Run(fmt.Sprintf("pin state %d", pin.State), func(t *testing.T) {
			var log testkit.LogBuffer
			d := &Device{opts: Options{Base: fakeGPU{}, PinLimit: 2 * size, Log: slog.New(slog.NewTextHandler(&log, nil))}}
			p := &proc{d: d}
			g := &program{p: p, name: "f"}
			own := p.pinSlot(g, pin, size, "an instance's own", false)
			if !d.reservePin(size) {
				t.Fatal("no room reserved for a pool slot within the limit")
			}
			pool := p.pinSlot(g, pin, size, "a pool slot", true)
			if own != size || pool != size || d.Pinning().Bytes != 2*size {
				t.Fatalf("the slots count %d and %d, the device %d; want each at its size, %d in all", own, pool, d.Pinning().Bytes, 2*size)
			}
			if d.reservePin(1) {
				t.Fatal("a reservation past the limit was granted")
			}
			p.dropSlot(size, pool, true)
			p.dropSlot(size, own, false)
			if got := d.Pinning().Bytes; got != 0 {
				t.Fatalf("%d bytes counted after both slots were let go of", got)
			}
			if pin.State == wire.PinRefused {
				line := log.String()
				if !strings.Contains(line, "refused to pin") || len(line) > 2*maxPinWhy+500 {
					t.Fatalf("the refusal's log line (%d bytes): want it logged, its reason bounded", len(line))
				}
			}
			// A device that pins nothing counts nothing, whatever is said.
			h := &proc{d: &Device{opts: Options{Base: device.NewHost(0), Log: d.opts.Log}}}
			if h.d.reservePin(size); h.pinSlot(g, pin, size, "a pool slot", true) != 0 || h.d.pin.bytes.Load() != 0 {
				t.Fatalf("on the host device: %d bytes counted", h.d.pin.bytes.Load())
			}
		})
	}
}
