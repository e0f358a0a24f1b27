// Package cuda is Plover's device layer: the Device interface the runtime
// runs kernel chains through, the host device (device memory is host memory,
// kernels run on the calling thread), and the CUDA device.
package cuda

import (
	"errors"
	"fmt"
	"io"
	"time"
	"unsafe"
)

// Device owns one execution device. It is safe for concurrent use; an
// Instance is not, and the runtime gives each to one request at a time.
type Device interface {
	// Target is the bundle target this device runs: "host" or "cuda".
	Target() string
	// Name describes the device for logs and /healthz.
	Name() string
	// LoadConstants copies size bytes from r into device memory, once per
	// function version; all instances of that version share the result.
	LoadConstants(r io.Reader, size int64) (Constants, error)
	// NewInstance allocates one instance's buffers (and stream).
	NewInstance(cfg InstanceConfig) (Instance, error)
	// MemInfo reports device memory as this device accounts it.
	MemInfo() MemInfo
	// Health is nil while the device can run requests.
	Health() error
	Close() error
}

// Constants is a read-only device buffer shared by a version's instances.
type Constants interface {
	Size() int64
	Free()
}

// InstanceConfig sizes an instance's buffers.
type InstanceConfig struct {
	MaxInput  int64
	Tmp       int64
	Out       int64
	Constants Constants // may be nil: the bundle has no constants
	// LastError is the bundle's plover_last_error, or nil.
	LastError unsafe.Pointer
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

// Step is one resolved launch: an entry point of a loaded bundle.
type Step struct {
	Fn    unsafe.Pointer // plover_entry_fn
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
	// ChainKey, when nonzero, promises that every Run with the same ChainKey
	// and the same input, tmp and output lengths runs the same chain, so a
	// device may record it once and replay it (CUDA graphs). Entry points
	// read lengths on the host, so lengths are part of the key. 0 disables
	// recording.
	ChainKey uint64
	Timing   Timing
}

// Timing is measured on the device side of the call.
type Timing struct {
	CopyIn  time.Duration
	Kernels time.Duration
	CopyOut time.Duration
}

// MemInfo is device memory in bytes.
type MemInfo struct {
	Total int64
	Free  int64
	Used  int64 // held by Plover on this device
}

// KernelError is a failure the bundle reported (plover_fail or a CUDA error).
type KernelError struct{ Msg string }

func (e *KernelError) Error() string { return "kernel failed: " + e.Msg }

// ErrUnhealthy marks a device that can no longer run requests.
var ErrUnhealthy = errors.New("device unhealthy")

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
