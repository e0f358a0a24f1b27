package device

import (
	"fmt"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/plover-run/plover/loader"
)

// memReader reads a GPU's memory without a CUDA context: what a server
// that opened its GPUs bare (OpenBare) reports as their free memory.
type memReader interface {
	memInfo() (free, total int64, err error)
	close()
}

// openMemReader finds the reader of the CUDA device whose UUID
// (cuDeviceGetUuid_v2's 16 bytes) is uuid: NVML's. Tests replace it.
var openMemReader = func(uuid [16]byte) (memReader, error) { return openNVMLMem(sysNVML{}, uuid) }

// nvmlLib is the part of NVML a memory reader uses: the process's NVML
// (sysNVML), or in tests go-nvml's mock.
type nvmlLib interface {
	Init() nvml.Return
	Shutdown() nvml.Return
	DeviceGetHandleByUUID(uuid string) (nvml.Device, nvml.Return)
}

// sysNVML is the process's NVML, the one ListGPUs uses: go-nvml counts
// its Inits, so each Init here is matched by one Shutdown.
type sysNVML struct{}

func (sysNVML) Init() nvml.Return     { return nvml.Init() }
func (sysNVML) Shutdown() nvml.Return { return nvml.Shutdown() }
func (sysNVML) DeviceGetHandleByUUID(uuid string) (nvml.Device, nvml.Return) {
	return nvml.DeviceGetHandleByUUID(uuid)
}

// nvmlMem reads one device's memory through NVML, which makes no CUDA
// context and so no MPS client.
type nvmlMem struct {
	lib  nvmlLib
	dev  nvml.Device
	name string // NVML's name of it: GPU-… or MIG-…
}

// uuidText is uuid as NVML writes it, without its "GPU-" or "MIG-" prefix.
func uuidText(u [16]byte) string {
	return fmt.Sprintf("%x-%x-%x-%x-%x", u[0:4], u[4:6], u[6:8], u[8:10], u[10:16])
}

// openNVMLMem initialises NVML and finds the device of uuid. NVML names a
// whole GPU GPU-<uuid> and a MIG compute instance MIG-<uuid>, the same 16
// bytes either way, and cuDeviceGetUuid_v2 does not say which it gave: the
// GPU is tried first, then the MIG device. A device NVML knows by neither
// name (a driver that names MIG devices the old way,
// MIG-GPU-<uuid>/<gi>/<ci>) is an error, as is one whose memory it cannot
// read: the caller then reads it through a context.
func openNVMLMem(lib nvmlLib, uuid [16]byte) (*nvmlMem, error) {
	// go-nvml dlopens libnvidia-ml in Init and closes it in Shutdown:
	// under the process's one dynamic-linker lock, like every other dlopen.
	var ret nvml.Return
	loader.DL(func() { ret = lib.Init() })
	if err := nvmlInitError(ret); err != nil {
		return nil, err
	}
	text := uuidText(uuid)
	var why []string
	for _, name := range []string{"GPU-" + text, "MIG-" + text} {
		dev, ret := lib.DeviceGetHandleByUUID(name)
		if ret != nvml.SUCCESS {
			why = append(why, fmt.Sprintf("%s: %v", name, ret))
			continue
		}
		m := &nvmlMem{lib: lib, dev: dev, name: name}
		if _, _, err := m.memInfo(); err != nil {
			m.close()
			return nil, err
		}
		return m, nil
	}
	loader.DL(func() { lib.Shutdown() })
	return nil, fmt.Errorf("NVML knows no device of CUDA's UUID (%s; %s)", why[0], why[1])
}

func (m *nvmlMem) memInfo() (free, total int64, err error) {
	mem, ret := m.dev.GetMemoryInfo()
	if ret != nvml.SUCCESS {
		return 0, 0, fmt.Errorf("nvml %s memory: %v", m.name, ret)
	}
	return int64(mem.Free), int64(mem.Total), nil
}

func (m *nvmlMem) close() { loader.DL(func() { m.lib.Shutdown() }) }
