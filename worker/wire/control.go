package wire

import (
	"errors"
	"fmt"
	"strings"
)

// The control messages, server → worker on the control channel, one call
// at a time, each answered in order by a Reply: [op] then the
// operation's fields. A worker holds programs by the ids the server gives
// them in OpLoad (a function-scope worker one, a tenant's several:
// Options.TenantScope), and the calls on a program name it; one format
// for both scopes.
//
//	OpLoad         [u32 id][u8 n][file name prefix, n bytes][manifest JSON]
//	OpEntry        [u32 id][kernel name]
//	OpNewInstance  [u32 id][i64 max_in][i64 tmp][i64 out]  fds: [memfd, instance socket]
//	OpSlot         [u32 id][i64 size]                      fds: [memfd]: a pool slot of the program, registered with the device
//	OpUnload       [u32 id]: closes the program (its instances' channels closed first)
//	OpDropSlot     [u32 id][u32 slot]: unregisters and unmaps one of the program's pool slots, one no run uses
//
// A program's pool slots are its own: unloaded, the worker unmaps them
// (and unregisters them from its device) once its last instance is gone,
// so that a tenant's worker that outlives its programs does not keep them.
//
// OpLoad's prefix leads the names under which the server put the
// program's files in the worker's stage ("": their own names): no
// slashes, so every program's files are in the stage itself.
const (
	ctlOp         = 0         // u8: the operation
	ctlProg       = ctlOp + 1 // u32: OpLoad's, OpEntry's, OpNewInstance's, OpUnload's program id
	ctlBody       = ctlProg + 4
	loadPrefixLen = ctlBody           // u8
	loadPrefix    = loadPrefixLen + 1 // then the manifest
	instMaxIn     = ctlBody           // i64
	instTmp       = instMaxIn + 8
	instOut       = instTmp + 8
	instLen       = instOut + 8 // OpNewInstance's length
	unloadLen     = ctlBody
	slotSize      = ctlBody // i64
	slotMsgLen    = slotSize + 8
	dropSlotID    = ctlBody // u32
	dropMsgLen    = dropSlotID + 4
)

// Control is a control message's operation and its fields.
type Control struct {
	Op              byte
	Prog            uint32 // OpLoad, OpEntry, OpNewInstance, OpUnload, OpSlot, OpDropSlot: the program's id
	Prefix          string // OpLoad: put before the names of the program's files in the stage ("": none)
	Manifest        []byte // OpLoad: the manifest, JSON (decoded, it aliases the message)
	Kernel          string // OpEntry
	MaxIn, Tmp, Out int64  // OpNewInstance: the instance's sizes
	Size            int64  // OpSlot: the slot's bytes
	Slot            uint32 // OpDropSlot: the slot's id (OpSlot's reply's)
}

// AppendControl appends c's message to b. A Prefix over 255 bytes is cut
// there (the server's names are short).
func AppendControl(b []byte, c Control) []byte {
	b = append(b, c.Op)
	switch c.Op {
	case OpLoad, OpEntry, OpNewInstance, OpUnload, OpSlot, OpDropSlot:
		b = le.AppendUint32(b, c.Prog)
	}
	switch c.Op {
	case OpLoad:
		pre := c.Prefix[:min(len(c.Prefix), 255)]
		b = append(append(b, byte(len(pre))), pre...)
		b = append(b, c.Manifest...)
	case OpEntry:
		b = append(b, c.Kernel...)
	case OpNewInstance:
		b = le.AppendUint64(b, uint64(c.MaxIn))
		b = le.AppendUint64(b, uint64(c.Tmp))
		b = le.AppendUint64(b, uint64(c.Out))
	case OpSlot:
		b = le.AppendUint64(b, uint64(c.Size))
	case OpDropSlot:
		b = le.AppendUint32(b, c.Slot)
	}
	return b
}

// ErrShape is a control message of a known operation whose fields do not
// fit it: DecodeControl returns it with the message's Op set.
var ErrShape = errors.New("control message of the wrong length")

// DecodeControl reads a control message. An empty message and an unknown
// operation are errors whose text the worker answers with (Op 0); an
// operation's fields of the wrong length (or a subdirectory that is not
// one plain name) are ErrShape, with Op set, so that the worker says what
// that operation wants.
func DecodeControl(b []byte) (Control, error) {
	if len(b) == 0 {
		return Control{}, errors.New("empty control message")
	}
	c := Control{Op: b[ctlOp]}
	switch c.Op {
	case OpLoad, OpEntry, OpNewInstance, OpUnload, OpSlot, OpDropSlot:
		if len(b) < ctlBody {
			return c, ErrShape
		}
		c.Prog = le.Uint32(b[ctlProg:])
	}
	switch c.Op {
	case OpLoad:
		if len(b) < loadPrefix || len(b) < loadPrefix+int(b[loadPrefixLen]) {
			return c, ErrShape
		}
		c.Prefix = string(b[loadPrefix : loadPrefix+int(b[loadPrefixLen])])
		if strings.ContainsAny(c.Prefix, "/\x00") {
			return c, ErrShape
		}
		c.Manifest = b[loadPrefix+int(b[loadPrefixLen]):]
	case OpEntry:
		c.Kernel = string(b[ctlBody:])
	case OpNewInstance:
		if len(b) != instLen {
			return c, ErrShape
		}
		c.MaxIn, c.Tmp, c.Out = int64(le.Uint64(b[instMaxIn:])), int64(le.Uint64(b[instTmp:])), int64(le.Uint64(b[instOut:]))
	case OpUnload:
		if len(b) != unloadLen {
			return c, ErrShape
		}
	case OpSlot:
		if len(b) != slotMsgLen {
			return c, ErrShape
		}
		c.Size = int64(le.Uint64(b[slotSize:]))
	case OpDropSlot:
		if len(b) != dropMsgLen {
			return c, ErrShape
		}
		c.Slot = le.Uint32(b[dropSlotID:])
	default:
		return Control{}, fmt.Errorf("unknown control operation %q", c.Op)
	}
	return c, nil
}

// Pin is a slot's pin (PinNone, PinDone, PinRefused) and, refused, the
// device's reason.
type Pin struct {
	State byte
	Why   string
}

// The replies to control messages, worker → server: [status] then the
// operation's fields.
//
//	OpLoad         [st][text]
//	OpUnload       [st][text]
//	OpDropSlot     [st][text]
//	OpEntry        [st][i32 index][text]
//	OpNewInstance  [StOK][pin][why], or [st][text]
//	OpSlot         [StOK][u32 id][pin][why], or [st][u32 0][text]
//	anything else  [st][text] (a message the worker could not read)
const (
	repStatus  = 0             // u8
	repText    = repStatus + 1 // OpLoad's, OpNewInstance's failure's text; OpNewInstance's pin
	entryIndex = repText       // i32
	entryText  = entryIndex + 4
	slotID     = repText    // u32
	slotRest   = slotID + 4 // the pin, or a failure's text
	pinState   = 0          // u8, from where the pin starts
	pinWhy     = pinState + 1
)

// Reply is a control call's reply: its status and the fields of the
// operation it answers.
type Reply struct {
	St    byte
	Text  string // what went wrong (none with StOK's pin)
	Index int32  // OpEntry: the kernel's index
	ID    uint32 // OpSlot: the slot's id, which run messages name
	Pin   Pin    // OpNewInstance and OpSlot, with StOK
}

// AppendControlReply appends the reply r to an op message to b.
func AppendControlReply(b []byte, op byte, r Reply) []byte {
	b = append(b, r.St)
	switch {
	case op == OpEntry:
		b = le.AppendUint32(b, uint32(r.Index))
	case op == OpSlot:
		b = le.AppendUint32(b, r.ID)
	}
	if r.St == StOK && (op == OpNewInstance || op == OpSlot) {
		return append(append(b, r.Pin.State), r.Pin.Why...)
	}
	return append(b, r.Text...)
}

// DecodeControlReply reads the reply to an op message. An empty reply, or
// one too short for op's fields, is an error. A reply with no pin where
// one belongs, or a pin of no known state, reads as PinNone.
func DecodeControlReply(op byte, b []byte) (Reply, error) {
	if len(b) == 0 {
		return Reply{}, errors.New("empty control reply")
	}
	r := Reply{St: b[repStatus]}
	switch op {
	case OpEntry:
		if len(b) < entryText {
			return Reply{}, fmt.Errorf("entry reply of %d bytes", len(b))
		}
		r.Index, r.Text = int32(le.Uint32(b[entryIndex:])), string(b[entryText:])
	case OpSlot:
		if len(b) < slotRest {
			return Reply{}, fmt.Errorf("slot reply of %d bytes", len(b))
		}
		r.ID = le.Uint32(b[slotID:])
		if r.St == StOK {
			r.Pin = pinOf(b[slotRest:])
		} else {
			r.Text = string(b[slotRest:])
		}
	case OpNewInstance:
		if r.St == StOK {
			r.Pin = pinOf(b[repText:])
		} else {
			r.Text = string(b[repText:])
		}
	default:
		r.Text = string(b[repText:])
	}
	return r, nil
}

// pinOf reads a pin from its first byte.
func pinOf(b []byte) Pin {
	if len(b) <= pinState || b[pinState] > PinRefused {
		return Pin{}
	}
	return Pin{State: b[pinState], Why: string(b[pinWhy:])}
}

// The ready message, worker → server once its device is open, the first
// on the control channel: [OpReady][u32 pid][flags][Protocol].
const (
	readyOp       = 0
	readyPID      = readyOp + 1  // u32: the worker's pid, in its own namespace
	readyFlags    = readyPID + 4 // readyLandlocked | readyFiltered
	readyProtocol = readyFlags + 1
	ReadyLen      = readyProtocol + 1
)

// Ready is what a worker's ready message says.
type Ready struct {
	PID        uint32
	Landlocked bool // Landlock restricts it (not every kernel has Landlock)
	Filtered   bool // the reach filter holds (contain.RestrictReach; not every kernel has seccomp filters)
}

// The ready message's flags byte.
const (
	readyLandlocked byte = 1 << iota
	readyFiltered
)

// AppendReady appends r's ready message, of this Protocol, to b.
func AppendReady(b []byte, r Ready) []byte {
	b = le.AppendUint32(append(b, OpReady), r.PID)
	flags := byte(0)
	if r.Landlocked {
		flags |= readyLandlocked
	}
	if r.Filtered {
		flags |= readyFiltered
	}
	return append(b, flags, Protocol)
}

// ErrNotReady is a first message that is not a ready message at all.
var ErrNotReady = errors.New("not a ready message")

// VersionError is a ready message of another protocol: a worker binary of
// another build.
type VersionError struct {
	Version int // -1: a message of another length (an older protocol's)
}

func (e *VersionError) Error() string {
	return fmt.Sprintf("worker protocol %s, not %d", e.Theirs(), Protocol)
}

// Theirs names the worker's protocol: its number, or "an older one".
func (e *VersionError) Theirs() string {
	if e.Version < 0 {
		return "an older one"
	}
	return fmt.Sprint(e.Version)
}

// DecodeReady reads a worker's ready message: ErrNotReady for something
// else, a *VersionError for one of another protocol.
func DecodeReady(b []byte) (Ready, error) {
	switch {
	case len(b) < readyProtocol || b[readyOp] != OpReady:
		return Ready{}, ErrNotReady
	case len(b) != ReadyLen:
		return Ready{}, &VersionError{Version: -1}
	case b[readyProtocol] != Protocol:
		return Ready{}, &VersionError{Version: int(b[readyProtocol])}
	}
	f := b[readyFlags]
	return Ready{PID: le.Uint32(b[readyPID:]), Landlocked: f&readyLandlocked != 0, Filtered: f&readyFiltered != 0}, nil
}
