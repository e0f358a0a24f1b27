package worker

import (
	"bytes"
	"errors"
	"testing"
	"time"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/device"
	"github.com/plover-run/plover/internal/testkit"
)

// A request whose body is in a slot its worker lent runs there: nothing is
// copied on either side (the host device runs the chain on the slot), and
// the output is left in the slot's output. Without a lent slot the server
// copies the input in and the output out of the instance's own slot.
func TestLentSlotRunsInPlace(t *testing.T) {
	d := newDevice(t, 1)
	m := testkit.Manifest("echo")
	m.Chain = []abi.Launch{{Kernel: "echo", Grid: 1, Block: 64}, {Kernel: "add_one", Grid: 1, Block: 1}}
	p := load(t, d, m)
	in := newInst(t, p, m)
	echo, _ := p.Entry("echo")
	addOne, _ := p.Entry("add_one")
	chain := []device.Step{{Entry: echo, Grid: 1, Block: 64}, {Entry: addOne, Grid: 1, Block: 1}}
	lender := p.(device.Lender)
	input := []byte("a body that landed where the worker reads it")
	want := make([]byte, m.OutBytes)
	copy(want, input)
	for i := range want {
		want[i]++
	}

	s, ok := lender.Lend(m.MaxInputBytes, m.OutBytes)
	if !ok {
		t.Fatal("no slot lent")
	}
	if s.Device() != d || int64(len(s.Input())) != m.MaxInputBytes || int64(len(s.Output())) != m.OutBytes {
		t.Fatalf("slot of %d/%d bytes on %v", len(s.Input()), len(s.Output()), s.Device())
	}
	n := copy(s.Input(), input)
	r := &device.Run{Input: s.Input()[:n], Output: s.Output(), Slot: s, TmpLen: m.TmpBytes, Chain: chain}
	if err := in.Run(r); err != nil {
		t.Fatal(err)
	}
	if r.Timing.Copied != 0 || !bytes.Equal(s.Output(), want) {
		t.Fatalf("in a lent slot: %d bytes copied, output %q", r.Timing.Copied, s.Output()[:8])
	}
	first := &s.Input()[0]
	s.Release()

	out := make([]byte, m.OutBytes)
	r = &device.Run{Input: input, Output: out, TmpLen: m.TmpBytes, Chain: chain}
	if err := in.Run(r); err != nil {
		t.Fatal(err)
	}
	if r.Timing.Copied != int64(len(input))+m.OutBytes || !bytes.Equal(out, want) {
		t.Fatalf("in ordinary memory: %d bytes copied (want %d: in and out), output %q", r.Timing.Copied, int64(len(input))+m.OutBytes, out[:8])
	}

	// Slots are reused, bounded, and of the program's layout only.
	var lent []device.Slot
	for {
		s, ok := lender.Lend(m.MaxInputBytes, m.OutBytes)
		if !ok {
			break
		}
		lent = append(lent, s)
	}
	if want := poolBound(m.MaxInputBytes + m.OutBytes); len(lent) != want || &lent[0].Input()[0] != first {
		t.Fatalf("lent %d slots (want %d), the first one again: %v", len(lent), want, &lent[0].Input()[0] == first)
	}
	lent[3].Release()
	if s, ok := lender.Lend(m.MaxInputBytes, m.OutBytes); !ok || s != lent[3] {
		t.Fatal("a released slot was not lent again")
	}
	for _, s := range lent {
		s.Release()
	}
	if _, ok := lender.Lend(m.MaxInputBytes+1, m.OutBytes); ok {
		t.Fatal("lent a slot of another layout")
	}
}

// A pool keeps few slots of a large layout: its memory stays resident while
// the worker lives, outside the device's accounting (32 slots of a 24 MiB
// layout would be 768 MiB per function).
func TestPoolBoundedByBytes(t *testing.T) {
	for _, tc := range []struct {
		size int64
		want int
	}{
		{0, maxPoolSlots}, {3136 + 40, maxPoolSlots}, {2 << 20, 32}, {4 << 20, 16},
		{8_000_000, 8}, {24 << 20, 2}, {64 << 20, 1}, {1 << 30, 1},
	} {
		if got := poolBound(tc.size); got != tc.want {
			t.Errorf("poolBound(%d) = %d, want %d", tc.size, got, tc.want)
		}
	}
	d := newDevice(t, 1)
	m := testkit.Manifest("large")
	m.MaxInputBytes, m.OutBytes = 20<<20, 4<<20
	lender := load(t, d, m).(device.Lender)
	var lent []device.Slot
	for range maxPoolSlots {
		s, ok := lender.Lend(m.MaxInputBytes, m.OutBytes)
		if !ok {
			break
		}
		lent = append(lent, s)
	}
	if len(lent) != 2 {
		t.Fatalf("lent %d slots of 24 MiB, want 2 (64 MiB at most)", len(lent))
	}
	for _, s := range lent {
		s.Release()
	}
}

// A chain that runs past its request's deadline still works on its slot:
// the slot must not serve another request until the chain has ended, even
// though its request let it go when it was answered (504).
func TestOverrunHoldsItsSlot(t *testing.T) {
	d := newDevice(t, 1)
	m := testkit.Slow("slow", 1)
	p := load(t, d, m)
	in := newInst(t, p, m)
	sleep, _ := p.Entry("sleep_ms")
	echo, _ := p.Entry("echo")
	lender := p.(device.Lender)
	s, _ := lender.Lend(m.MaxInputBytes, m.OutBytes)
	r := &device.Run{Input: s.Input()[:1], Output: s.Output(), Slot: s, TmpLen: m.TmpBytes,
		Chain: []device.Step{{Entry: sleep, Grid: 120, Block: 1}}, Deadline: time.Now().Add(30 * time.Millisecond)}
	if err := in.Run(r); !errors.Is(err, device.ErrDeadline) {
		t.Fatalf("run past its deadline: %v", err)
	}
	s.Release() // the request was answered: 504
	other, ok := lender.Lend(m.MaxInputBytes, m.OutBytes)
	if !ok || other == s {
		t.Fatal("the slot of a chain still running was lent again")
	}
	// The instance's next run waits for the overrun to end: then the slot
	// is free again.
	r = &device.Run{Input: []byte{1}, Output: make([]byte, 8), TmpLen: m.TmpBytes, Chain: []device.Step{{Entry: echo, Grid: 1, Block: 8}}}
	if err := in.Run(r); err != nil {
		t.Fatal(err)
	}
	other.Release()
	a, _ := lender.Lend(m.MaxInputBytes, m.OutBytes)
	b, _ := lender.Lend(m.MaxInputBytes, m.OutBytes)
	if a != s && b != s {
		t.Fatal("the slot did not come back once the overrun ended")
	}
	a.Release()
	b.Release()
}

// A chain's refusal of its input crosses the worker's wire as a refusal,
// not a kernel failure.
func TestRefusalThroughWorker(t *testing.T) {
	d := newDevice(t, 1)
	m := testkit.Manifest("picky")
	m.Chain = []abi.Launch{{Kernel: "refuse", Grid: 1, Block: 1}}
	p := load(t, d, m)
	in := newInst(t, p, m)
	refuse, _ := p.Entry("refuse")
	err := in.Run(&device.Run{Output: make([]byte, 8), Chain: []device.Step{{Entry: refuse, Grid: 1, Block: 1}}})
	var ke *device.KernelError
	if !errors.As(err, &ke) || !ke.Rejected || ke.Msg != "input must not be empty (got 0 bytes)" {
		t.Fatalf("%v (%+v), want a refusal with the chain's message", err, ke)
	}
}
