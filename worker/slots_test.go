package worker

import (
	"bytes"
	"context"
	"errors"
	"runtime/debug"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

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
	lent := lendAll(lender, m)
	if len(lent) != maxPoolSlots || &lent[0].Input()[0] != first {
		t.Fatalf("lent %d slots (want %d), the first one again: %v", len(lent), maxPoolSlots, &lent[0].Input()[0] == first)
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

// A slot whose request's run panicked is discarded: a worker may still
// write into it, so it is never lent again, and while a run the server
// left may still be on it (a panic between the run's send and its reply)
// it is unmapped with its program, not kept for the server's life. Before
// Discard the transport could only leave such a slot unreleased: lent for
// good, counted and mapped until the server ended (up to maxPoolSlots per
// program, per version). One no run is on goes at once
// (TestCUDADiscardedSlotGivesBackItsPin).
func TestDiscardedSlotIsNotLentAgainAndGoesWithItsProgram(t *testing.T) {
	d := newDevice(t, 1)
	m := testkit.Manifest("echo")
	p := load(t, d, m)
	lender := p.(device.Lender)
	s, ok := lender.Lend(m.MaxInputBytes, m.OutBytes)
	if !ok {
		t.Fatal("no slot lent")
	}
	s.(*poolSlot).running() // and the server panicked before its reply
	s.Discard()
	for range maxPoolSlots - 1 {
		other, ok := lender.Lend(m.MaxInputBytes, m.OutBytes)
		if !ok {
			t.Fatal("the pool refused a slot before its bound")
		}
		if other == s {
			t.Fatal("a discarded slot was lent again")
		}
		other.Release()
	}
	pool := &p.(*program).slots
	pool.mu.Lock()
	count, discarded := pool.count, len(pool.discarded)
	pool.mu.Unlock()
	if count != 2 || discarded != 1 {
		t.Fatalf("the pool counts %d slots, %d discarded; want the discarded one and the one reused", count, discarded)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	pool.mu.Lock()
	count, discarded = pool.count, len(pool.discarded)
	pool.mu.Unlock()
	if count != 0 || discarded != 0 {
		t.Fatalf("after the program's close the pool still counts %d slots (%d discarded): their memory is still mapped", count, discarded)
	}
}

// On the host device too a discarded slot no run is on goes at once: its
// worker unmaps it and the pool counts it no more (it counted against
// maxPoolSlots until the program's unload before).
func TestDiscardedSlotGoesWhenNoRunIsOnIt(t *testing.T) {
	d := newDevice(t, 1)
	m := testkit.Manifest("echo")
	p := load(t, d, m)
	s, ok := p.(device.Lender).Lend(m.MaxInputBytes, m.OutBytes)
	if !ok {
		t.Fatal("no slot lent")
	}
	g := p.(*program)
	maps := slotMaps(t, g.p.pid)
	s.Discard()
	waitFor(t, "the worker to unmap the discarded slot", func() bool { return slotMaps(t, g.p.pid) == maps-1 })
	waitFor(t, "the pool to count it no more", func() bool {
		g.slots.mu.Lock()
		defer g.slots.mu.Unlock()
		return g.slots.count == 0 && len(g.slots.discarded) == 0 && len(g.slots.all) == 0
	})
	if !g.Alive() {
		t.Fatalf("the worker died: %v", g.Death())
	}
}

// lendAll lends slots of m's layout until l lends no more.
func lendAll(l device.Lender, m *abi.Manifest) []device.Slot {
	var lent []device.Slot
	for {
		s, ok := l.Lend(m.MaxInputBytes, m.OutBytes)
		if !ok {
			return lent
		}
		lent = append(lent, s)
	}
}

// A discarded slot's drop waits for its worker's control channel behind
// another's call, then has its own time for the call. Before, one 10 s
// bound covered both: a drop that got the channel late, its worker slow
// for a moment then, ran past it, and the worker was killed, its program
// blamed as if a request's deadline had passed.
func TestDiscardedSlotsDropHasItsOwnTimeOnceTheChannelIsFree(t *testing.T) {
	g, s := lentEcho(t)
	maps := slotMaps(t, g.p.pid)
	g.p.ctlTok <- struct{}{} // another's long control call (an instance's init, say)
	t0 := time.Now()
	s.Discard()
	// Well inside the drop's wait (1.5 s before its end): a loaded
	// machine that ran the wait out before the token came made the drop
	// give up, and the test waited for a call that never came.
	for time.Since(t0) < dropWait-1500*time.Millisecond { // the call's length: the scenario, not a wait for state
		time.Sleep(10 * time.Millisecond)
	}
	syscall.Kill(g.p.pid, syscall.SIGSTOP) // the worker slow for a moment (CPU-starved)
	<-g.p.ctlTok
	waitFor(t, "the drop's call", func() bool {
		g.p.mu.Lock()
		defer g.p.mu.Unlock()
		return g.p.ctlBusy && g.p.calling == "dropping a discarded slot"
	})
	for time.Since(t0) < dropWait+300*time.Millisecond && g.Alive() {
		time.Sleep(10 * time.Millisecond)
	}
	syscall.Kill(g.p.pid, syscall.SIGCONT)
	waitFor(t, "the worker to drop the slot or die", func() bool { return !g.Alive() || slotMaps(t, g.p.pid) == maps-1 })
	if !g.Alive() {
		t.Fatalf("the worker was killed by the slot's drop: %v", g.Death())
	}
}

// A drop's call that its worker does not answer within the call's own
// bound ends the worker (its reply, were it to come, would be read as the
// next call's), and says why: no request's deadline passed.
func TestDiscardedSlotsDropPastItsBoundSaysWhy(t *testing.T) {
	g, s := lentEcho(t)
	defer func(b time.Duration) { dropBound = b }(dropBound)
	dropBound = time.Nanosecond // past before the call is sent: no worker answers in time
	s.Discard()
	waitFor(t, "the worker's end", func() bool { return !g.Alive() })
	if err := g.Death(); err == nil || !strings.Contains(err.Error(), "it did not answer within 1ns while dropping a discarded slot") {
		t.Fatalf("the worker's end: %v", err)
	}
}

// lentEcho is a pool slot lent by the echo program in a worker of its own.
func lentEcho(t *testing.T) (*program, device.Slot) {
	t.Helper()
	m := testkit.Manifest("echo")
	g := load(t, newDevice(t, 0), m).(*program)
	s, ok := g.Lend(m.MaxInputBytes, m.OutBytes)
	if !ok {
		t.Fatal("no slot")
	}
	return g, s
}

// A run whose request panics in the server before its message went out
// (here copying its input in, from memory that faults) leaves no run on
// its pool slot: the slot, discarded, goes at once. Before, the slot was
// marked in a run from before the copy, and kept until its program ended.
func TestDiscardedSlotOfARunThatPanickedBeforeItsSendGoes(t *testing.T) {
	g, s := lentEcho(t)
	m := testkit.Manifest("echo")
	in := newInst(t, g, m)
	echo, _ := g.Entry("echo")
	bad, err := unix.Mmap(-1, 0, 4096, unix.PROT_NONE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(bad)
	maps := slotMaps(t, g.p.pid)
	func() {
		defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
		defer func() {
			if recover() == nil {
				t.Fatal("the run did not panic")
			}
		}()
		in.Run(&device.Run{Input: bad[:1], Output: s.Output(), Slot: s, TmpLen: m.TmpBytes,
			Chain: []device.Step{{Entry: echo, Grid: 1, Block: 1}}})
	}()
	s.Discard() // as the transport does with a panicked request's slot
	waitFor(t, "the worker to unmap the discarded slot", func() bool { return slotMaps(t, g.p.pid) == maps-1 })
}

// Lend is called before a request's body is read: a slot it would have
// to make while the worker's control channel is busy (here an instance's
// plover_instance_init, 3 s, as a warm function scales up) is not made,
// and the body goes to ordinary memory and is copied, as when the pool is
// full. Before, Lend waited up to 10 s for the channel, then up to 10 s
// for the call, the request held before its body was read. Once the
// channel is free the slot is made.
func TestLendDoesNotWaitForTheControlChannel(t *testing.T) {
	d := newDevice(t, 0)
	m := testkit.Manifest("hooks")
	m.Library, m.Chain = "hooks.so", []abi.Launch{{Kernel: "report", Grid: 1, Block: 1}}
	dir := t.TempDir()
	testkit.BuildLib(t, testkit.HooksSource(), dir, m.Library, "-DSLOW_INIT_MS=3000")
	testkit.WriteManifest(t, dir, m)
	p, err := d.Load(context.Background(), device.ProgramSpec{Dir: dir, Manifest: m})
	if err != nil {
		t.Fatalf("load: %v", err)
	}
	t.Cleanup(func() { p.Close() })
	g := p.(*program)
	made := make(chan error, 1)
	go func() {
		in, err := p.NewInstance(device.InstanceConfig{MaxInput: m.MaxInputBytes, Tmp: m.TmpBytes, Out: m.OutBytes})
		if err == nil {
			in.Close()
		}
		made <- err
	}()
	waitFor(t, "the instance's init to hold the control channel", func() bool {
		g.p.mu.Lock()
		defer g.p.mu.Unlock()
		return g.p.ctlBusy && g.p.calling == "creating an instance"
	})
	s, ok := g.Lend(m.MaxInputBytes, m.OutBytes)
	select {
	case err := <-made:
		t.Fatalf("Lend returned (lent %v) only once the instance's init had ended (%v)", ok, err)
	default:
	}
	if ok {
		s.Release()
		t.Fatal("Lend made a slot while the control channel was busy")
	}
	if count := poolCount(g); count != 0 {
		t.Fatalf("the pool counts %d slots after a Lend that made none", count)
	}
	if err := <-made; err != nil {
		t.Fatalf("new instance: %v", err)
	}
	s, ok = g.Lend(m.MaxInputBytes, m.OutBytes)
	if !ok {
		t.Fatal("no slot made once the control channel was free")
	}
	s.Release()
}

// A slot whose call finds the control channel taken (after Lend's look
// found it free) is not made, at once, not after the other call, and the
// worker, never sent it, is not counted as perhaps still mapping it: its memory limit stays as it
// was, where a slot it may map counts for 10 s after it is let go of.
func TestPoolSlotNotSentOnABusyChannelLeavesNothingCounted(t *testing.T) {
	g, s := lentEcho(t)
	s.Release()
	g.p.ctlTok <- struct{}{} // another's call, taken after Lend's look, ending in 3 s
	end := time.AfterFunc(3*time.Second, func() { <-g.p.ctlTok })
	_, err := g.newPoolSlot(s.(*poolSlot).maxIn, s.(*poolSlot).out)
	if !end.Stop() {
		t.Fatalf("the slot's call returned (%v) only once the other call had ended", err)
	}
	<-g.p.ctlTok
	if !errors.Is(err, device.ErrNotStarted) {
		t.Fatalf("a slot made on a busy channel: %v, want ErrNotStarted (not sent)", err)
	}
	g.p.slots.mu.Lock()
	mapped, left := g.p.slots.mapped, len(g.p.slots.left)
	g.p.slots.mu.Unlock()
	if mapped != s.(*poolSlot).size() || left != 0 {
		t.Fatalf("the worker counted as mapping %d bytes (want the one slot's %d), %d slots let go of (want none: it was never sent one)", mapped, s.(*poolSlot).size(), left)
	}
}

// poolCount is how many slots g's pool counts, lent and free.
func poolCount(g *program) int {
	g.slots.mu.Lock()
	defer g.slots.mu.Unlock()
	return g.slots.count
}
