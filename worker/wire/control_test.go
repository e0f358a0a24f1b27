package wire

import (
	"bytes"
	"errors"
	"math"
	"testing"
	"time"

	"github.com/plover-run/plover/device"
)

// Every control message decodes to what was encoded.
func TestControlRoundTrip(t *testing.T) {
	for _, tc := range []struct {
		name string
		c    Control
	}{
		{"load", Control{Op: OpLoad, Prog: 1, Manifest: []byte(`{"name":"echo"}`)}},
		{"load with a prefix", Control{Op: OpLoad, Prog: 1 << 31, Prefix: "p2.", Manifest: []byte(`{"name":"echo"}`)}},
		{"load, no manifest", Control{Op: OpLoad, Prog: 3, Prefix: "p3."}},
		{"entry", Control{Op: OpEntry, Prog: 2, Kernel: "add_one"}},
		{"entry, no name", Control{Op: OpEntry}},
		{"new instance", Control{Op: OpNewInstance, Prog: 9, MaxIn: 1 << 33, Tmp: 0, Out: 7}},
		{"unload", Control{Op: OpUnload, Prog: 4}},
		{"slot", Control{Op: OpSlot, Prog: 3, Size: 1 << 20}},
		{"drop a slot", Control{Op: OpDropSlot, Prog: 3, Slot: 9}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := DecodeControl(AppendControl(nil, tc.c))
			if err != nil || got.Op != tc.c.Op || got.Prog != tc.c.Prog || got.Prefix != tc.c.Prefix || !bytes.Equal(got.Manifest, tc.c.Manifest) || got.Kernel != tc.c.Kernel ||
				got.MaxIn != tc.c.MaxIn || got.Tmp != tc.c.Tmp || got.Out != tc.c.Out || got.Size != tc.c.Size {
				t.Fatalf("decoded %+v (%v), sent %+v", got, err, tc.c)
			}
		})
	}
}

// A control message the worker cannot read is an error it can answer
// with: which operation's fields are wrong, or what it got instead.
func TestControlRefused(t *testing.T) {
	for _, tc := range []struct {
		name string
		msg  []byte
		op   byte
		text string // "": ErrShape
	}{
		{"empty", nil, 0, "empty control message"},
		{"unknown", []byte("Z"), 0, `unknown control operation 'Z'`},
		{"the ready message", AppendReady(nil, Ready{}), 0, `unknown control operation 'R'`},
		{"a short slot", []byte{OpSlot, 1, 2}, OpSlot, ""},
		{"an old slot, no program", []byte{OpSlot, 2, 1, 0, 0, 0, 0, 0, 0}, OpSlot, ""},
		{"a long new instance", append(AppendControl(nil, Control{Op: OpNewInstance}), 0), OpNewInstance, ""},
		{"an old new instance, no program", []byte{OpNewInstance, 1, 2}, OpNewInstance, ""},
		{"a load with no program", []byte{OpLoad, 1}, OpLoad, ""},
		{"a load with no prefix length", []byte{OpLoad, 1, 0, 0, 0}, OpLoad, ""},
		{"a load whose prefix is cut", []byte{OpLoad, 1, 0, 0, 0, 5, 'a'}, OpLoad, ""},
		{"a load's prefix with a path", AppendControl(nil, Control{Op: OpLoad, Prefix: "../x"}), OpLoad, ""},
		{"a load's prefix with a NUL", AppendControl(nil, Control{Op: OpLoad, Prefix: "p\x00"}), OpLoad, ""},
		{"an entry with no program", []byte{OpEntry, 1}, OpEntry, ""},
		{"a long unload", append(AppendControl(nil, Control{Op: OpUnload}), 0), OpUnload, ""},
		{"a short unload", []byte{OpUnload, 1}, OpUnload, ""},
		{"a short slot drop", []byte{OpDropSlot, 1, 0, 0, 0, 9}, OpDropSlot, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := DecodeControl(tc.msg)
			switch {
			case c.Op != tc.op:
				t.Fatalf("op %q, want %q", c.Op, tc.op)
			case tc.text == "" && !errors.Is(err, ErrShape):
				t.Fatalf("%v, want ErrShape", err)
			case tc.text != "" && (err == nil || err.Error() != tc.text):
				t.Fatalf("%v, want %q", err, tc.text)
			}
		})
	}
}

// Every reply to a control message decodes to what was encoded, for the
// operation it answers.
func TestControlReplyRoundTrip(t *testing.T) {
	for _, tc := range []struct {
		name string
		op   byte
		r    Reply
	}{
		{"loaded", OpLoad, Reply{St: StOK}},
		{"unloaded", OpUnload, Reply{St: StOK}},
		{"unload refused", OpUnload, Reply{St: StFailed, Text: "unload: no program 3"}},
		{"bundle refused", OpLoad, Reply{St: StInvalid, Text: "k.so\x00no PLOVER_ENTRY"}},
		{"an entry", OpEntry, Reply{St: StOK, Index: 3}},
		{"no entry", OpEntry, Reply{St: StFailed, Index: -1, Text: "no such kernel"}},
		{"an instance on the host", OpNewInstance, Reply{St: StOK}},
		{"an instance pinned", OpNewInstance, Reply{St: StOK, Pin: Pin{State: PinDone}}},
		{"an instance not pinned", OpNewInstance, Reply{St: StOK, Pin: Pin{State: PinRefused, Why: "RLIMIT_MEMLOCK"}}},
		{"an instance faulted", OpNewInstance, Reply{St: StFault, Text: "illegal address"}},
		{"a slot", OpSlot, Reply{St: StOK, ID: 7, Pin: Pin{State: PinRefused, Why: "no"}}},
		{"no slot", OpSlot, Reply{St: StFailed, Text: "slot: map: ENOMEM"}},
		{"an unreadable message", 0, Reply{St: StFailed, Text: "empty control message"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := DecodeControlReply(tc.op, AppendControlReply(nil, tc.op, tc.r))
			if err != nil || got != tc.r {
				t.Fatalf("decoded %+v (%v), sent %+v", got, err, tc.r)
			}
		})
	}
}

// A worker's ready message says its pid and whether Landlock restricts
// it; one of another protocol says which.
func TestReady(t *testing.T) {
	for _, tc := range []struct {
		name    string
		msg     []byte
		want    Ready
		version int // -2: accepted; -3: not a ready message
	}{
		{"landlocked", AppendReady(nil, Ready{PID: 1234, Landlocked: true}), Ready{PID: 1234, Landlocked: true}, -2},
		{"filtered", AppendReady(nil, Ready{PID: 1234, Filtered: true}), Ready{PID: 1234, Filtered: true}, -2},
		{"both", AppendReady(nil, Ready{PID: 1234, Landlocked: true, Filtered: true}), Ready{PID: 1234, Landlocked: true, Filtered: true}, -2},
		{"not", AppendReady(nil, Ready{PID: 1}), Ready{PID: 1}, -2},
		{"a newer protocol", []byte{OpReady, 1, 0, 0, 0, 0, Protocol + 1}, Ready{}, int(Protocol) + 1},
		{"an older one", []byte{OpReady, 1, 0, 0, 0, 0}, Ready{}, -1},
		{"a longer one", append(AppendReady(nil, Ready{}), 0), Ready{}, -1},
		{"too short", []byte{OpReady, 1, 0}, Ready{}, -3},
		{"another message", []byte{OpLoad, 1, 0, 0, 0, 0, Protocol}, Ready{}, -3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := DecodeReady(tc.msg)
			var ve *VersionError
			switch {
			case tc.version == -2 && (err != nil || got != tc.want):
				t.Fatalf("%+v (%v), want %+v", got, err, tc.want)
			case tc.version == -3 && !errors.Is(err, ErrNotReady):
				t.Fatalf("%v, want ErrNotReady", err)
			case tc.version >= -1 && (!errors.As(err, &ve) || ve.Version != tc.version):
				t.Fatalf("%v, want protocol %d", err, tc.version)
			}
		})
	}
}

// The protocol's bytes, written out: a change to any of them is a change
// of the protocol, which bumps Protocol (and this test).
func TestBytesOfTheProtocol(t *testing.T) {
	run := device.Run{Input: make([]byte, 2), Output: make([]byte, 3), TmpLen: 4, ZeroOut: true, ChainKey: 5, Items: 6,
		Chain: []device.Step{{Entry: 7, Grid: 8, Block: 9}}}
	for _, tc := range []struct {
		name      string
		got, want []byte
	}{
		{"ready", AppendReady(nil, Ready{PID: 0x01020304, Landlocked: true}), []byte{'R', 4, 3, 2, 1, 1, 16}},
		{"load", AppendControl(nil, Control{Op: OpLoad, Prog: 0x0102, Prefix: "p", Manifest: []byte("{}")}), []byte("L\x02\x01\x00\x00\x01p{}")},
		{"entry", AppendControl(nil, Control{Op: OpEntry, Prog: 3, Kernel: "k"}), []byte("E\x03\x00\x00\x00k")},
		{"new instance", AppendControl(nil, Control{Op: OpNewInstance, Prog: 4, MaxIn: 1, Tmp: 2, Out: 3}),
			[]byte{'I', 4, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0, 3, 0, 0, 0, 0, 0, 0, 0}},
		{"unload", AppendControl(nil, Control{Op: OpUnload, Prog: 5}), []byte{'U', 5, 0, 0, 0}},
		{"freed", []byte{Freed}, []byte{0xf5}},
		{"slot", AppendControl(nil, Control{Op: OpSlot, Prog: 6, Size: 258}), []byte{'S', 6, 0, 0, 0, 2, 1, 0, 0, 0, 0, 0, 0}},
		{"drop a slot", AppendControl(nil, Control{Op: OpDropSlot, Prog: 7, Slot: 258}), []byte{'D', 7, 0, 0, 0, 2, 1, 0, 0}},
		{"slot dropped", AppendControlReply(nil, OpDropSlot, Reply{St: StOK}), []byte{0}},
		{"load reply", AppendControlReply(nil, OpLoad, Reply{St: StFailed, Text: "x"}), []byte{5, 'x'}},
		{"entry reply", AppendControlReply(nil, OpEntry, Reply{St: StOK, Index: 2}), []byte{0, 2, 0, 0, 0}},
		{"entry refused", AppendControlReply(nil, OpEntry, Reply{St: StFailed, Text: "x"}), []byte{5, 0, 0, 0, 0, 'x'}},
		{"instance reply", AppendControlReply(nil, OpNewInstance, Reply{St: StOK, Pin: Pin{State: PinRefused, Why: "w"}}), []byte{0, 2, 'w'}},
		{"instance refused", AppendControlReply(nil, OpNewInstance, Reply{St: StOOM, Text: "x"}), []byte{4, 'x'}},
		{"slot reply", AppendControlReply(nil, OpSlot, Reply{St: StOK, ID: 3, Pin: Pin{State: PinDone}}), []byte{0, 3, 0, 0, 0, 1}},
		{"slot refused", AppendControlReply(nil, OpSlot, Reply{St: StFailed, Text: "x"}), []byte{5, 0, 0, 0, 0, 'x'}},
		{"run", EncodeRun(make([]byte, 0, RunMsgMax), &run, true, 10, 11), []byte{
			2, 0, 0, 0, 3, 0, 0, 0, 4, 0, 0, 0, 0, 0, 0, 0, FlagZeroOut | FlagAlone, 5, 0, 0, 0, 0, 0, 0, 0, 1, 0,
			6, 0, 0, 0, 10, 0, 0, 0, 11, 0, 0, 0, 7, 0, 0, 0, 8, 0, 0, 0, 9, 0, 0, 0}},
		{"run reply", EncodeReply(make([]byte, 0, ReplyMax), StKernel, &device.Run{OutLen: 2, Timing: device.Timing{CopyIn: 1, Kernels: 3, CopyOut: 4, Copied: 5, Busy: 6}}, 7, 8, 9, "x"), []byte{
			2, 1, 0, 0, 0, 0, 0, 0, 0, 3, 0, 0, 0, 0, 0, 0, 0, 4, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0,
			5, 0, 0, 0, 0, 0, 0, 0, 6, 0, 0, 0, 0, 0, 0, 0, 7, 0, 0, 0, 8, 0, 0, 0, 0, 0, 0, 0, 9, 0, 0, 0, 0, 0, 0, 0, 'x'}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if !bytes.Equal(tc.got, tc.want) {
				t.Fatalf("% x, want % x", tc.got, tc.want)
			}
		})
	}
	// 11: the fatal mark on a pipe of its own (FatalFD); 12: checked
	// mode's report there too, a checked worker given the pipe; 13:
	// OpDropSlot; 14: a run's output at device.SlotOut of its input; 15:
	// a run reply's clock readings; 16: Freed on an instance's channel.
	if Protocol != 16 {
		t.Fatalf("protocol %d: write its bytes out here", Protocol)
	}
}

// A tenant's worker's fatal-signal marks name the signal and the program,
// each a line of its own on the pipe; the last whole one counts. Anything
// else is no mark: a line cut short, or a mark inside another line.
func TestParseFatal(t *testing.T) {
	for _, tc := range []struct {
		name string
		b    string
		sig  int
		prog uint32
		ok   bool
	}{
		{"one", FatalMark + "11 in program 3\n", 11, 3, true},
		{"the largest id", FatalMark + "6 in program 4294967295\n", 6, 1<<32 - 1, true},
		{"the last of two", FatalMark + "7 in program 2\n" + FatalMark + "11 in program 3\n", 11, 3, true},
		{"the last whole one", FatalMark + "7 in program 2\n" + FatalMark + "11 in progr", 7, 2, true},
		{"after other bytes", "noise\n" + FatalMark + "11 in program 3\n", 11, 3, true},
		{"before other bytes", FatalMark + "11 in program 3\nnoise\n", 11, 3, true},
		{"inside a line", "computing... " + FatalMark + "11 in program 3\n", 0, 0, false},
		{"no line end", FatalMark + "11 in program 3", 0, 0, false},
		{"an id too large", FatalMark + "6 in program 4294967296\n", 0, 0, false},
		{"no signal", FatalMark + "x in program 3\n", 0, 0, false},
		{"no program", FatalMark + "11\n", 0, 0, false},
		{"more after", FatalMark + "11 in program 3 and more\n", 0, 0, false},
		{"nothing", "", 0, 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sig, prog, ok := ParseFatal([]byte(tc.b))
			if sig != tc.sig || prog != tc.prog || ok != tc.ok {
				t.Fatalf("%d, %d, %v; want %d, %d, %v", sig, prog, ok, tc.sig, tc.prog, tc.ok)
			}
		})
	}
}

// Checked mode's report is the last whole line its mark leads on the
// worker's pipe, the mark cut off, whatever else the pipe holds (a fatal
// mark before it, in a tenant's worker).
func TestParseFault(t *testing.T) {
	for _, tc := range []struct {
		name, b, report string
		ok              bool
	}{
		{"after the fatal mark", FatalMark + "11 in program 3\n" + device.FaultMark + "entry e wrote past the end of out\n", "entry e wrote past the end of out", true},
		{"the last of two", device.FaultMark + "one\n" + device.FaultMark + "two\n", "two", true},
		{"the last whole one", device.FaultMark + "one\n" + device.FaultMark + "tw", "one", true},
		{"inside a line", "computing... " + device.FaultMark + "one\n", "", false},
		{"the fatal mark alone", FatalMark + "11 in program 3\n", "", false},
		{"nothing", "", "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if report, ok := ParseFault([]byte(tc.b)); report != tc.report || ok != tc.ok {
				t.Fatalf("%q, %v; want %q, %v", report, ok, tc.report, tc.ok)
			}
		})
	}
}

// What a worker sends the server is read by decoders that take hostile
// bytes (bundle code can write to its channels): they answer an error,
// never a panic, and what they accept is read within the message.
func FuzzWorkerMessages(f *testing.F) {
	f.Add(AppendReady(nil, Ready{PID: 1, Landlocked: true}))
	f.Add(AppendControlReply(nil, OpSlot, Reply{St: StOK, ID: 3, Pin: Pin{State: PinRefused, Why: "w"}}))
	f.Add(AppendControlReply(nil, OpEntry, Reply{St: StFailed, Text: "x"}))
	f.Add(AppendControlReply(nil, OpDropSlot, Reply{St: StFailed, Text: "x"}))
	f.Add(EncodeReply(make([]byte, 0, ReplyMax), StOK, &device.Run{OutLen: 1}, 1, 2, 3, ""))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		DecodeReady(b)
		for _, op := range []byte{OpLoad, OpEntry, OpNewInstance, OpSlot, OpDropSlot, OpUnload, 0} {
			if r, err := DecodeControlReply(op, b); err == nil && len(r.Text)+len(r.Pin.Why) >= len(b) {
				t.Fatalf("op %q: a reply of %d bytes read as %+v", op, len(b), r)
			}
		}
		ReplyHead(b)
		// The fatal mark pipe's bytes, the worker's to write, are read in
		// the goroutine that waits for its exit (no recovery there).
		ParseFatal(b)
		ParseFault(b)
		// A load's failure, made in the goroutine that waits for the
		// load (a request's, which may have gone).
		for _, st := range b[:min(len(b), 1)] {
			ErrorOf(st, string(b[1:]))
		}
		var r device.Run
		if _, _, text, err := DecodeReply(b, &r, 1); err == nil && len(text) > len(b)-ReplyHeader {
			t.Fatalf("a reply of %d bytes with a message of %d", len(b), len(text))
		}
		// A reply's clock readings are the worker's word: the waits they
		// give stay within the run's wall time whatever they say.
		const wall = time.Millisecond
		for _, at := range [][2]int64{{0, 0}, {1 << 40, 1<<40 + 5e5}, {math.MaxInt64 - 1, math.MaxInt64}, {math.MinInt64, 0}} {
			if off, back := Handover(b, at[0], at[1], wall); off < 0 || off > wall || back < 0 || back > wall {
				t.Fatalf("sent %d, got %d: handoff %v, handback %v; want each within 0..%v", at[0], at[1], off, back, wall)
			}
		}
	})
}
