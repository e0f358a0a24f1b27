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
//     unload, one call at a time, answered in order, each naming the
//     program it is about (a tenant's worker holds several);
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
// Beside the channels, a tenant's worker, and one in checked mode, has a
// pipe of its own (FatalFD) for the lines its signal handlers write as it
// dies: the fatal mark, checked mode's report.
//
// Descriptors (the bundle directory, memfds, instance sockets) go to the
// worker with SCM_RIGHTS. Integers are little-endian.
//
// Every message's bytes are written and read here alone, field by named
// field: the run message and its reply in run.go, the control messages,
// their replies and the ready message in control.go. The decoders of what
// a worker sends (its replies, its ready message) take hostile bytes: a
// worker runs tenant code, which can write to its channels; they answer
// an error, never a panic (FuzzWorkerMessages).
package wire

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"iter"
	"strconv"
	"strings"

	"github.com/plover-run/plover/device"
	"github.com/plover-run/plover/loader"
)

// A worker's descriptors (exec.Cmd.ExtraFiles): the control channel, its
// stage, the directory the server puts its bundle's files in, and, in a
// tenant's worker or a checked one, the pipe its signal handlers write
// FatalMark and checked mode's report on.
const (
	CtlFD   = 3
	StageFD = 4
	FatalFD = 5
)

// Exit statuses a worker ends with on its own.
const (
	ExitChannel = 70 // a channel to the server broke
	ExitFault   = 71 // the device faulted (sticky CUDA error)
)

// Control operations: the first byte of a control message (control.go).
const (
	OpReady       byte = 'R' // worker → server once its device is open
	OpLoad        byte = 'L'
	OpEntry       byte = 'E'
	OpNewInstance byte = 'I'
	OpSlot        byte = 'S'
	OpUnload      byte = 'U'
	OpDropSlot    byte = 'D'
)

// FatalMark leads what a tenant's worker writes on its FatalFD when a
// fatal signal (SIGSEGV, SIGABRT, ...) takes it during a program's call or
// run: "FatalMark<signal> in program <id>\n", in one write(2) by its
// signal handler (package inside) as the process dies, so that the server
// can tell the program whose fault the death was from those that shared
// its process. A pipe of its own, not stderr: a bundle that echoes its
// clients' bytes to its output cannot let a client name a sibling, and
// the mark is in the pipe before the process is dead (the server reads it
// then, holding no timer). A worker in checked mode has the pipe too,
// where its fault handler writes its report (device.FaultMark), after the
// mark in a tenant's worker (ParseFault).
const FatalMark = "plover worker: fatal signal "

// ParseFatal reads the last whole FatalMark line in b, what a worker's
// FatalFD held when it died: the signal and the program's id.
func ParseFatal(b []byte) (sig int, prog uint32, ok bool) {
	for line := range linesBack(b) {
		rest, isMark := bytes.CutPrefix(line, []byte(FatalMark))
		if !isMark {
			continue
		}
		s, id, found := strings.Cut(string(rest), " in program ")
		n, err1 := strconv.Atoi(s)
		p, err2 := strconv.ParseUint(id, 10, 32)
		if found && err1 == nil && err2 == nil {
			return n, uint32(p), true
		}
	}
	return 0, 0, false
}

// ParseFault reads the last whole device.FaultMark line in b, what a
// checked worker's FatalFD held when it died: checked mode's report of
// the guard fault that killed it, the mark cut off. Only its fault
// handler writes there, never what the bundle prints for its clients.
func ParseFault(b []byte) (report string, ok bool) {
	for line := range linesBack(b) {
		if rest, isReport := bytes.CutPrefix(line, []byte(device.FaultMark)); isReport {
			return string(rest), true
		}
	}
	return "", false
}

// linesBack yields b's whole lines (those a newline ends), the last first.
func linesBack(b []byte) iter.Seq[[]byte] {
	return func(yield func([]byte) bool) {
		for {
			end := bytes.LastIndexByte(b, '\n')
			if end < 0 {
				return
			}
			line := b[bytes.LastIndexByte(b[:end], '\n')+1 : end]
			b = b[:end]
			if !yield(line) {
				return
			}
		}
	}
}

// A slot's pin: whether the worker's device pinned the memory in place
// (CUDA: cuMemHostRegister), told in the replies to OpSlot and
// OpNewInstance.
const (
	PinNone    byte = 0 // the device works on plain memory (the host): nothing to pin
	PinDone    byte = 1 // pinned: runs on it copy straight between it and the device
	PinRefused byte = 2 // the device refused it: runs on it are staged (copied on the host)
)

// Protocol is the version of this package's messages, sent in OpReady: a
// worker binary from another build (plover-worker beside a newer plover)
// is refused at its start instead of misreading a run. Bump it with any
// change to a message, or to what one means (14: a run's output starts
// at device.SlotOut of its input, not at max_input_bytes; 15: a run's
// reply says when its message was read and the reply sent; 16: Freed on an
// instance's channel at its end).
const Protocol byte = 16

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
	// StMapped answers OpLoad in a tenant's worker whose process maps the
	// library's file already (loader.Resident): staged as a link to a
	// file loaded before, the load would get that mapping back. The
	// server stages a copy and loads again. [message]
	StMapped byte = 8
)

// CtlMax bounds a control message: a manifest, with room to spare.
const CtlMax = 1 << 20

var le = binary.LittleEndian

// StatusOf classifies an error from the worker's device for the wire.
func StatusOf(err error) (byte, string) {
	var lerr *loader.Error
	var ke *device.KernelError
	switch {
	case err == nil:
		return StOK, ""
	case errors.As(err, &lerr):
		return StInvalid, lerr.Path + "\x00" + lerr.Reason
	case errors.Is(err, device.ErrUnhealthy) && errors.As(err, &ke):
		// Its own fault (device.OwnFault): the server makes its
		// KernelError again from the message, as for StKernel.
		return StFault, ke.Msg
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

// CutNul splits s at its first NUL (StInvalid's path and reason).
func CutNul(s string) (string, string, bool) {
	for i := 0; i < len(s); i++ {
		if s[i] == 0 {
			return s[:i], s[i+1:], true
		}
	}
	return "", s, false
}
