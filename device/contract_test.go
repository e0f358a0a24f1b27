package device_test

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"unicode/utf8"
	"unsafe"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/device"
	"github.com/plover-run/plover/internal/testkit"
)

// contractSource: aligned_echo fails a run whose input, tmp or out does not
// start 256-byte aligned (plover.h's promise, cudaMalloc's), else echoes
// the input; refuse_long refuses with 254 'a's and an "é" (256 bytes).
const contractSource = `#include <stdint.h>
#include <string.h>
#include "plover_kernel.h"
PLOVER_BUNDLE(PLOVER_TARGET);
PLOVER_ENTRY(aligned_echo) {
  (void)grid; (void)block;
  if ((uintptr_t)s->input.dat % 256) { plover_fail(s, "input is not 256-byte aligned"); return; }
  if ((uintptr_t)s->tmp.dat % 256) { plover_fail(s, "tmp is not 256-byte aligned"); return; }
  if ((uintptr_t)s->out.dat % 256) { plover_fail(s, "out is not 256-byte aligned"); return; }
  size_t n = s->input.len < s->out.len ? s->input.len : s->out.len;
  memcpy(s->out.dat, s->input.dat, n);
  s->out.len = n;
}
PLOVER_ENTRY(refuse_long) {
  (void)grid; (void)block;
  static const char e_acute[] = "\xc3\xa9";
  char msg[257];
  memset(msg, 'a', 254);
  memcpy(msg + 254, e_acute, 3);
  plover_reject(s, msg);
}
`

func loadContract(t *testing.T) device.Program {
	return loadSource(t, "contract", contractSource, "aligned_echo", buildHost)
}

// builder builds a test's source file src into dir/name: testkit.BuildLib
// or testkit.BuildCUDALib.
type builder func(t testing.TB, src, dir, name string) string

// buildHost is testkit.BuildLib with no more arguments.
func buildHost(t testing.TB, src, dir, name string) string {
	return testkit.BuildLib(t, src, dir, name)
}

// loadSource writes source as name.cu, builds it with build into name.so
// and loads that on the host device as function name, of the one entry
// (closed when the test ends).
func loadSource(t *testing.T, name, source, entry string, build builder) device.Program {
	t.Helper()
	dir := t.TempDir()
	src := filepath.Join(dir, name+".cu")
	if err := os.WriteFile(src, []byte(source), 0o644); err != nil {
		t.Fatal(err)
	}
	build(t, src, dir, name+".so")
	m := testkit.Manifest(name)
	m.Library, m.Chain = name+".so", []abi.Launch{{Kernel: entry, Grid: 1, Block: 1}}
	return testkit.HostProgram(t, dir, m)
}

// A run in place (a worker's slot: out at SlotOut(max_input_bytes) into it, any
// number of bytes) still gives the chain 256-byte-aligned buffers, as a
// run that is not in place and the CUDA target do; the output lands in
// the slot all the same.
func TestHostInPlaceBuffersAreAligned(t *testing.T) {
	prog := loadContract(t)
	const maxIn, out = 1000, 64
	inst, err := prog.NewInstance(device.InstanceConfig{MaxInput: maxIn, Tmp: 32, Out: out})
	if err != nil {
		t.Fatal(err)
	}
	defer inst.Close()
	idx, _ := prog.Entry("aligned_echo")
	buf := make([]byte, 2*256+maxIn+out)
	// A slot whose input starts aligned (an mmap) and whose out does not.
	skip := (256 - int(uintptr(unsafe.Pointer(&buf[0]))%256)) % 256
	slot := buf[skip : skip+maxIn+out]
	in := []byte("hello, aligned world")
	copy(slot, in)
	r := &device.Run{Input: slot[:len(in)], Output: slot[maxIn : maxIn+out], TmpLen: 32,
		Chain: []device.Step{{Entry: idx, Grid: 1, Block: 1}}, InPlace: true}
	if err := inst.Run(r); err != nil {
		t.Fatalf("in-place run: %v", err)
	}
	if got := slot[maxIn : maxIn+r.OutLen]; !bytes.Equal(got, in) {
		t.Fatalf("out = %q (%d bytes), want %q", got, r.OutLen, in)
	}
}

// plover_reject keeps up to 255 bytes of its message; a character the cut
// splits is dropped, so the refusal is valid UTF-8.
func TestRejectTruncationKeepsWholeCharacters(t *testing.T) {
	prog := loadContract(t)
	inst, err := prog.NewInstance(device.InstanceConfig{MaxInput: 16, Out: 16})
	if err != nil {
		t.Fatal(err)
	}
	defer inst.Close()
	idx, _ := prog.Entry("refuse_long")
	err = inst.Run(&device.Run{Input: []byte("x"), Output: make([]byte, 16), Chain: []device.Step{{Entry: idx, Grid: 1, Block: 1}}})
	var ke *device.KernelError
	if !errors.As(err, &ke) || !ke.Rejected {
		t.Fatalf("run: %v, want a refusal", err)
	}
	if want := strings.Repeat("a", 254); ke.Msg != want || !utf8.ValidString(ke.Msg) {
		t.Fatalf("refusal is %d bytes ending %q, want the 254 a's (the é cut in two dropped)", len(ke.Msg), ke.Msg[max(0, len(ke.Msg)-3):])
	}
}
