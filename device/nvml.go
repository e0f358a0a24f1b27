package device

import (
	"errors"
	"fmt"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/plover-run/plover/loader"
)

// go-nvml carries its own nvml.h and dlopens libnvidia-ml.so.1 at run time:
// it builds without the driver or the CUDA toolkit. Its cgo LDFLAGS
// (--unresolved-symbols=ignore-in-object-files) apply to every binary that
// links this package, so an undefined C symbol anywhere in it links cleanly
// and fails only when called; the driver shim here resolves everything
// through dlsym for that reason too.

// ErrNoDriver means the NVIDIA driver (libnvidia-ml.so.1 or its kernel
// module) is not present.
var ErrNoDriver = errors.New("no NVIDIA driver")

// GPUInfo is one GPU as NVML reports it. NVML numbers GPUs by PCI bus order,
// which is not the CUDA ordinal unless CUDA_DEVICE_ORDER=PCI_BUS_ID, and it
// ignores CUDA_VISIBLE_DEVICES: this is an inventory of the machine.
type GPUInfo struct {
	Index             int
	Name              string
	UUID              string
	MemoryTotal       int64
	MemoryFree        int64
	UtilizationPct    int    // -1 when not reported (MIG, some vGPUs)
	MIGMode           string // "enabled", "disabled" or "unsupported"
	DriverVersion     string // e.g. "550.54.15"
	CUDADriverVersion string // the CUDA version the driver supports, e.g. "12.4"
}

// ListGPUs lists the machine's GPUs through NVML.
func ListGPUs() ([]GPUInfo, error) {
	// Nothing but Init may be called until Init succeeds: the library's
	// symbols are unresolved until it loads.
	// go-nvml dlopens libnvidia-ml in Init and closes it in Shutdown: under
	// the process's one dynamic-linker lock, like every other dlopen.
	var ret nvml.Return
	loader.DL(func() { ret = nvml.Init() })
	if err := nvmlInitError(ret); err != nil {
		return nil, err
	}
	defer loader.DL(func() { nvml.Shutdown() })

	driver, ret := nvml.SystemGetDriverVersion()
	if ret != nvml.SUCCESS {
		driver = "unknown"
	}
	cudaVersion := "unknown"
	if v, ret := nvml.SystemGetCudaDriverVersion(); ret == nvml.SUCCESS {
		cudaVersion = versionString(v)
	}
	n, ret := nvml.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("nvml device count: %v", ret)
	}
	gpus := make([]GPUInfo, 0, n)
	for i := 0; i < n; i++ {
		d, ret := nvml.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS {
			return nil, fmt.Errorf("nvml GPU %d: %v", i, ret)
		}
		info := GPUInfo{Index: i, UtilizationPct: -1, MIGMode: "unsupported",
			DriverVersion: driver, CUDADriverVersion: cudaVersion}
		if s, ret := d.GetName(); ret == nvml.SUCCESS {
			info.Name = s
		}
		if s, ret := d.GetUUID(); ret == nvml.SUCCESS {
			info.UUID = s
		}
		if m, ret := d.GetMemoryInfo(); ret == nvml.SUCCESS {
			info.MemoryTotal, info.MemoryFree = int64(m.Total), int64(m.Free)
		}
		if u, ret := d.GetUtilizationRates(); ret == nvml.SUCCESS {
			info.UtilizationPct = int(u.Gpu)
		}
		if cur, _, ret := d.GetMigMode(); ret == nvml.SUCCESS {
			info.MIGMode = "disabled"
			if cur == nvml.DEVICE_MIG_ENABLE {
				info.MIGMode = "enabled"
			}
		}
		gpus = append(gpus, info)
	}
	return gpus, nil
}

// nvmlInitError is NVML's Init's answer ret as an error, nil for success:
// ErrNoDriver where the library or the kernel driver is missing (a
// machine with the CUDA toolkit's libnvidia-ml and no GPU has the one and
// not the other).
func nvmlInitError(ret nvml.Return) error {
	switch ret {
	case nvml.SUCCESS:
		return nil
	case nvml.ERROR_LIBRARY_NOT_FOUND:
		return fmt.Errorf("%w: libnvidia-ml.so.1 not found", ErrNoDriver)
	case nvml.ERROR_DRIVER_NOT_LOADED:
		return fmt.Errorf("%w: the kernel driver is not loaded", ErrNoDriver)
	}
	return fmt.Errorf("nvml init: %v", ret)
}
