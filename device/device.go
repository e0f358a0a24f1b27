// Package device is Plover's device layer: the Device/Program/Instance seam the
// runtime runs kernel chains through, the host device (device memory is host
// memory, kernels run on the calling thread), and the CUDA device.
//
// The seam carries no pointers into a bundle: a device loads a bundle into a
// Program where the bundle's code lives (this process, or a worker process),
// and a run names its steps by index into the program's entry table. So the
// same interface serves in-process devices and worker processes.
package device

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"time"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/api"
)

// Device owns one execution device. It is safe for concurrent use; an
// Instance is not, and the runtime gives each to one request at a time.
type Device interface {
	// Target is the bundle target this device runs: "host" or "cuda".
	Target() string
	// Name describes the device for logs and /healthz.
	Name() string
	// Load loads an unpacked bundle onto this device: the library (its
	// constructors run), every entry the manifest's chain names, and the
	// constants. An invalid library is a *loader.Error; a program lost
	// while loading (its worker process died) is a Loss.
	Load(ctx context.Context, spec ProgramSpec) (Program, error)
	// MemInfo reports device memory as this device accounts it.
	MemInfo() MemInfo
	// Health is nil while the device can run requests.
	Health() error
	Close() error
}

// ProgramSpec is what Device.Load loads.
type ProgramSpec struct {
	Dir      string // the unpacked bundle directory; read, never written
	Manifest *abi.Manifest
	// MemoryBudget is the device memory the program may come to hold: its
	// constants and its largest number of instances (a device that can
	// enforce it, a worker under MPS, does; others ignore it).
	MemoryBudget int64
	// Output receives what the program's bundle code prints, a line at a
	// time, on a device that runs it apart (a worker process: its stdout
	// and stderr); nil: kept nowhere. One function's, in one life of its
	// name: a function deleted meanwhile drops what its workers still say.
	Output Output
	// Tenant is whose program it is: a device that runs programs apart
	// (worker processes) may run programs of one tenant together in one
	// process, never programs of two. Programs of the empty tenant are
	// one tenant. It is a name, not a secret (the deploying token's name).
	Tenant string
}

// Output takes a program's printed lines; Add never blocks.
type Output interface{ Add(api.LogLine) }

// Program is one bundle loaded on one device. Close ends it once its
// instances are closed: constants freed, library unloaded (or, for a worker,
// the process stopped).
type Program interface {
	// Entry returns the index of kernel in the program's entry table,
	// resolving it the first time. The manifest chain's kernels are entries
	// 0..k-1 in the order abi.Kernels lists them, so a chain's steps can be
	// computed without asking the program.
	Entry(kernel string) (int32, error)
	// ConstantsBytes is the device memory the constants hold.
	ConstantsBytes() int64
	NewInstance(cfg InstanceConfig) (Instance, error)
	Close() error
}

// InstanceConfig sizes an instance's buffers.
type InstanceConfig struct {
	MaxInput int64
	Tmp      int64
	Out      int64
	// Below the seam (a device's own NewInstance): the program's constants
	// (nil when the bundle has none), entry table and priority class
	// (abi.Manifest.Priority: a GPU makes the instance's stream at its
	// class's priority).
	Constants Constants
	Entries   *Entries
	Priority  string
	// Host, when set, is memory of SlotSize(MaxInput, Out) bytes outside
	// the Go heap (a worker's shared slot) that stays mapped while the
	// instance lives. A CUDA instance pins it in place and copies straight
	// between it and the device when a Run's Input and Output are its two
	// parts.
	Host []byte
	// Deadline, when set, bounds the creation (it runs the bundle's
	// plover_instance_init) on a device that can stop it: a worker process
	// is killed past it.
	Deadline time.Time
}

// A slot is laid out as its input, then its output from SlotOut: the
// input's size rounded up to the 256-byte alignment of every buffer a
// chain sees (plover.h), so that the host device runs a chain on the
// output where it is. At the input's end it was copied through the
// instance's own out whenever max_input_bytes was not a multiple of 256,
// which then stayed resident in the worker, counted against
// max_host_memory_mb.
const slotAlign = 256

// SlotOut is where a slot's output starts, for an input of maxIn bytes.
func SlotOut(maxIn int64) int64 { return (maxIn + slotAlign - 1) &^ (slotAlign - 1) }

// SlotSize is the size of a slot for maxIn bytes of input and out of output.
func SlotSize(maxIn, out int64) int64 { return SlotOut(maxIn) + out }

// Constants is a read-only device buffer shared by a program's instances.
type Constants interface {
	Size() int64
	Free()
}

// Instance is the per-request execution state: input, tmp and out buffers on
// the device, plus whatever the device needs to run a chain (a stream).
type Instance interface {
	// Run performs one whole request in one call: copy Input in, zero tmp if
	// asked, run every step, copy out into Output.
	Run(r *Run) error
	// DeviceBytes is the device memory this instance holds.
	DeviceBytes() int64
	Close()
}

// CloseFault closes inst as Close does and returns what its close met of
// a device fault of its own (OwnFault: its plover_instance_fini faulted
// the device once it ran), else nil.
func CloseFault(inst Instance) error {
	if c, ok := inst.(interface{ closeFault() error }); ok {
		return c.closeFault()
	}
	inst.Close()
	return nil
}

// Step is one launch: an entry of the program's table and its sizes.
type Step struct {
	Entry int32
	Grid  int32
	Block int32
}

// Run is one request. The runtime reuses Run values, so Run must not keep
// references to Input or Output after it returns.
type Run struct {
	Input   []byte // len <= instance MaxInput
	Output  []byte // filled completely; len <= instance Out
	Chain   []Step
	TmpLen  int64 // bytes of tmp visible to kernels; <= instance Tmp
	ZeroTmp bool
	ZeroOut bool // zero the Output's length of out first: no stale bytes
	// ChainKey, when nonzero, promises that every Run with the same ChainKey
	// and the same input, tmp and output lengths runs the same chain, so a
	// device may record it once and replay it (CUDA graphs). Entry points
	// read lengths on the host, so lengths are part of the key. 0 disables
	// recording.
	ChainKey uint64
	// Items is plover_state_t.items (ABI 2.1): the requests this run
	// holds, for a batched run; 0 otherwise.
	Items uint32
	// Deadline, when set, is when a device that can stop a running chain
	// (a worker process: by killing it) gives up with ErrDeadline. An
	// in-process device cannot interrupt a kernel and ignores it.
	Deadline time.Time
	// InPlace says Input and Output are memory the device may work on
	// directly for the whole run, nobody else touching it (a worker's
	// shared slot): the host device runs the chain on them rather than on
	// copies in its own buffers, and a CUDA device copies straight between
	// them and the GPU (they must be registered: RegisterHost).
	InPlace bool
	// Slot, when set, is the memory the request's body was read into,
	// lent before the body was read (Lender): a device that lent it works
	// on it where it is (Input is its input's first bytes, Output its
	// output's); any other reads Input and writes Output as memory like
	// any other.
	Slot Slot
	// Results. OutLen is how many bytes of Output the chain produced: all of
	// them, unless an ABI 2 entry lowered s->out.len (the response is then
	// Output[:OutLen]).
	OutLen int64
	Timing Timing
}

// Timing is measured on the device side of the call.
type Timing struct {
	CopyIn  time.Duration
	Kernels time.Duration
	CopyOut time.Duration
	// Copied is the payload bytes the device copied on the host (into and
	// out of its own buffers or staging), beside the transfer to and from
	// the device itself: 0 when it worked in place.
	Copied int64
	// Busy is the device time the run used, what its function is charged
	// and billed for it: on the host device CPU time, not the time it
	// waited for a CPU (in a worker its share of the process's, helper
	// threads included, Host.ChargeProcessCPU; elsewhere the CPU time of
	// the thread that ran the chain); on CUDA the copies' and the chain's
	// time on the GPU. 0: the device does not know.
	Busy time.Duration
	// Handoff is how long the run's message waited for its worker
	// process to read it, and Handback how long the worker's reply
	// waited for the server to read it (each thread's wake among them),
	// from the clock both read; 0 for a run in the server's process.
	Handoff, Handback time.Duration
}

// Slot is memory a request's input lands in and its output is read from,
// where a device works on them: a worker's shared slot, registered with
// its device once. Its input is Input, its output Output (of the sizes it
// was lent for); Release gives it back, once nothing reads or writes it
// any more (the response is written).
type Slot interface {
	Input() []byte
	Output() []byte
	// Device is the device whose runs work on it in place.
	Device() Device
	Release()
	// Discard is Release for a slot a run may still write into (its
	// request's run panicked): it is never lent again, and its memory is
	// let go once no run may use it (at once when none is on it), else
	// with its program.
	Discard()
}

// Lender is a Program that lends slots of its instances' layout (maxIn
// input bytes, out output bytes), so that a body can be read straight
// into one; false when it has none to lend now.
type Lender interface {
	Lend(maxIn, out int64) (Slot, bool)
}

// HostRegistrar is a device that must register host memory before it
// copies straight between it and the device (CUDA: cuMemHostRegister,
// once per buffer: costly per call, free after).
type HostRegistrar interface {
	RegisterHost(b []byte) error
}

// HostUnregistrar is a HostRegistrar that can undo a registration
// (CUDA: cuMemHostUnregister), for memory the process is done with: a
// tenant's worker's pool slots of a program it unloaded.
type HostUnregistrar interface {
	UnregisterHost(b []byte) error
}

// CopyPiecer is a device whose runs can issue their copies between host
// and device in pieces (CUDA: plover serve --copy-piece), meant to let
// another context's copy in between pieces (measured: README, --copy-piece).
// Set once, before instances are made; an instance keeps the size it was
// made with.
type CopyPiecer interface {
	SetCopyPiece(bytes int64)
}

// HostMemoryBound is a device whose programs run in processes whose
// resident memory it bounds (worker processes: --isolation process; a
// bundle run in the server is not bounded). FitsHostMemory refuses a
// function that could never stay within the bound: its constants of
// constSize bytes and one instance, where they live in that process.
type HostMemoryBound interface {
	FitsHostMemory(m *abi.Manifest, constSize int64) error
}

// Pinning is host memory a device pinned for the slots requests' bytes
// land in (a CUDA device's workers: page-locked and resident for each
// slot's life, whatever a request touches).
type Pinning struct {
	Bytes   int64 // pinned now
	Limit   int64 // what pool slots may bring it to (0: no bound)
	Refused int64 // pins the driver refused
}

// HostPinning is a device that pins host memory for its slots.
type HostPinning interface {
	Pinning() Pinning
}

// HostPinner is an Instance of a HostRegistrar device, given Host memory
// (InstanceConfig.Host): HostPinned reports whether the device registered
// it, and if not why (the instance then stages its copies in buffers of its
// own, and runs on Host must not be InPlace).
type HostPinner interface {
	HostPinned() (bool, error)
}

// MemInfo is device memory in bytes.
type MemInfo struct {
	Total int64
	Free  int64
	Used  int64 // held by Plover on this device
}

// KernelError is a failure the bundle reported (plover_fail or a CUDA error).
type KernelError struct {
	Msg string
	// Rejected: the chain refused its input (plover_reject, ABI 2.2): the
	// client's fault, not the function's.
	Rejected bool
}

func (e *KernelError) Error() string {
	if e.Rejected {
		return "input refused: " + e.Msg
	}
	return "kernel failed: " + e.Msg
}

// rejectMark starts a message plover_reject left (plover.h).
const rejectMark = "\x1e"

// chainError is the error a chain's message reports: a refusal of its
// input when plover_reject made it, a failure otherwise.
func chainError(msg string) *KernelError {
	if m, ok := strings.CutPrefix(msg, rejectMark); ok {
		return &KernelError{Msg: wholeCharacters(m), Rejected: true}
	}
	return &KernelError{Msg: msg}
}

// wholeCharacters is a refusal's message as valid UTF-8: plover_reject
// cuts it at 255 bytes, which may split a character, and the message is
// the client's answer (JSON, a gRPC status), where half a character is an
// invalid string.
func wholeCharacters(m string) string { return strings.ToValidUTF8(m, "") }

// onThread keeps the calling goroutine on its OS thread until the
// function it returns is called: a call into a bundle and the reading of
// the message it left. That message (plover_fail's literal aside:
// plover_reject's copy, the last error's pointer) is in the calling
// thread's storage (plover.h's __thread), and a goroutine whose thread
// gave its processor up during a long call may come back on another while
// a second goroutine's call into the bundle on the first overwrites the
// message it has yet to read: one request's refusal reported for another.
// (loader's lockDL does the same for dlerror's.)
func onThread() func() {
	runtime.LockOSThread()
	return runtime.UnlockOSThread
}

// hookError is a hook's failure: a refusal there is a failure too.
func hookError(name, msg string) *KernelError {
	return &KernelError{Msg: name + " failed: " + unmarked(msg)}
}

// unmarked is a bundle's message without plover_reject's mark, where a
// refusal counts as a failure (a hook's, one beside a CUDA error).
func unmarked(msg string) string {
	if m, ok := strings.CutPrefix(msg, rejectMark); ok {
		return wholeCharacters(m)
	}
	return msg
}

// ErrUnhealthy marks a device that can no longer run requests.
var ErrUnhealthy = errors.New("device unhealthy")

// ErrDeadline is a run given up at its deadline. The instance stays usable:
// a device that cannot stop the chain lets it finish in the background (a
// worker process is killed if it overruns by more than a grace period, and
// the next run on the instance then reports a Loss that RanNowhere).
var ErrDeadline = errors.New("the request's deadline passed")

// ErrNotStarted is ErrDeadline of a call that never reached the program:
// its time ran out while it waited its turn (behind another program's
// call in a worker shared by a tenant's programs), so the program is as
// it was, and stays usable.
var ErrNotStarted = fmt.Errorf("%w before the call could start", ErrDeadline)

// Loss is the error of a program that is gone, with everything it held
// (its instances, its memory): for a program in a worker process, the
// process's death (worker.ProcessExit). The caller drops the program and
// its instances and loads it afresh; a call that RanNowhere did nothing
// anywhere and may run once more on the fresh program. What the loss was
// (a process, a context) is the implementation's; a caller needs only
// these answers.
type Loss interface {
	error
	// RanNowhere: the program was gone before this call reached it.
	RanNowhere() bool
	// ByServer: the server ended it (a run past its deadline, a memory
	// limit, a message out of turn), not a fault of the program's own.
	ByServer() bool
	// Collateral: the program shared its process with others (a tenant's
	// worker) and was lost with it by another's fault or ending; its own
	// call, if one was in flight, did nothing wrong and, the functions
	// being pure, may run once more on the fresh program. It does not
	// count against the program as a crash.
	Collateral() bool
	// LogAttrs describes the loss for a log line, as key-value pairs.
	LogAttrs() []any
}

// AsLoss is the Loss err holds, if any.
func AsLoss(err error) (Loss, bool) {
	var l Loss
	ok := errors.As(err, &l)
	return l, ok
}

// ProcessStats is what a program living in a process of its own reports
// about that process (Program implementations in other processes offer
// Process() ProcessStats).
type ProcessStats struct {
	PID      int   `json:"pid"`
	RSSBytes int64 `json:"resident_bytes"`
	PSSBytes int64 `json:"pss_bytes"` // proportional set size (shared pages divided among their users)
	Threads  int   `json:"threads"`
	// Programs is how many programs share the process (a tenant's
	// worker: its figures are the whole process's, reported alike for
	// each of them); 1 for a process of its own, 0: not known.
	Programs int `json:"programs,omitempty"`
}

func checkRun(r *Run, maxIn, tmp, out int64, maxSteps int) error {
	switch {
	case int64(len(r.Input)) > maxIn:
		return fmt.Errorf("input is %d bytes, instance holds %d", len(r.Input), maxIn)
	case int64(len(r.Output)) > out:
		return fmt.Errorf("output is %d bytes, instance holds %d", len(r.Output), out)
	case r.TmpLen < 0 || r.TmpLen > tmp:
		return fmt.Errorf("tmp is %d bytes, instance holds %d", r.TmpLen, tmp)
	case len(r.Chain) == 0 || len(r.Chain) > maxSteps:
		return fmt.Errorf("chain has %d steps, want 1..%d", len(r.Chain), maxSteps)
	}
	return nil
}
