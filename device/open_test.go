package device

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"
)

// These run for real on a machine without a GPU: the device layer must
// degrade to clear errors and the host device, never crash.

func TestDriverLibraryMissing(t *testing.T) {
	path := filepath.Join(t.TempDir(), "libcuda.so.1")
	_, err := loadDriver(path)
	if err == nil || !strings.Contains(err.Error(), "cannot load "+path) {
		t.Fatalf("loadDriver(%q) = %v, want a cannot-load error naming it", path, err)
	}
	t.Log(err)
}

func TestDriverSymbolMissing(t *testing.T) {
	path := filepath.Join(fakeDir(t), "libfakecuda_old.so")
	_, err := loadDriver(path)
	if err == nil || !strings.Contains(err.Error(), "cuGraphLaunch") {
		t.Fatalf("loadDriver(old driver) = %v, want an error naming cuGraphLaunch", err)
	}
	t.Log(err)
}

// Without a GPU, OpenCUDA must say why: libcuda.so.1 missing, or present
// (Debian's libcuda1 comes with nvidia-cuda-toolkit) but cuInit failing.
func TestOpenCUDAWithoutGPU(t *testing.T) {
	gpus, err := OpenCUDA(0, nil)
	if err == nil {
		for _, g := range gpus {
			g.Close()
		}
		t.Skip("a CUDA driver and GPU are present")
	}
	msg := err.Error()
	if !strings.Contains(msg, "libcuda.so.1") ||
		!(strings.Contains(msg, "cannot load") || strings.Contains(msg, "cuInit") || strings.Contains(msg, "no CUDA devices")) {
		t.Errorf("OpenCUDA: %v, want a reason naming libcuda.so.1", err)
	}
	devs, err := Open(KindCUDA, 0, nil)
	if err == nil || devs != nil || !strings.Contains(err.Error(), "libcuda.so.1") {
		t.Errorf(`Open("cuda") = %v, %v`, devs, err)
	}
	t.Log(err)
}

func TestOpenAuto(t *testing.T) {
	log, buf := newLog()
	devs, err := Open(KindAuto, 1<<30, log)
	if err != nil {
		t.Fatal(err)
	}
	if len(devs) == 0 {
		t.Fatal("no devices")
	}
	if devs[0].Target() == "cuda" {
		for _, d := range devs {
			d.Close()
		}
		t.Skip("auto found CUDA devices")
	}
	h, ok := devs[0].(*Host)
	if len(devs) != 1 || !ok {
		t.Fatalf("auto without CUDA gave %v", devs)
	}
	if m := h.MemInfo(); m.Total != 1<<30 {
		t.Errorf("host budget %+v, want Total 1 GiB", m)
	}
	if s := buf.String(); !strings.Contains(s, "no usable CUDA device") || !strings.Contains(s, "libcuda.so.1") {
		t.Errorf("fallback log does not say why: %q", s)
	}
	t.Log(buf.String())
}

func TestOpenHostAndBadKind(t *testing.T) {
	devs, err := Open(KindHost, 0, nil)
	if err != nil || len(devs) != 1 || devs[0].Target() != "host" {
		t.Fatalf(`Open("host") = %v, %v`, devs, err)
	}
	if _, err := Open("tpu", 0, nil); err == nil {
		t.Error(`Open("tpu"): no error`)
	}
}

func TestOpenFakeErrors(t *testing.T) {
	lib := fakeLib(t)
	t.Run("cuInit fails", func(t *testing.T) {
		t.Setenv("FAKECUDA_INIT_ERROR", "100")
		_, err := openGPUs(lib, 0, nil)
		if err == nil || !strings.Contains(err.Error(), "cuInit") || !strings.Contains(err.Error(), "CUDA_ERROR_NO_DEVICE") {
			t.Fatalf("got %v, want cuInit: CUDA_ERROR_NO_DEVICE", err)
		}
		t.Log(err)
		log, buf := newLog()
		devs, err := openKinds(KindAuto, lib, 0, false, log)
		if err != nil || len(devs) != 1 || devs[0].Target() != "host" {
			t.Fatalf("auto: %v, %v", devs, err)
		}
		if !strings.Contains(buf.String(), "CUDA_ERROR_NO_DEVICE") {
			t.Errorf("auto fallback log: %q", buf.String())
		}
		if _, err := openKinds(KindCUDA, lib, 0, false, nil); err == nil {
			t.Error("cuda: no error")
		}
	})
	t.Run("no devices", func(t *testing.T) {
		t.Setenv("FAKECUDA_DEVICES", "0")
		_, err := openGPUs(lib, 0, nil)
		if err == nil || !strings.Contains(err.Error(), "no CUDA devices") {
			t.Fatalf("got %v, want no CUDA devices", err)
		}
		t.Log(err)
	})
	t.Run("devices", func(t *testing.T) {
		t.Setenv("FAKECUDA_DEVICES", "3")
		devs, err := openKinds(KindCUDA, lib, 0, false, nil)
		if err != nil || len(devs) != 3 {
			t.Fatalf("got %d devices, %v", len(devs), err)
		}
		for i, d := range devs {
			if want := "(GPU " + string(rune('0'+i)) + ")"; !strings.HasSuffix(d.Name(), want) {
				t.Errorf("device %d is %q", i, d.Name())
			}
			d.Close()
		}
	})
}

func TestListGPUs(t *testing.T) {
	gpus, err := ListGPUs()
	if err != nil {
		if !errors.Is(err, ErrNoDriver) || !strings.Contains(err.Error(), "no NVIDIA driver") {
			t.Fatalf("ListGPUs: %v, want an error wrapping ErrNoDriver", err)
		}
		t.Log(err)
		return
	}
	if len(gpus) == 0 {
		t.Fatal("the driver reports no GPUs")
	}
	for _, g := range gpus {
		t.Logf("%+v", g)
		if g.Name == "" || g.UUID == "" || g.MemoryTotal <= 0 || g.DriverVersion == "" {
			t.Errorf("incomplete: %+v", g)
		}
	}
}

func TestStickyCodes(t *testing.T) {
	for _, c := range []int{700, 702, 710, 714, 715, 716, 717, 718, 719, 721, 226, 810, 911} {
		if !stickyCode(c) {
			t.Errorf("%d is not sticky", c)
		}
	}
	for _, c := range []int{0, 1, 2, 9, 98, 200, 209, 701, 720, 805, 807, 900, 901, 910} {
		if stickyCode(c) {
			t.Errorf("%d is sticky", c)
		}
	}
	// A lost MPS server is not sticky by the driver's list, but it ends
	// the context all the same.
	for _, c := range []int{805, 806, 807, 808, 809, 810, 700} {
		if !(&DriverError{Code: c}).EndsContext() {
			t.Errorf("%d does not end the context", c)
		}
	}
	for _, c := range []int{0, 1, 2, 712, 713, 804, 811, 900} {
		if (&DriverError{Code: c}).EndsContext() {
			t.Errorf("%d ends the context", c)
		}
	}
	if !errors.Is(&DriverError{Code: 2}, ErrOutOfMemory) {
		t.Error("CUDA_ERROR_OUT_OF_MEMORY does not wrap ErrOutOfMemory")
	}
}
