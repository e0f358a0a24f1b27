package device

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
)

// fakeMem is a memReader whose figures a test sets.
type fakeMem struct {
	free, total int64
	err         error
	closed      atomic.Int32
}

func (m *fakeMem) memInfo() (int64, int64, error) { return m.free, m.total, m.err }
func (m *fakeMem) close()                         { m.closed.Add(1) }

// withMemReader makes bare GPUs read their memory through open for one
// test.
func withMemReader(t *testing.T, open func(uuid [16]byte) (memReader, error)) {
	t.Helper()
	old := openMemReader
	openMemReader = open
	t.Cleanup(func() { openMemReader = old })
}

// fakeRetains counts the fake driver's primary context retains in this
// process.
func fakeRetains(t *testing.T) *int64 {
	t.Helper()
	p, err := fakeEnv(t).lib.Symbol("fakecu_ctx_retains")
	if err != nil {
		t.Fatal(err)
	}
	return (*int64)(p)
}

// Under MPS a server whose functions run in worker processes opens its
// GPUs bare: it retains no context, so it is none of the MPS server's
// clients, whose fatal fault would otherwise make that server wait for
// this one to exit. Name and memory come without a context; free memory
// from the reader (NVML's), matched by the UUID CUDA gives the device;
// nothing loads on it here, and closing it releases nothing.
func TestFakeBareOpenHoldsNoContext(t *testing.T) {
	retains := fakeRetains(t)
	var uuids [][16]byte
	mems := map[byte]*fakeMem{}
	withMemReader(t, func(u [16]byte) (memReader, error) {
		uuids = append(uuids, u)
		m := &fakeMem{free: 300 << 20, total: 1 << 30}
		mems[u[15]] = m
		return m, nil
	})
	before := atomic.LoadInt64(retains)
	log, buf := newLog()
	devs, err := openKinds(KindCUDA, fakeLib(t), 512<<20, true, log)
	if err != nil {
		t.Fatal(err)
	}
	if got := atomic.LoadInt64(retains) - before; got != 0 {
		t.Errorf("opening bare retained %d primary contexts, want none", got)
	}
	if len(devs) != 2 || len(uuids) != 2 {
		t.Fatalf("%d devices, %d UUIDs read, want 2 and 2", len(devs), len(uuids))
	}
	for i, u := range uuids {
		if string(u[:8]) != "fakecuda" || u[15] != byte(i) {
			t.Errorf("device %d: the reader got UUID %x, want the fake's", i, u)
		}
	}
	if !strings.Contains(buf.String(), "context=\"none") {
		t.Errorf("the log does not say the device holds no context:\n%s", buf)
	}
	g := devs[0].(*GPU)
	// Budget 512 MiB of a 1 GiB device: the budget is the total, and the
	// device's free memory bounds the free.
	if m := g.MemInfo(); m.Total != 512<<20 || m.Free != 300<<20 || m.Used != 0 {
		t.Errorf("MemInfo: %+v, want total 512 MiB (the budget), free 300 MiB (NVML's)", m)
	}
	if err := g.Health(); err != nil {
		t.Errorf("health: %v", err)
	}
	if _, err := g.Load(context.Background(), ProgramSpec{}); err == nil || !strings.Contains(err.Error(), "without a CUDA context") {
		t.Errorf("Load on a bare GPU: %v, want a refusal saying it has no context", err)
	}
	if _, err := g.LoadConstants(strings.NewReader("x"), 1); err == nil {
		t.Error("LoadConstants on a bare GPU: no error")
	}
	for _, d := range devs {
		if err := d.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
	}
	for i, m := range mems {
		if m.closed.Load() != 1 {
			t.Errorf("device %d: its reader closed %d times, want 1", i, m.closed.Load())
		}
	}
	if got := atomic.LoadInt64(retains) - before; got != 0 {
		t.Errorf("%d primary contexts retained by the end, want none", got)
	}
}

// A read that fails later leaves the budget's figures, says so once and
// poisons nothing: the bare GPU met no CUDA error of its own.
func TestFakeBareMemInfoFailure(t *testing.T) {
	m := &fakeMem{free: 100, total: 1 << 30}
	withMemReader(t, func([16]byte) (memReader, error) { return m, nil })
	log, buf := newLog()
	gpus := openBareFake(t, log)
	g := gpus[0]
	m.err = errors.New("nvml GPU-x memory: ERROR_GPU_IS_LOST")
	for i := 0; i < 3; i++ {
		if mi := g.MemInfo(); mi.Total != 1<<30 || mi.Free != 1<<30 {
			t.Errorf("MemInfo with the read failing: %+v, want the device's memory (no budget)", mi)
		}
	}
	if n := strings.Count(buf.String(), "ERROR_GPU_IS_LOST"); n != 1 {
		t.Errorf("the failed read logged %d times, want once:\n%s", n, buf)
	}
	if err := g.Health(); err != nil {
		t.Errorf("health: %v", err)
	}
}

// Where NVML cannot read the GPU the server opens it with a context, as it
// did before, and the log says what that risks under MPS.
func TestFakeBareOpenWithoutNVMLHoldsAContextAndSaysSo(t *testing.T) {
	retains := fakeRetains(t)
	withMemReader(t, func([16]byte) (memReader, error) {
		return nil, errors.New("no NVIDIA driver: libnvidia-ml.so.1 not found")
	})
	before := atomic.LoadInt64(retains)
	log, buf := newLog()
	gpus := openBareFake(t, log)
	if got := atomic.LoadInt64(retains) - before; got != int64(len(gpus)) {
		t.Errorf("%d contexts retained for %d GPUs, want one each", got, len(gpus))
	}
	for _, want := range []string{"level=WARN", "MPS", "until the server restarts", "libnvidia-ml.so.1 not found"} {
		if !strings.Contains(buf.String(), want) {
			t.Errorf("the log lacks %q:\n%s", want, buf)
		}
	}
	if m := gpus[0].MemInfo(); m.Total != 1<<30 {
		t.Errorf("MemInfo through the context: %+v", m)
	}
}

// openNVMLMem, through go-nvml's mock of the library: the GPU is found by
// GPU-<uuid>, a MIG compute instance by MIG-<uuid> (cuDeviceGetUuid_v2's
// bytes either way), its memory read by nvmlDeviceGetMemoryInfo; a device
// NVML knows by neither name, or whose memory it cannot read, is an
// error, and NVML is shut down as often as it was initialised.
func TestNVMLMemByUUID(t *testing.T) {
	uuid := [16]byte{0x46, 0xe0, 0x62, 0x8a, 0x72, 0xf7, 0x2c, 0x15, 0xf9, 0x97, 0x8f, 0x88, 0xd0, 0x5b, 0xf0, 0x56}
	const text = "46e0628a-72f7-2c15-f997-8f88d05bf056"
	dev := func(ret nvml.Return) *mock.Device {
		return &mock.Device{GetMemoryInfoFunc: func() (nvml.Memory, nvml.Return) {
			return nvml.Memory{Total: 80 << 30, Free: 60 << 30, Used: 20 << 30}, ret
		}}
	}
	lib := func(known string, d *mock.Device, initRet nvml.Return) (*mock.Interface, *[]string) {
		var asked []string
		return &mock.Interface{
			InitFunc:     func() nvml.Return { return initRet },
			ShutdownFunc: func() nvml.Return { return nvml.SUCCESS },
			DeviceGetHandleByUUIDFunc: func(s string) (nvml.Device, nvml.Return) {
				asked = append(asked, s)
				if s == known {
					return d, nvml.SUCCESS
				}
				return nil, nvml.ERROR_NOT_FOUND
			},
		}, &asked
	}
	for _, tc := range []struct {
		name, known string
		memRet      nvml.Return
		initRet     nvml.Return
		wantErr     string
		wantAsked   int
	}{
		{"GPU", "GPU-" + text, nvml.SUCCESS, nvml.SUCCESS, "", 1},
		{"MIG", "MIG-" + text, nvml.SUCCESS, nvml.SUCCESS, "", 2},
		{"unknown", "MIG-GPU-" + text + "/1/0", nvml.SUCCESS, nvml.SUCCESS, "NVML knows no device", 2},
		{"memory unreadable", "GPU-" + text, nvml.ERROR_NOT_SUPPORTED, nvml.SUCCESS, "memory", 1},
		{"no library", "GPU-" + text, nvml.SUCCESS, nvml.ERROR_LIBRARY_NOT_FOUND, "libnvidia-ml.so.1 not found", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l, asked := lib(tc.known, dev(tc.memRet), tc.initRet)
			m, err := openNVMLMem(l, uuid)
			if len(*asked) != tc.wantAsked {
				t.Errorf("asked NVML for %q, want %d names", *asked, tc.wantAsked)
			}
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("openNVMLMem: %v, want an error naming %q", err, tc.wantErr)
				}
				if tc.initRet == nvml.SUCCESS && len(l.ShutdownCalls()) != 1 {
					t.Errorf("NVML shut down %d times after a failed open, want once", len(l.ShutdownCalls()))
				}
				if tc.initRet == nvml.ERROR_LIBRARY_NOT_FOUND && !errors.Is(err, ErrNoDriver) {
					t.Errorf("%v is not ErrNoDriver", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if m.name != tc.known {
				t.Errorf("found %s, want %s", m.name, tc.known)
			}
			free, total, err := m.memInfo()
			if err != nil || free != 60<<30 || total != 80<<30 {
				t.Errorf("memInfo: %d free of %d, %v", free, total, err)
			}
			m.close()
			if len(l.InitCalls()) != 1 || len(l.ShutdownCalls()) != 1 {
				t.Errorf("NVML initialised %d times, shut down %d", len(l.InitCalls()), len(l.ShutdownCalls()))
			}
		})
	}
}

// The real NVML path: here, without an NVIDIA driver, it says so (on a GPU
// machine the real-GPU test TestGPUBareOpen reads a GPU through it).
func TestNVMLMemWithoutDriver(t *testing.T) {
	m, err := openNVMLMem(sysNVML{}, [16]byte{1})
	if err == nil {
		m.close()
		t.Fatal("NVML found a device of a made-up UUID")
	}
	if _, lerr := ListGPUs(); lerr == nil {
		t.Skipf("an NVIDIA driver is present: %v", err)
	}
	if !errors.Is(err, ErrNoDriver) {
		t.Errorf("without a driver: %v, want ErrNoDriver", err)
	}
}

// On a GPU: opened bare, a device finds itself in the real NVML by the
// UUID CUDA gives it (no fall-back to a context, which would warn) and
// reads its memory there. Skipped without a GPU.
func TestGPUBareOpen(t *testing.T) {
	gpuEnv(t)
	log, buf := newLog()
	gpus, err := openBareGPUs(libcuda, 0, log)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		for _, g := range gpus {
			g.Close()
		}
	}()
	for _, g := range gpus {
		if g.mem == nil || g.ctx != nil {
			t.Errorf("%s: opened with a context, not bare:\n%s", g.Name(), buf)
			continue
		}
		m := g.MemInfo()
		t.Logf("%s (%s): cuDeviceTotalMem %d, NVML %+v", g.Name(), g.mem.(*nvmlMem).name, g.hwTotal, m)
		if m.Total <= 0 || m.Free <= 0 || m.Free > m.Total {
			t.Errorf("%s: MemInfo %+v", g.Name(), m)
		}
		if _, err := g.Load(context.Background(), ProgramSpec{}); err == nil {
			t.Errorf("%s: a bare GPU loaded a program", g.Name())
		}
	}
}

// openBareFake opens the fake driver's GPUs bare, closed as the test ends.
func openBareFake(t *testing.T, log *slog.Logger) []*GPU {
	t.Helper()
	gpus, err := openBareGPUs(fakeLib(t), 0, log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, g := range gpus {
			g.Close()
		}
	})
	return gpus
}
