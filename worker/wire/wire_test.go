package wire

import (
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/plover-run/plover/device"
	"github.com/plover-run/plover/loader"
)

// A run message carries what the worker needs to run a request on its
// slot, and decodes to the same run; the output and input are slices of
// the slot, never copies.
func TestRunRoundTrip(t *testing.T) {
	const maxIn, out = 64, 32
	for _, tc := range []struct {
		name  string
		run   device.Run
		alone bool
		slot  uint32
		seq   uint32
	}{
		{"one step", device.Run{Input: make([]byte, 10), Output: make([]byte, 32), TmpLen: 8, Chain: []device.Step{{Entry: 0, Grid: 1, Block: 64}}}, false, 0, 1},
		{"flags and a key", device.Run{Input: make([]byte, 64), Output: make([]byte, 5), ZeroTmp: true, ZeroOut: true, ChainKey: 1 << 40,
			Chain: []device.Step{{Entry: 2, Grid: 3, Block: 4}, {Entry: 1, Grid: 1 << 20, Block: 1024}}}, true, 3, 1 << 31},
		{"a batch", device.Run{Input: make([]byte, 0), Output: make([]byte, 0), Items: 7, Chain: []device.Step{{Entry: 5, Grid: 9, Block: 9}}}, false, 7, 42},
	} {
		t.Run(tc.name, func(t *testing.T) {
			msg := EncodeRun(make([]byte, 0, RunMsgMax), &tc.run, tc.alone, tc.slot, tc.seq)
			if SentAlone(msg) != tc.alone || RunSeq(msg) != tc.seq || RunSlot(msg) != tc.slot {
				t.Fatalf("alone %v slot %d seq %d, want %v %d %d", SentAlone(msg), RunSlot(msg), RunSeq(msg), tc.alone, tc.slot, tc.seq)
			}
			slot := make([]byte, device.SlotSize(maxIn, out))
			var got device.Run
			steps := make([]device.Step, 8)
			if err := DecodeRun(msg, &got, steps, slot, maxIn, out); err != nil {
				t.Fatal(err)
			}
			if len(got.Input) != len(tc.run.Input) || len(got.Output) != len(tc.run.Output) || got.TmpLen != tc.run.TmpLen ||
				got.ZeroTmp != tc.run.ZeroTmp || got.ZeroOut != tc.run.ZeroOut || got.ChainKey != tc.run.ChainKey || got.Items != tc.run.Items {
				t.Fatalf("decoded %+v, sent %+v", got, tc.run)
			}
			for i, s := range got.Chain {
				if s != tc.run.Chain[i] {
					t.Fatalf("step %d: %+v, sent %+v", i, s, tc.run.Chain[i])
				}
			}
			if len(got.Input) > 0 && &got.Input[0] != &slot[0] || len(got.Output) > 0 && &got.Output[0] != &slot[device.SlotOut(maxIn)] {
				t.Fatal("input and output are not the slot's bytes")
			}
		})
	}
}

// A run message that does not fit its instance is refused, whoever wrote
// it: a worker never reads or writes past its slot.
func TestRunOutOfBounds(t *testing.T) {
	const maxIn, out = 16, 16
	ok := device.Run{Input: make([]byte, 16), Output: make([]byte, 16), Chain: []device.Step{{Grid: 1, Block: 1}}}
	good := EncodeRun(make([]byte, 0, RunMsgMax), &ok, false, 0, 1)
	for _, tc := range []struct {
		name string
		msg  []byte
	}{
		{"short", good[:RunHeader-1]},
		{"input past max_input", func() []byte { b := append([]byte(nil), good...); le.PutUint32(b[runIn:], maxIn+1); return b }()},
		{"output past out_bytes", func() []byte { b := append([]byte(nil), good...); le.PutUint32(b[runOut:], out+1); return b }()},
		{"more steps than the table", func() []byte { b := append([]byte(nil), good...); le.PutUint16(b[runSteps:], 9); return b }()},
		{"length not the steps'", append(append([]byte(nil), good...), 0)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var r device.Run
			if err := DecodeRun(tc.msg, &r, make([]device.Step, 8), make([]byte, device.SlotSize(maxIn, out)), maxIn, out); err == nil {
				t.Fatal("decoded")
			}
		})
	}
}

// A device's error crosses the wire as a status and comes back as the
// same class of error the device returns in process.
func TestStatusRoundTrip(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		st   byte
		same func(error) bool
	}{
		{"ok", nil, StOK, func(err error) bool { return err == nil }},
		{"refused bundle", &loader.Error{Path: "k.so", Reason: "no PLOVER_ENTRY"}, StInvalid, func(err error) bool {
			var le *loader.Error
			return errors.As(err, &le) && le.Path == "k.so" && le.Reason == "no PLOVER_ENTRY"
		}},
		{"kernel", &device.KernelError{Msg: "input must be 784 floats"}, StKernel, func(err error) bool {
			var ke *device.KernelError
			return errors.As(err, &ke) && ke.Msg == "input must be 784 floats"
		}},
		{"refused input", &device.KernelError{Msg: "input must be 784 floats", Rejected: true}, StRejected, func(err error) bool {
			var ke *device.KernelError
			return errors.As(err, &ke) && ke.Rejected && ke.Msg == "input must be 784 floats"
		}},
		{"out of memory", errors.Join(errors.New("cuMemAlloc"), device.ErrOutOfMemory), StOOM, func(err error) bool { return errors.Is(err, device.ErrOutOfMemory) }},
		{"other", errors.New("disk on fire"), StFailed, func(err error) bool { return err != nil && strings.Contains(err.Error(), "disk on fire") }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st, msg := StatusOf(tc.err)
			if st != tc.st {
				t.Fatalf("status %d, want %d", st, tc.st)
			}
			if back := ErrorOf(st, msg); !tc.same(back) {
				t.Fatalf("came back as %v", back)
			}
		})
	}
	if st, _ := StatusOf(errors.Join(errors.New("sticky"), device.ErrUnhealthy)); st != StFault {
		t.Fatalf("an unhealthy device: status %d, want StFault (the worker goes)", st)
	}
	// A fault of the call's own goes as its kernel error's message, which
	// the server wraps in a KernelError again: "kernel failed: " once.
	own := errors.Join(&device.KernelError{Msg: "plover_load: illegal address"}, device.ErrUnhealthy)
	if st, msg := StatusOf(own); st != StFault || msg != "plover_load: illegal address" {
		t.Fatalf("a fault of its own: status %d, %q; want StFault and the kernel error's message", st, msg)
	}
}

// The protocol version is in the ready message: bumped with any change to
// a message, so a worker of another build is refused at its start.
func TestProtocolIsVersioned(t *testing.T) {
	if Protocol < 6 || ReadyLen != 7 {
		t.Fatalf("protocol %d, ready message %d bytes", Protocol, ReadyLen)
	}
}

// A reply carries the run's status, timing, its output length, the bytes
// the worker copied and its text; it is read only as its own run's.
func TestReplyRoundTrip(t *testing.T) {
	for _, tc := range []struct {
		name string
		st   byte
		run  device.Run
		text string
	}{
		{"done", StOK, device.Run{OutLen: 12345, Timing: device.Timing{CopyIn: 1, Kernels: 2, CopyOut: 3, Copied: 4096, Busy: 5}}, ""},
		{"a kernel's failure", StKernel, device.Run{Timing: device.Timing{Kernels: 1 << 40}}, "bad input"},
		{"a fault", StFault, device.Run{}, "illegal address"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := EncodeReply(make([]byte, 0, ReplyMax), tc.st, &tc.run, 9, 10, 11, tc.text)
			if st, seq, err := ReplyHead(b); err != nil || st != tc.st || seq != 9 {
				t.Fatalf("head: status %d seq %d (%v), want %d 9", st, seq, err, tc.st)
			}
			var got device.Run
			st, n, text, err := DecodeReply(b, &got, 9)
			if err != nil || st != tc.st || n != uint64(tc.run.OutLen) || text != tc.text || got.Timing != tc.run.Timing {
				t.Fatalf("decoded %d %d %q %+v (%v)", st, n, text, got.Timing, err)
			}
			var other device.Run
			var turn *TurnError
			if _, _, _, err := DecodeReply(b, &other, 10); !errors.As(err, &turn) || turn.Got != 9 || turn.Want != 10 || other.Timing != (device.Timing{}) {
				t.Fatalf("read as run 10's: %v, timing %+v", err, other.Timing)
			}
		})
	}
	r := device.Run{}
	if long := EncodeReply(make([]byte, 0, ReplyMax), StKernel, &r, 9, 10, 11, strings.Repeat("x", 2*ReplyMax)); len(long) != ReplyMax {
		t.Fatalf("a long message made a reply of %d bytes, want it cut to %d", len(long), ReplyMax)
	}
}

// A reply's clock readings give the run's hand-off (its message sent
// until the worker read it) and hand-back (the reply sent until the
// server read it), each within 0 and the run's wall time whatever the
// reply says.
func TestHandover(t *testing.T) {
	const wall = time.Millisecond
	for _, tc := range []struct {
		name                  string
		got, sent             int64 // the worker's readings
		serverSent, serverGot int64
		off, back             time.Duration
	}{
		{"in order", 1_010, 1_500, 1_000, 1_700, 10, 200},
		{"read before it was sent", 900, 1_500, 1_000, 1_700, 0, 200},
		{"sent after the server read it", 1_010, 1_800, 1_000, 1_700, 10, 0},
		{"past the wall time", 1_000 + 2*int64(wall), 1_500, 1_000, 1_000 + 3*int64(wall), wall, wall},
		{"any bits", math.MaxInt64, math.MinInt64, 1_000, 1_700, wall, wall},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := EncodeReply(make([]byte, 0, ReplyMax), StOK, &device.Run{}, 1, tc.got, tc.sent, "")
			if off, back := Handover(b, tc.serverSent, tc.serverGot, wall); off != tc.off || back != tc.back {
				t.Fatalf("hand-off %v, hand-back %v; want %v, %v", off, back, tc.off, tc.back)
			}
		})
	}
	if off, back := Handover(make([]byte, ReplyHeader-1), 0, 1, wall); off != 0 || back != 0 {
		t.Fatalf("a reply too short: %v, %v; want none", off, back)
	}
}

// Mono reads the system's CLOCK_MONOTONIC, the one clock a worker and its
// server share.
func TestMonoIsTheSystemsMonotonicClock(t *testing.T) {
	var ts unix.Timespec
	unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	a := ts.Nano()
	m := Mono()
	unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	if b := ts.Nano(); m < a || m > b {
		t.Fatalf("Mono %d, not within CLOCK_MONOTONIC's %d..%d", m, a, b)
	}
}
