package device

import (
	"fmt"
	"log/slog"
)

// Device kinds Open accepts.
const (
	KindAuto = "auto"
	KindHost = "host"
	KindCUDA = "cuda"
)

// Open returns the devices this process runs requests on.
//
//	"host": one host device.
//	"cuda": one device per visible GPU, or an error that says why there are
//	        none (libcuda.so.1 not found, cuInit failed, no devices).
//	"auto": the GPUs when that works, otherwise the host device, with a log
//	        line saying why.
//
// limit is each device's memory budget in bytes (0: the device's memory).
// log may be nil.
func Open(kind string, limit int64, log *slog.Logger) ([]Device, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return open(kind, libcuda, limit, log)
}

func open(kind, driverPath string, limit int64, log *slog.Logger) ([]Device, error) {
	switch kind {
	case KindHost:
		return []Device{NewHost(limit)}, nil
	case KindCUDA, KindAuto, "":
		gpus, err := openGPUs(driverPath, limit, log)
		if err == nil {
			devs := make([]Device, len(gpus))
			for i, g := range gpus {
				devs[i] = g
			}
			return devs, nil
		}
		if kind == KindCUDA {
			return nil, fmt.Errorf("device cuda: %w", err)
		}
		h := NewHost(limit)
		log.Info("no usable CUDA device, running kernels on the host device", "reason", err.Error(), "device", h.Name())
		return []Device{h}, nil
	}
	return nil, fmt.Errorf("device kind %q: want auto, host or cuda", kind)
}

// OpenOne opens one device: the host device, or CUDA device ordinal (and no
// other: a worker process serves one device and must not hold contexts on
// the rest) through the driver library at driver ("": libcuda.so.1). log
// may be nil.
func OpenOne(kind string, ordinal int, limit int64, driver string, log *slog.Logger) (Device, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	switch kind {
	case KindHost:
		return NewHost(limit), nil
	case KindCUDA:
		if driver == "" {
			driver = libcuda
		}
		g, err := openOneGPU(driver, ordinal, limit, log)
		if err != nil {
			return nil, err // not a nil *GPU in a non-nil Device
		}
		return g, nil
	}
	return nil, fmt.Errorf("device kind %q: want host or cuda", kind)
}
