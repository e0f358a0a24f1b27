package wire

import (
	"fmt"
	"time"
	_ "unsafe" // go:linkname

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/device"
)

// The run message, server → worker on an instance's channel: a header,
// then one step per kernel of the chain.
const (
	runIn       = 0                  // u32: the input's bytes, at the slot's start
	runOut      = runIn + 4          // u32: the output's bytes, at max_input
	runTmp      = runOut + 4         // i64: the scratch the chain may use
	runFlags    = runTmp + 8         // u8: FlagZeroTmp, FlagZeroOut, FlagAlone
	runChainKey = runFlags + 1       // u64: names the chain (a CUDA graph's cache key)
	runSteps    = runChainKey + 8    // u16: how many steps follow the header
	runItems    = runSteps + 2       // u32: a batch's requests (0: not a batch)
	runSlot     = runItems + 4       // u32: the slot the request is in (0: the instance's own)
	runSeq      = runSlot + 4        // u32: the run's sequence number, which the reply echoes
	RunHeader   = runSeq + 4         // the header's length
	stepEntry   = 0                  // i32: the kernel's index (OpEntry)
	stepGrid    = stepEntry + 4      // i32
	stepBlock   = stepGrid + 4       // i32
	StepBytes   = stepBlock + 4      // one step's length
	MaxSteps    = abi.MaxChainLength // the most steps a run message holds
	RunMsgMax   = RunHeader + MaxSteps*StepBytes
)

// The run's reply, worker → server on the same channel: a header, then a
// message (a failure's).
const (
	replyStatus  = 0                // u8: StOK, ...
	replyCopyIn  = replyStatus + 1  // i64 ns: copying the input in
	replyKernels = replyCopyIn + 8  // i64 ns: the kernels
	replyCopyOut = replyKernels + 8 // i64 ns: copying the output out
	replyOutLen  = replyCopyOut + 8 // u64: the output's length (ABI 2 entries may lower it)
	replyCopied  = replyOutLen + 8  // i64: the payload bytes the worker copied on the host
	replyBusy    = replyCopied + 8  // i64 ns: the device time the run used
	replySeq     = replyBusy + 8    // u32: the run's sequence number, echoed
	replyGot     = replySeq + 4     // i64 ns, CLOCK_MONOTONIC: when the worker read the run's message
	replySent    = replyGot + 8     // i64 ns, CLOCK_MONOTONIC: when it wrote this reply
	ReplyHeader  = replySent + 8    // the header's length; the message follows
	ReplyMax     = ReplyHeader + 4096
)

// Freed is what a worker sends on an instance's channel once the server
// has ended it and the instance is freed (its plover_instance_fini run,
// its buffers freed), before it lets go of the instance's program, which
// the last instance may close, and then closes the channel: the server
// counts the instance's device memory back at Freed and its program's at
// the close (worker/release.go). Shorter than any reply.
const Freed byte = 0xF5

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
	le.PutUint32(b[runIn:], uint32(len(r.Input)))
	le.PutUint32(b[runOut:], uint32(len(r.Output)))
	le.PutUint64(b[runTmp:], uint64(r.TmpLen))
	b[runFlags] = 0
	if r.ZeroTmp {
		b[runFlags] |= FlagZeroTmp
	}
	if r.ZeroOut {
		b[runFlags] |= FlagZeroOut
	}
	if alone {
		b[runFlags] |= FlagAlone
	}
	le.PutUint64(b[runChainKey:], r.ChainKey)
	le.PutUint16(b[runSteps:], uint16(len(r.Chain)))
	le.PutUint32(b[runItems:], r.Items)
	le.PutUint32(b[runSlot:], slot)
	le.PutUint32(b[runSeq:], seq)
	for _, s := range r.Chain { // appended in the order of stepEntry, stepGrid, stepBlock
		b = le.AppendUint32(b, uint32(s.Entry))
		b = le.AppendUint32(b, uint32(s.Grid))
		b = le.AppendUint32(b, uint32(s.Block))
	}
	return b
}

// SentAlone reports the run message's FlagAlone flag.
func SentAlone(b []byte) bool { return len(b) > runFlags && b[runFlags]&FlagAlone != 0 }

// RunSeq is a run message's sequence number (0 for a message too short to
// hold one: DecodeRun refuses it).
func RunSeq(b []byte) uint32 {
	if len(b) < RunHeader {
		return 0
	}
	return le.Uint32(b[runSeq:])
}

// RunSlot is the slot a run message names (0: the instance's own).
func RunSlot(b []byte) uint32 {
	if len(b) < RunHeader {
		return 0
	}
	return le.Uint32(b[runSlot:])
}

// DecodeRun fills r from a run message, slicing input and output out of
// slot (input at 0, output at device.SlotOut(maxIn)): the slot the message names, which
// the caller looked up (RunSlot).
func DecodeRun(b []byte, r *device.Run, steps []device.Step, slot []byte, maxIn, out int64) error {
	if len(b) < RunHeader {
		return fmt.Errorf("run message of %d bytes", len(b))
	}
	in, outLen := int64(le.Uint32(b[runIn:])), int64(le.Uint32(b[runOut:]))
	n := int(le.Uint16(b[runSteps:]))
	at := device.SlotOut(maxIn)
	if in > maxIn || outLen > out || at+outLen > int64(len(slot)) || n > len(steps) || len(b) != RunHeader+n*StepBytes {
		return fmt.Errorf("run message out of bounds: input %d/%d, output %d/%d in a slot of %d, %d steps in %d bytes", in, maxIn, outLen, out, len(slot), n, len(b))
	}
	r.Input = slot[:in:in]
	r.Output = slot[at : at+outLen : at+outLen]
	r.TmpLen = int64(le.Uint64(b[runTmp:]))
	r.ZeroTmp = b[runFlags]&FlagZeroTmp != 0
	r.ZeroOut = b[runFlags]&FlagZeroOut != 0
	r.ChainKey = le.Uint64(b[runChainKey:])
	r.Items = le.Uint32(b[runItems:])
	for k := 0; k < n; k++ {
		s := b[RunHeader+k*StepBytes:]
		steps[k] = device.Step{Entry: int32(le.Uint32(s[stepEntry:])), Grid: int32(le.Uint32(s[stepGrid:])), Block: int32(le.Uint32(s[stepBlock:]))}
	}
	r.Chain = steps[:n]
	return nil
}

// EncodeReply writes a run's reply into b (of ReplyMax capacity): got is
// when the worker read the run's message and sent when it sends the reply
// (Mono readings).
func EncodeReply(b []byte, st byte, r *device.Run, seq uint32, got, sent int64, text string) []byte {
	b = b[:ReplyHeader]
	b[replyStatus] = st
	le.PutUint64(b[replyCopyIn:], uint64(r.Timing.CopyIn))
	le.PutUint64(b[replyKernels:], uint64(r.Timing.Kernels))
	le.PutUint64(b[replyCopyOut:], uint64(r.Timing.CopyOut))
	le.PutUint64(b[replyOutLen:], uint64(r.OutLen))
	le.PutUint64(b[replyCopied:], uint64(r.Timing.Copied))
	le.PutUint64(b[replyBusy:], uint64(r.Timing.Busy))
	le.PutUint32(b[replySeq:], seq)
	le.PutUint64(b[replyGot:], uint64(got))
	le.PutUint64(b[replySent:], uint64(sent))
	if len(text) > ReplyMax-ReplyHeader {
		text = text[:ReplyMax-ReplyHeader]
	}
	return append(b, text...)
}

// Mono is the system's CLOCK_MONOTONIC in nanoseconds: one clock for the
// server and its workers, where Go's monotonic readings count from each
// process's start. The runtime's own reading goes through the vDSO;
// unix.ClockGettime would be a system call on every run, twice a side.
func Mono() int64 { return nanotime() }

//go:linkname nanotime runtime.nanotime
func nanotime() int64

// Handover is how long a run's message waited for its worker to read it
// (handoff: from sent, the server's Mono before its send) and the
// reply for the server to read it (handback: until got, the server's
// Mono once its read returned), from reply b's clock readings; each is
// bounded by wall, the run's time as the server saw it, so that a
// reply's wrong readings (bundle code can write on the channel, though
// not with the run's sequence number unseen) skew no figure past it.
func Handover(b []byte, sent, got int64, wall time.Duration) (handoff, handback time.Duration) {
	if len(b) < ReplyHeader {
		return 0, 0
	}
	since := func(from, to int64) time.Duration { // to - from within 0..wall, with no overflow
		if to <= from {
			return 0
		}
		return time.Duration(min(uint64(to)-uint64(from), uint64(max(0, wall))))
	}
	return since(sent, int64(le.Uint64(b[replyGot:]))), since(int64(le.Uint64(b[replySent:])), got)
}

// ReplyHead reads a run reply's status and the sequence number it echoes;
// an error for bytes too short to be a reply.
func ReplyHead(b []byte) (st byte, seq uint32, err error) {
	if len(b) < ReplyHeader {
		return 0, 0, fmt.Errorf("run reply of %d bytes", len(b))
	}
	return b[replyStatus], le.Uint32(b[replySeq:]), nil
}

// TurnError is a run reply that does not echo its run's sequence number:
// bundle code wrote to the instance's channel, or a reply was left over.
type TurnError struct{ Got, Want uint32 }

func (e *TurnError) Error() string {
	return fmt.Sprintf("a reply numbered %d to run %d", e.Got, e.Want)
}

// DecodeReply reads the reply to run seq: its status, the output length
// the worker reported (to be checked against the run's output) and its
// message, and the run's timing into r. A reply too short, or another
// run's (a *TurnError), is an error, and r is left as it was.
func DecodeReply(b []byte, r *device.Run, seq uint32) (st byte, outLen uint64, text string, err error) {
	st, got, err := ReplyHead(b)
	if err != nil {
		return 0, 0, "", err
	}
	if got != seq {
		return 0, 0, "", &TurnError{Got: got, Want: seq}
	}
	r.Timing = device.Timing{
		CopyIn:  time.Duration(le.Uint64(b[replyCopyIn:])),
		Kernels: time.Duration(le.Uint64(b[replyKernels:])),
		CopyOut: time.Duration(le.Uint64(b[replyCopyOut:])),
		Copied:  int64(le.Uint64(b[replyCopied:])),
		Busy:    time.Duration(le.Uint64(b[replyBusy:])),
	}
	return st, le.Uint64(b[replyOutLen:]), string(b[ReplyHeader:]), nil
}
