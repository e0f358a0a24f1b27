package device

import (
	"errors"
	"fmt"
)

// ErrOutOfMemory marks an allocation refused by the device or by its budget.
var ErrOutOfMemory = errors.New("out of device memory")

// DriverError is a CUDA driver call that failed.
type DriverError struct {
	Op   string // the driver entry point, e.g. "cuStreamSynchronize"
	Code int    // the CUresult
	Name string // e.g. "CUDA_ERROR_ILLEGAL_ADDRESS"
	Desc string // the driver's description, may be empty
}

func (e *DriverError) Error() string {
	if e.Desc != "" {
		return fmt.Sprintf("%s: %s (%s)", e.Op, e.Name, e.Desc)
	}
	return e.Op + ": " + e.Name
}

// Sticky reports whether the error leaves the context unusable: after one,
// every later call in the process returns it again, and only a restart
// gives the GPU back.
func (e *DriverError) Sticky() bool { return stickyCode(e.Code) }

// EndsContext reports whether the process can use its context no more
// after the error: a sticky one, or the loss of its MPS server
// (mpsLostCode). A run or hook that meets one poisons the device, so that
// a worker ends and its function's next request gets a fresh one.
func (e *DriverError) EndsContext() bool { return stickyCode(e.Code) || mpsLostCode(e.Code) }

func (e *DriverError) Unwrap() error {
	if e.Code == 2 { // CUDA_ERROR_OUT_OF_MEMORY
		return ErrOutOfMemory
	}
	return nil
}

func stickyCode(code int) bool {
	switch code {
	case 700, // CUDA_ERROR_ILLEGAL_ADDRESS
		702, // CUDA_ERROR_LAUNCH_TIMEOUT
		710, // CUDA_ERROR_ASSERT
		714, // CUDA_ERROR_HARDWARE_STACK_ERROR
		715, // CUDA_ERROR_ILLEGAL_INSTRUCTION
		716, // CUDA_ERROR_MISALIGNED_ADDRESS
		717, // CUDA_ERROR_INVALID_ADDRESS_SPACE
		718, // CUDA_ERROR_INVALID_PC
		719, // CUDA_ERROR_LAUNCH_FAILED
		721, // CUDA_ERROR_TENSOR_MEMORY_LEAK
		// Not kernel faults, but the context is as unusable after them (the
		// first three documented so: "the process must be terminated and
		// relaunched"):
		226, // CUDA_ERROR_CONTAINED: peer memory over NVLink, a hardware error
		810, // CUDA_ERROR_MPS_CLIENT_TERMINATED: the MPS server ended this client
		911, // CUDA_ERROR_EXTERNAL_DEVICE
		214, // CUDA_ERROR_ECC_UNCORRECTABLE
		220, // CUDA_ERROR_NVLINK_UNCORRECTABLE
		709, // CUDA_ERROR_CONTEXT_IS_DESTROYED
		4,   // CUDA_ERROR_DEINITIALIZED
		999: // CUDA_ERROR_UNKNOWN: nothing says it is safe to go on
		return true
	}
	return false
}

// mpsLostCode reports whether code says the process's MPS server is gone or
// will not serve it: the server died or restarts (its connection and RPCs
// fail), or is recovering from a fatal fault. Not sticky by the driver's
// list, but the client's context lives in that server: once it is gone,
// every later call fails the same way, and a worker that stayed would
// answer each request 500 kernel_failed where a fresh one would reconnect.
func mpsLostCode(code int) bool {
	switch code {
	case 805, // CUDA_ERROR_MPS_CONNECTION_FAILED
		806, // CUDA_ERROR_MPS_RPC_FAILURE
		807, // CUDA_ERROR_MPS_SERVER_NOT_READY
		808, // CUDA_ERROR_MPS_MAX_CLIENTS_REACHED
		809: // CUDA_ERROR_MPS_MAX_CONNECTIONS_REACHED
		return true
	}
	return false
}

// DeviceFault is the error of a GPU whose context a sticky error poisoned
// (or the loss of its MPS server: DriverError.EndsContext).
// Health returns it, and so does every later call that would touch the GPU.
type DeviceFault struct {
	Device string
	Err    *DriverError
}

func (e *DeviceFault) Error() string {
	return fmt.Sprintf("%s: %v after %v; restart the process to use this GPU again", e.Device, ErrUnhealthy, e.Err)
}

func (e *DeviceFault) Unwrap() []error { return []error{ErrUnhealthy, e.Err} }

// kernelFault is what the Run that hit a sticky error after launching its
// chain returns, and a hook that met one once it ran: the request failed
// like any kernel failure (errors.As finds the *KernelError), and the
// device is gone (errors.Is(err, ErrUnhealthy)). A Run or hook that met it
// before its own code ran (the driver calls that set it up, an instance's
// buffers) returns the *DeviceFault alone, as one refused on a device
// already poisoned: it launched nothing.
type kernelFault struct {
	ke    *KernelError
	fault *DeviceFault
}

func (e *kernelFault) Error() string { return e.ke.Error() }

func (e *kernelFault) Unwrap() []error { return []error{e.ke, e.fault} }

// OwnFault reports whether err is a device fault met by the call's own
// code, a run's chain or a hook, once it ran (a kernelFault), not one
// left by other work before it.
func OwnFault(err error) bool {
	var kf *kernelFault
	return errors.As(err, &kf)
}
