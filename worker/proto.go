// Package worker runs bundles in worker processes: the server side (a
// device.Device whose programs live in child processes, with a pool of
// standby workers) and the worker side (`plover worker`, which serves one
// program from an in-process device).
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
// Descriptors (the bundle directory, memfds, instance sockets) go to the
// worker with SCM_RIGHTS. Integers are little-endian.
package worker

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/device"
	"github.com/plover-run/plover/loader"
)

// Control operations.
const (
	opReady       byte = 'R' // worker → server once its device is open: [op][i32 pid][landlocked][protocol]
	opLoad        byte = 'L' // [op][manifest JSON], fds: [bundle dir]
	opEntry       byte = 'E' // [op][kernel name] → [i32 index]
	opNewInstance byte = 'I' // [op][i64 max_in][i64 tmp][i64 out], fds: [memfd, instance socket]
)

// protocol is the version of this file's messages, sent in opReady: a
// worker binary from another build (plover-worker beside a newer plover)
// is refused at its start instead of misreading a run. Bump it with any
// change to a message.
const protocol byte = 3

// readyLen is the length of the opReady message.
const readyLen = 1 + 4 + 1 + 1

// Reply status: the first byte of every reply.
const (
	stOK        byte = 0
	stInvalid   byte = 1 // the bundle is refused (a loader.Error): [path \0 reason]
	stKernel    byte = 2 // the chain reported a failure: [message]
	stFault     byte = 3 // the device faulted for good: the worker must go: [message]
	stOOM       byte = 4 // out of device memory: [message]
	stFailed    byte = 5 // anything else: [message]
	stBadRunMsg byte = 6 // a malformed run message (a server bug): [message]
)

// Run message: header then steps.
const (
	runHeader = 4 + 4 + 8 + 1 + 8 + 2 + 4 + 4 // in, out, tmp, zero flags, chain_key, nsteps, items, seq
	stepBytes = 12                            // entry, grid, block
	runMsgMax = runHeader + abi.MaxChainLength*stepBytes
	// Run reply: status, copy-in, kernels, copy-out ns, the output's length
	// (ABI 2 entries may lower it), the run's seq, then a message.
	replyHeader = 1 + 8 + 8 + 8 + 8 + 4
	// Where the sequence number sits: the last field of each header.
	runSeqAt   = runHeader - 4
	replySeqAt = replyHeader - 4
	replyMax   = replyHeader + 4096
	ctlMax     = 1 << 20 // a manifest, with room to spare
)

var le = binary.LittleEndian

// The run message's flags.
const (
	zeroTmp = 1 << iota
	zeroOut
	// runAlone: no other run was in flight on the device when this one
	// was sent; the worker may poll for the instance's next request.
	runAlone
)

// Every run message carries its instance's next sequence number and the
// reply echoes it. Bundle code runs in the worker and can write to the
// instance's socket: a message it sends there, or a reply left over from
// an earlier run, would otherwise be read as this run's reply, and the
// next request answered with the one before's output. A reply that does not
// echo the run's number ends the worker instead (instance.Run).

func encodeRun(b []byte, r *device.Run, alone bool, seq uint32) []byte {
	b = b[:runHeader]
	le.PutUint32(b[0:], uint32(len(r.Input)))
	le.PutUint32(b[4:], uint32(len(r.Output)))
	le.PutUint64(b[8:], uint64(r.TmpLen))
	b[16] = 0
	if r.ZeroTmp {
		b[16] |= zeroTmp
	}
	if r.ZeroOut {
		b[16] |= zeroOut
	}
	if alone {
		b[16] |= runAlone
	}
	le.PutUint64(b[17:], r.ChainKey)
	le.PutUint16(b[25:], uint16(len(r.Chain)))
	le.PutUint32(b[27:], r.Items)
	le.PutUint32(b[runSeqAt:], seq)
	for _, s := range r.Chain {
		b = le.AppendUint32(b, uint32(s.Entry))
		b = le.AppendUint32(b, uint32(s.Grid))
		b = le.AppendUint32(b, uint32(s.Block))
	}
	return b
}

// sentAlone reports the run message's runAlone flag.
func sentAlone(b []byte) bool { return len(b) > 16 && b[16]&runAlone != 0 }

// runSeq is a run message's sequence number (0 for a message too short to
// hold one: decodeRun refuses it).
func runSeq(b []byte) uint32 {
	if len(b) < runHeader {
		return 0
	}
	return le.Uint32(b[runSeqAt:])
}

// decodeRun fills r from a run message, slicing input and output out of
// slot (input at 0, output at maxIn).
func decodeRun(b []byte, r *device.Run, steps []device.Step, slot []byte, maxIn, out int64) error {
	if len(b) < runHeader {
		return fmt.Errorf("run message of %d bytes", len(b))
	}
	in, outLen := int64(le.Uint32(b[0:])), int64(le.Uint32(b[4:]))
	n := int(le.Uint16(b[25:]))
	if in > maxIn || outLen > out || n > len(steps) || len(b) != runHeader+n*stepBytes {
		return fmt.Errorf("run message out of bounds: input %d/%d, output %d/%d, %d steps in %d bytes", in, maxIn, outLen, out, n, len(b))
	}
	r.Input = slot[:in]
	r.Output = slot[maxIn : maxIn+outLen]
	r.TmpLen = int64(le.Uint64(b[8:]))
	r.ZeroTmp = b[16]&zeroTmp != 0
	r.ZeroOut = b[16]&zeroOut != 0
	r.ChainKey = le.Uint64(b[17:])
	r.Items = le.Uint32(b[27:])
	for k := 0; k < n; k++ {
		s := b[runHeader+k*stepBytes:]
		steps[k] = device.Step{Entry: int32(le.Uint32(s[0:])), Grid: int32(le.Uint32(s[4:])), Block: int32(le.Uint32(s[8:]))}
	}
	r.Chain = steps[:n]
	return nil
}

// statusOf classifies an error from the worker's device for the wire.
func statusOf(err error) (byte, string) {
	var le *loader.Error
	var ke *device.KernelError
	switch {
	case err == nil:
		return stOK, ""
	case errors.As(err, &le):
		return stInvalid, le.Path + "\x00" + le.Reason
	case errors.Is(err, device.ErrUnhealthy):
		return stFault, err.Error()
	case errors.As(err, &ke):
		return stKernel, ke.Msg
	case errors.Is(err, device.ErrOutOfMemory):
		return stOOM, err.Error()
	}
	return stFailed, err.Error()
}

// errorOf turns a reply status back into the error the device would have
// returned in process. stFault is handled by the caller (the worker goes).
func errorOf(st byte, msg string) error {
	switch st {
	case stOK:
		return nil
	case stInvalid:
		path, reason, _ := cutNul(msg)
		return &loader.Error{Path: path, Reason: reason}
	case stKernel:
		return &device.KernelError{Msg: msg}
	case stOOM:
		return fmt.Errorf("%s: %w", msg, device.ErrOutOfMemory)
	}
	return errors.New(msg)
}

func cutNul(s string) (string, string, bool) {
	for i := 0; i < len(s); i++ {
		if s[i] == 0 {
			return s[:i], s[i+1:], true
		}
	}
	return "", s, false
}
