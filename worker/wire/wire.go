// Package wire is the protocol between a Plover server and its worker
// processes, in one place for both sides (package worker, the server's;
// package worker/inside, the worker's): the messages, their encodings, the
// protocol version a worker must speak, and the polling receive both sides
// use on a short run.
//
// Two kinds of channel join a server and a worker, both SOCK_SEQPACKET so
// every message arrives whole:
//
//   - the control channel (the worker's fd 3): load, entry, new instance,
//     one call at a time, answered in order;
//   - one channel per instance, with a shared memory slot (a memfd mapped by
//     both) holding the request's input at [0, max_input) and its output at
//     [max_input, max_input+out). A request is one small message each way;
//     the bytes never travel through the socket.
//
// Beside each instance's own slot a worker holds a pool of slots of the
// same layout (OpSlot), which the server lends before a request's body is
// read, so that the body lands where the worker's device reads it: a run
// message names the slot its request is in (0: the instance's own), and the
// worker's device works on it in place (the host device runs the chain on
// it; a CUDA device copies straight between it, registered once, and the
// GPU).
//
// Descriptors (the bundle directory, memfds, instance sockets) go to the
// worker with SCM_RIGHTS. Integers are little-endian.
package wire

import (
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/device"
	"github.com/plover-run/plover/loader"
)

// A worker's descriptors (exec.Cmd.ExtraFiles): the control channel, and
// its stage, the directory the server puts its bundle's files in.
const (
	CtlFD   = 3
	StageFD = 4
)

// Exit statuses a worker ends with on its own.
const (
	ExitChannel = 70 // a channel to the server broke
	ExitFault   = 71 // the device faulted (sticky CUDA error)
)

// Control operations.
const (
	OpReady       byte = 'R' // worker → server once its device is open: [op][i32 pid][landlocked][Protocol]
	OpLoad        byte = 'L' // [op][manifest JSON], fds: [bundle dir]
	OpEntry       byte = 'E' // [op][kernel name] → [i32 index]
	OpNewInstance byte = 'I' // [op][i64 max_in][i64 tmp][i64 out], fds: [memfd, instance socket] → [pin]
	OpSlot        byte = 'S' // [op][i64 size], fds: [memfd] → [u32 id][pin]: a pool slot, registered with the device
)

// A slot's pin: whether the worker's device pinned the memory in place
// (CUDA: cuMemHostRegister), the last fields of the replies to OpSlot and
// OpNewInstance, [state][why the device refused].
const (
	PinNone    byte = 0 // the device works on plain memory (the host): nothing to pin
	PinDone    byte = 1 // pinned: runs on it copy straight between it and the device
	PinRefused byte = 2 // the device refused it: runs on it are staged (copied on the host)
)

// AppendPin appends a slot's pin to a reply.
func AppendPin(b []byte, state byte, why string) []byte { return append(append(b, state), why...) }

// PinOf reads the pin a reply holds from at (false when it holds none).
func PinOf(rep []byte, at int) (state byte, why string, ok bool) {
	if len(rep) <= at || rep[at] > PinRefused {
		return 0, "", false
	}
	return rep[at], string(rep[at+1:]), true
}

// Protocol is the version of this file's messages, sent in OpReady: a
// worker binary from another build (plover-worker beside a newer plover)
// is refused at its start instead of misreading a run. Bump it with any
// change to a message.
const Protocol byte = 7

// ReadyLen is the length of the OpReady message.
const ReadyLen = 1 + 4 + 1 + 1

// Reply status: the first byte of every reply.
const (
	StOK        byte = 0
	StInvalid   byte = 1 // the bundle is refused (a loader.Error): [path \0 reason]
	StKernel    byte = 2 // the chain reported a failure: [message]
	StFault     byte = 3 // the device faulted for good: the worker must go: [message]
	StOOM       byte = 4 // out of device memory: [message]
	StFailed    byte = 5 // anything else: [message]
	StBadRunMsg byte = 6 // a malformed run message (a server bug): [message]
	StRejected  byte = 7 // the chain refused its input (plover_reject): [message]
)

// Run message: header then steps.
const (
	RunHeader = 4 + 4 + 8 + 1 + 8 + 2 + 4 + 4 + 4 // in, out, tmp, zero flags, chain_key, nsteps, items, slot, seq
	StepBytes = 12                                // entry, grid, block
	RunMsgMax = RunHeader + abi.MaxChainLength*StepBytes
	// Run reply: status, copy-in, kernels, copy-out ns, the output's length
	// (ABI 2 entries may lower it), the payload bytes the worker copied on
	// the host, the device time the run used (ns), the run's seq, then a
	// message.
	ReplyHeader = 1 + 8 + 8 + 8 + 8 + 8 + 8 + 4
	// Where the sequence number sits: the last field of each header.
	RunSeqAt   = RunHeader - 4
	ReplySeqAt = ReplyHeader - 4
	ReplyMax   = ReplyHeader + 4096
	CtlMax     = 1 << 20 // a manifest, with room to spare
)

var LE = binary.LittleEndian

// The run message's flags.
const (
	FlagZeroTmp = 1 << iota
	FlagZeroOut
	// FlagAlone: no other run was in flight on the device when this one
	// was sent; the worker may poll for the instance's next request.
	FlagAlone
)

// Every run message carries its instance's next sequence number and the
// reply echoes it. Bundle code runs in the worker and can write to the
// instance's socket: a message it sends there, or a reply left over from
// an earlier run, would otherwise be read as this run's reply, and the
// next request answered with the one before's output. A reply that does not
// echo the run's number ends the worker instead (instance.Run).

// EncodeRun writes r's run message into b (of RunMsgMax capacity): its
// request is in slot (0: the instance's own, else a pool slot's id).
func EncodeRun(b []byte, r *device.Run, alone bool, slot, seq uint32) []byte {
	b = b[:RunHeader]
	LE.PutUint32(b[0:], uint32(len(r.Input)))
	LE.PutUint32(b[4:], uint32(len(r.Output)))
	LE.PutUint64(b[8:], uint64(r.TmpLen))
	b[16] = 0
	if r.ZeroTmp {
		b[16] |= FlagZeroTmp
	}
	if r.ZeroOut {
		b[16] |= FlagZeroOut
	}
	if alone {
		b[16] |= FlagAlone
	}
	LE.PutUint64(b[17:], r.ChainKey)
	LE.PutUint16(b[25:], uint16(len(r.Chain)))
	LE.PutUint32(b[27:], r.Items)
	LE.PutUint32(b[31:], slot)
	LE.PutUint32(b[RunSeqAt:], seq)
	for _, s := range r.Chain {
		b = LE.AppendUint32(b, uint32(s.Entry))
		b = LE.AppendUint32(b, uint32(s.Grid))
		b = LE.AppendUint32(b, uint32(s.Block))
	}
	return b
}

// SentAlone reports the run message's FlagAlone flag.
func SentAlone(b []byte) bool { return len(b) > 16 && b[16]&FlagAlone != 0 }

// RunSeq is a run message's sequence number (0 for a message too short to
// hold one: DecodeRun refuses it).
func RunSeq(b []byte) uint32 {
	if len(b) < RunHeader {
		return 0
	}
	return LE.Uint32(b[RunSeqAt:])
}

// RunSlot is the slot a run message names (0: the instance's own).
func RunSlot(b []byte) uint32 {
	if len(b) < RunHeader {
		return 0
	}
	return LE.Uint32(b[31:])
}

// DecodeRun fills r from a run message, slicing input and output out of
// slot (input at 0, output at maxIn): the slot the message names, which
// the caller looked up (RunSlot).
func DecodeRun(b []byte, r *device.Run, steps []device.Step, slot []byte, maxIn, out int64) error {
	if len(b) < RunHeader {
		return fmt.Errorf("run message of %d bytes", len(b))
	}
	in, outLen := int64(LE.Uint32(b[0:])), int64(LE.Uint32(b[4:]))
	n := int(LE.Uint16(b[25:]))
	if in > maxIn || outLen > out || maxIn+outLen > int64(len(slot)) || n > len(steps) || len(b) != RunHeader+n*StepBytes {
		return fmt.Errorf("run message out of bounds: input %d/%d, output %d/%d in a slot of %d, %d steps in %d bytes", in, maxIn, outLen, out, len(slot), n, len(b))
	}
	r.Input = slot[:in:in]
	r.Output = slot[maxIn : maxIn+outLen : maxIn+outLen]
	r.TmpLen = int64(LE.Uint64(b[8:]))
	r.ZeroTmp = b[16]&FlagZeroTmp != 0
	r.ZeroOut = b[16]&FlagZeroOut != 0
	r.ChainKey = LE.Uint64(b[17:])
	r.Items = LE.Uint32(b[27:])
	for k := 0; k < n; k++ {
		s := b[RunHeader+k*StepBytes:]
		steps[k] = device.Step{Entry: int32(LE.Uint32(s[0:])), Grid: int32(LE.Uint32(s[4:])), Block: int32(LE.Uint32(s[8:]))}
	}
	r.Chain = steps[:n]
	return nil
}

// Reply fields after the status byte.
const (
	replyCopyIn  = 1
	replyKernels = 9
	replyCopyOut = 17
	replyOutLen  = 25
	replyCopied  = 33
	replyBusy    = 41
)

// EncodeReply writes a run's reply into b (of ReplyMax capacity).
func EncodeReply(b []byte, st byte, r *device.Run, seq uint32, text string) []byte {
	b = b[:ReplyHeader]
	b[0] = st
	LE.PutUint64(b[replyCopyIn:], uint64(r.Timing.CopyIn))
	LE.PutUint64(b[replyKernels:], uint64(r.Timing.Kernels))
	LE.PutUint64(b[replyCopyOut:], uint64(r.Timing.CopyOut))
	LE.PutUint64(b[replyOutLen:], uint64(r.OutLen))
	LE.PutUint64(b[replyCopied:], uint64(r.Timing.Copied))
	LE.PutUint64(b[replyBusy:], uint64(r.Timing.Busy))
	LE.PutUint32(b[ReplySeqAt:], seq)
	if len(text) > ReplyMax-ReplyHeader {
		text = text[:ReplyMax-ReplyHeader]
	}
	return append(b, text...)
}

// DecodeReply reads a reply's timing into r and returns the output length
// the worker reported (to be checked against the run's output) and the
// message. b is at least ReplyHeader bytes.
func DecodeReply(b []byte, r *device.Run) (outLen uint64, text string) {
	r.Timing = device.Timing{
		CopyIn:  time.Duration(LE.Uint64(b[replyCopyIn:])),
		Kernels: time.Duration(LE.Uint64(b[replyKernels:])),
		CopyOut: time.Duration(LE.Uint64(b[replyCopyOut:])),
		Copied:  int64(LE.Uint64(b[replyCopied:])),
		Busy:    time.Duration(LE.Uint64(b[replyBusy:])),
	}
	return LE.Uint64(b[replyOutLen:]), string(b[ReplyHeader:])
}

// StatusOf classifies an error from the worker's device for the wire.
func StatusOf(err error) (byte, string) {
	var lerr *loader.Error
	var ke *device.KernelError
	switch {
	case err == nil:
		return StOK, ""
	case errors.As(err, &lerr):
		return StInvalid, lerr.Path + "\x00" + lerr.Reason
	case errors.Is(err, device.ErrUnhealthy):
		return StFault, err.Error()
	case errors.As(err, &ke) && ke.Rejected:
		return StRejected, ke.Msg
	case errors.As(err, &ke):
		return StKernel, ke.Msg
	case errors.Is(err, device.ErrOutOfMemory):
		return StOOM, err.Error()
	}
	return StFailed, err.Error()
}

// ErrorOf turns a reply status back into the error the device would have
// returned in process. StFault is handled by the caller (the worker goes).
func ErrorOf(st byte, msg string) error {
	switch st {
	case StOK:
		return nil
	case StInvalid:
		path, reason, _ := CutNul(msg)
		return &loader.Error{Path: path, Reason: reason}
	case StKernel:
		return &device.KernelError{Msg: msg}
	case StRejected:
		return &device.KernelError{Msg: msg, Rejected: true}
	case StOOM:
		return fmt.Errorf("%s: %w", msg, device.ErrOutOfMemory)
	}
	return errors.New(msg)
}

func CutNul(s string) (string, string, bool) {
	for i := 0; i < len(s); i++ {
		if s[i] == 0 {
			return s[:i], s[i+1:], true
		}
	}
	return "", s, false
}
