package device_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/device"
	"github.com/plover-run/plover/internal/testkit"
)

// overrunEnv is testdata/overrun.cu loaded on a checked host device.
type overrunEnv struct {
	prog device.Program
	inst device.Instance
}

const (
	ovMaxIn = 10000
	ovTmp   = 3000
	ovOut   = 8192
)

func loadOverrun(t testing.TB, reportFaults bool) *overrunEnv {
	t.Helper()
	prog := loadOverrunProgram(t, reportFaults)
	inst, err := prog.NewInstance(device.InstanceConfig{MaxInput: ovMaxIn, Tmp: ovTmp, Out: ovOut})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(inst.Close)
	return &overrunEnv{prog: prog, inst: inst}
}

func loadOverrunProgram(t testing.TB, reportFaults bool) device.Program {
	t.Helper()
	// A child of TestCheckedGuardFault dies of SIGSEGV before its cleanups
	// run, so it builds in the directory its parent made and removes.
	dir := os.Getenv("PLOVER_CHECKED_DIR")
	if dir == "" {
		dir = t.TempDir()
	}
	so := testkit.BuildLib(t, testkit.OverrunSource(), dir, "overrun.so", "-std=c++17", "-Wall", "-Wextra")
	h := device.NewHost(0)
	reportFD := -1 // no handler
	if reportFaults {
		reportFD = 2 // stderr alone
	}
	if err := h.EnableChecks(reportFD); err != nil {
		t.Fatal(err)
	}
	m := &abi.Manifest{Name: "overrun", ABI: abi.Major, Target: abi.TargetHost, Library: filepath.Base(so),
		MaxInputBytes: ovMaxIn, TmpBytes: ovTmp, OutBytes: ovOut, Chain: []abi.Launch{{Kernel: "fill", Grid: 1, Block: 1}}}
	prog, err := h.Load(context.Background(), device.ProgramSpec{Dir: filepath.Dir(so), Manifest: m})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { prog.Close() })
	return prog
}

// TestCheckedInstanceInit: plover_instance_init is checked as a chain's
// entries are. A near overrun fails the instance naming the hook, the
// buffer (all of its capacity in use) and the bytes; a far one (below, in
// TestCheckedGuardFault) is named as the process dies.
func TestCheckedInstanceInit(t *testing.T) {
	t.Setenv("PLOVER_OVERRUN_INIT", "0 10") // in: 10,000 bytes, 240 of padding
	prog := loadOverrunProgram(t, false)
	_, err := prog.NewInstance(device.InstanceConfig{MaxInput: ovMaxIn, Tmp: ovTmp, Out: ovOut})
	want := "plover: checked mode: hook plover_instance_init wrote past the end of in (10000 bytes, all of it): bytes 10000 to 10009 changed"
	var ke *device.KernelError
	if !errors.As(err, &ke) || ke.Msg != want {
		t.Fatalf("NewInstance: %v, want a kernel error %q", err, want)
	}
	t.Setenv("PLOVER_OVERRUN_INIT", "")
	inst, err := prog.NewInstance(device.InstanceConfig{MaxInput: ovMaxIn, Tmp: ovTmp, Out: ovOut})
	if err != nil {
		t.Fatalf("an instance whose init writes nothing past: %v", err)
	}
	// A near overrun in fini, whose failure is ignored, is still told:
	// on stderr, which in a worker is the function's output.
	t.Setenv("PLOVER_OVERRUN_FINI", "0 5") // in, as init above
	stderr := captureStderr(t, inst.Close)
	if want := "plover: checked mode: hook plover_instance_fini wrote past the end of in (10000 bytes, all of it): bytes 10000 to 10004 changed\n"; stderr != want {
		t.Errorf("fini's overrun: stderr %q, want %q", stderr, want)
	}
}

// captureStderr is what f writes to os.Stderr.
func captureStderr(t *testing.T, f func()) string {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	saved := os.Stderr
	os.Stderr = w
	f()
	os.Stderr = saved
	w.Close()
	b, _ := io.ReadAll(r)
	r.Close()
	return string(b)
}

// run runs fill and then entry (grid, block) over in, with tmpLen bytes of
// tmp and outLen of out.
func (e *overrunEnv) run(t testing.TB, entry string, grid, block int32, in []byte, tmpLen, outLen int) ([]byte, error) {
	t.Helper()
	fill, err := e.prog.Entry("fill")
	if err != nil {
		t.Fatal(err)
	}
	idx, err := e.prog.Entry(entry)
	if err != nil {
		t.Fatal(err)
	}
	out := make([]byte, outLen)
	r := &device.Run{Input: in, Output: out, TmpLen: int64(tmpLen), ZeroOut: true, ZeroTmp: true,
		Chain: []device.Step{{Entry: fill}, {Entry: idx, Grid: grid, Block: block}}}
	err = e.inst.Run(r)
	return out[:r.OutLen], err
}

// TestCheckedOverrunWithinPadding: an overrun shorter than the padding
// between a buffer's end and its guard page (the buffers start 256-byte
// aligned) fails the request after the entry, naming the entry, the buffer
// and the bytes; the instance then serves a clean request.
func TestCheckedOverrunWithinPadding(t *testing.T) {
	e := loadOverrun(t, false)
	in := bytes.Repeat([]byte{1, 2, 3}, 1000) // 3000 bytes: 72 of padding after in
	for _, tt := range []struct {
		entry        string
		grid, block  int32
		tmpLen, outN int
		want         string
	}{
		{"overrun", 1, 2, 100, 4000, "entry overrun wrote past the end of out (4000 bytes this request): bytes 4000 to 4000 changed"},
		{"overrun", 96, 2, 100, 4000, "bytes 4000 to 4095 changed"},
		// tmp is checked at its capacity (ovTmp), whatever this request's length.
		{"overrun", 8, 1, ovTmp, 4000, "entry overrun wrote past the end of tmp (3000 bytes, all of it): bytes 3000 to 3007"},
		{"overrun", 72, 0, 0, 4000, "entry overrun wrote past the end of in (3000 bytes this request): bytes 3000 to 3071"},
		{"overrun_kernel", 20, 2, 0, 1000, "entry overrun_kernel wrote past the end of out (1000 bytes this request): bytes 1000 to 1019"},
	} {
		t.Run(fmt.Sprintf("%s %d past %d", tt.entry, tt.grid, tt.block), func(t *testing.T) {
			_, err := e.run(t, tt.entry, tt.grid, tt.block, in, tt.tmpLen, tt.outN)
			var ke *device.KernelError
			if !errors.As(err, &ke) || !strings.Contains(ke.Msg, tt.want) {
				t.Fatalf("Run: %v, want a kernel error containing %q", err, tt.want)
			}
			out, err := e.run(t, "overrun", 0, 2, in, 10, 3500)
			if err != nil || len(out) != 3500 || !bytes.Equal(out[:3000], in) || out[3499] != 0xEE {
				t.Fatalf("the next request: %v, %d bytes", err, len(out))
			}
		})
	}
}

// TestCheckedReadInPadding pins what docs/debugging.md says of reads:
// only writes are caught within the padding. A read past in's end that
// stays before the guard page returns the pattern (0xFD bytes) and the run
// succeeds: in cannot end flush against its guard, as every buffer starts
// 256-byte aligned (plover.h) and a page is the guard's unit.
func TestCheckedReadInPadding(t *testing.T) {
	e := loadOverrun(t, false)
	out, err := e.run(t, "overread", 96, 0, make([]byte, 4000), 0, 1000) // 4000 bytes: 96 of padding
	if err != nil || !bytes.Equal(out, bytes.Repeat([]byte{0xFD}, 96)) {
		t.Fatalf("96 bytes read past 4000 of in: %v, %x; want the pattern, no error", err, out)
	}
}

// TestCheckedTmpKept: tmp keeps what the previous request on this
// instance left (plover.h), whatever tmp length each request runs with:
// checked mode places tmp once, at its capacity. It was placed per
// request, as in and out are, so a request with less tmp moved it, the
// pattern written after its end overwrote the kept bytes, and the reads
// below found other bytes. A write past a request's tmp length but within
// the capacity is no overrun: the instance's own memory, which holds its
// state.
func TestCheckedTmpKept(t *testing.T) {
	e := loadOverrun(t, false)
	step := func(entry string, grid, block int32, tmpLen int) ([]byte, error) {
		t.Helper()
		idx, err := e.prog.Entry(entry)
		if err != nil {
			t.Fatal(err)
		}
		out := make([]byte, ovOut)
		r := &device.Run{Input: []byte{1}, Output: out, TmpLen: int64(tmpLen),
			Chain: []device.Step{{Entry: idx, Grid: grid, Block: block}}}
		err = e.inst.Run(r)
		return out[:r.OutLen], err
	}
	want := make([]byte, ovTmp)
	for i := range want {
		want[i] = byte(i%251 + 1)
	}
	if _, err := step("tmp_write", 0, 0, ovTmp); err != nil {
		t.Fatal(err)
	}
	for _, n := range []int{1000, ovTmp} {
		got, err := step("tmp_read", 0, 0, n)
		if err != nil {
			t.Fatalf("tmp_read of %d bytes: %v", n, err)
		}
		if len(got) != n || !bytes.Equal(got, want[:n]) {
			t.Fatalf("tmp_read of %d bytes after a write of %d: %s", n, ovTmp, firstDiff(got, want[:n]))
		}
	}
	if _, err := step("overrun", 8, 1, 1000); err != nil {
		t.Fatalf("8 bytes written past 1000 of tmp's %d: %v", ovTmp, err)
	}
	copy(want[1000:], bytes.Repeat([]byte{0xAB}, 8))
	got, err := step("tmp_read", 0, 0, ovTmp)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != ovTmp || !bytes.Equal(got, want) {
		t.Fatalf("tmp after 8 bytes written past 1000: %s", firstDiff(got, want))
	}
}

// TestCheckedGuardFault: an overrun that reaches the guard page kills the
// process at the faulting access, after one line on stderr naming the
// entry, the buffer and the offset. The process is this test binary run
// again (checkedChild), as a worker would be.
func TestCheckedGuardFault(t *testing.T) {
	if os.Getenv("PLOVER_CHECKED_CHILD") != "" {
		checkedChild(t)
		return
	}
	for _, tt := range []struct {
		entry, args string
		want        string
	}{
		{"overrun", "300 2 4096", "entry overrun wrote past the end of out, at byte 4096 (4096 bytes this request)"},
		{"overrun", "5000 1 3000", "entry overrun wrote past the end of tmp, at byte 3072 (3000 bytes, all of it)"},
		{"overrun", "-1 2 8192", "entry overrun wrote before the start of out, 1 bytes before it (8192 bytes this request)"},
		{"overrun_kernel", "300 2 4096", "entry overrun_kernel wrote past the end of out, at byte 4096"},
		{"init", "2 1 0", "hook plover_instance_init wrote past the end of out, at byte 8192 (8192 bytes, all of it)"},
		// After a request of 1 byte: fini sees in at its full 10,000.
		{"fini", "0 300 0", "hook plover_instance_fini wrote past the end of in, at byte 10240 (10000 bytes, all of it)"},
	} {
		t.Run(tt.entry+" "+tt.args, func(t *testing.T) {
			cmd := exec.Command(os.Args[0], "-test.run=^TestCheckedGuardFault$", "-test.count=1")
			cmd.Env = append(os.Environ(), "PLOVER_CHECKED_CHILD="+tt.entry+" "+tt.args, "PLOVER_CHECKED_DIR="+t.TempDir())
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			err := cmd.Run()
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.ProcessState.String() != "signal: segmentation fault" {
				t.Fatalf("child: %v, want killed by SIGSEGV\n%s", err, stderr.String())
			}
			if want := "plover: checked mode: " + tt.want; !strings.Contains(stderr.String(), want) {
				t.Fatalf("stderr lacks %q:\n%s", want, stderr.String())
			}
		})
	}
}

// checkedChild runs PLOVER_CHECKED_CHILD's "entry grid block outLen" with
// the fault handler installed; it should not return.
func checkedChild(t *testing.T) {
	f := strings.Fields(os.Getenv("PLOVER_CHECKED_CHILD"))
	switch f[0] { // plover_instance_init or _fini writes f[2] bytes past buffer f[1]
	case "init":
		t.Setenv("PLOVER_OVERRUN_INIT", f[1]+" "+f[2])
		_, err := loadOverrunProgram(t, true).NewInstance(device.InstanceConfig{MaxInput: ovMaxIn, Tmp: ovTmp, Out: ovOut})
		t.Fatalf("the overrun returned: %v", err)
	case "fini":
		t.Setenv("PLOVER_OVERRUN_FINI", f[1]+" "+f[2])
		e := loadOverrun(t, true)
		if _, err := e.run(t, "overrun", 0, 2, []byte{1}, 10, 100); err != nil {
			t.Fatal(err)
		}
		e.inst.Close()
		t.Fatal("the overrun in fini returned")
	}
	grid, _ := strconv.Atoi(f[1])
	block, _ := strconv.Atoi(f[2])
	outLen, _ := strconv.Atoi(f[3])
	e := loadOverrun(t, true)
	_, err := e.run(t, f[0], int32(grid), int32(block), make([]byte, 100), ovTmp, outLen)
	t.Fatalf("the overrun returned: %v", err)
}

// BenchmarkChecked is checked mode's cost on a run of echo (out = in, a
// memcpy): in place, as a worker runs unchecked, against checked (a copy
// in, the patterns placed and checked, a copy out).
func BenchmarkChecked(b *testing.B) {
	so := testkit.BuildLib(b, testkit.OverrunSource(), b.TempDir(), "overrun.so", "-std=c++17", "-O2")
	for _, size := range []int{4 << 10, 4 << 20} {
		for _, checked := range []bool{false, true} {
			name := fmt.Sprintf("%dKiB/in-place", size>>10)
			if checked {
				name = fmt.Sprintf("%dKiB/checked", size>>10)
			}
			b.Run(name, func(b *testing.B) {
				h := device.NewHost(0)
				if checked {
					h.EnableChecks(-1)
				}
				m := &abi.Manifest{Name: "echo", ABI: abi.Major, Target: abi.TargetHost, Library: filepath.Base(so),
					MaxInputBytes: int64(size), OutBytes: int64(size), Chain: []abi.Launch{{Kernel: "echo", Grid: 1, Block: 1}}}
				prog, err := h.Load(context.Background(), device.ProgramSpec{Dir: filepath.Dir(so), Manifest: m})
				if err != nil {
					b.Fatal(err)
				}
				defer prog.Close()
				inst, err := prog.NewInstance(device.InstanceConfig{MaxInput: int64(size), Out: int64(size)})
				if err != nil {
					b.Fatal(err)
				}
				defer inst.Close()
				idx, _ := prog.Entry("echo")
				in, out := bytes.Repeat([]byte{7}, size), make([]byte, size)
				r := &device.Run{Input: in, Output: out, Chain: []device.Step{{Entry: idx}}, InPlace: !checked}
				b.SetBytes(int64(size))
				for b.Loop() {
					if err := inst.Run(r); err != nil || r.OutLen != int64(size) {
						b.Fatal(err, r.OutLen)
					}
				}
			})
		}
	}
}
