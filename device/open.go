package device

import (
	"log/slog"

	"github.com/plover-run/plover/abi"
)

// Device kinds Open accepts: auto, or a registered kind's target.
const (
	KindAuto = "auto"
	KindHost = abi.TargetHost
	KindCUDA = abi.TargetCUDA
)

// Open returns the devices this process runs requests on.
//
//	"host": one host device.
//	"cuda": one device per visible GPU, or an error that says why there are
//	        none (libcuda.so.1 not found, cuInit failed, no devices).
//	"auto": the devices of the first kind other than the host that has
//	        any (the GPUs), otherwise the host device, with a log line
//	        saying why.
//
// Each kind registers itself (Register).
//
// limit is each device's memory budget in bytes (0: the device's memory).
// log may be nil.
func Open(kind string, limit int64, log *slog.Logger) ([]Device, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return openKinds(kind, "", limit, false, log)
}

// OpenBare is Open for a process that runs nothing on the devices itself
// (its functions run in worker processes) and must hold nothing on them
// that another process's fault could reach: a server under CUDA MPS. Its
// GPUs hold no CUDA context (so the server is no client of their MPS
// servers), read their free memory through NVML, and refuse to load
// anything; where NVML cannot read a GPU's memory it is opened as Open
// does, with a warning. Other kinds open as Open opens them.
func OpenBare(kind string, limit int64, log *slog.Logger) ([]Device, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return openKinds(kind, "", limit, true, log)
}

// OpenOne opens one device of a registered kind: the host device, or CUDA
// device ordinal (and no other: a worker process serves one device and
// must not hold contexts on the rest) through the driver library at driver
// ("": the default). log may be nil.
func OpenOne(kind string, ordinal int, limit int64, driver string, log *slog.Logger) (Device, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	k, err := kinds.Lookup(kind)
	if err != nil {
		return nil, err
	}
	return k.OpenOne(ordinal, limit, driver, log)
}
