package testkit

import (
	"path/filepath"

	"github.com/plover-run/plover/abi"
)

// OverrunSource is the source of the overrunning test kernels for checked
// mode: overrun (grid bytes past the end of the buffer block names: 0 in,
// 1 tmp, 2 out; a negative grid writes before its start), overread (as
// out, grid bytes read from that buffer's end on), overrun_kernel
// (the same from a simulated CUDA kernel), fill (well-behaved: writes tmp
// and out, echoing in), echo (out = in), and tmp_write and tmp_read (tmp
// as kept state: tmp[i] = i%251+1 over tmp.len; tmp's first bytes as
// out). Build it with BuildLib.
func OverrunSource() string { return filepath.Join(Root(), "internal", "testkit", "overrun.cu") }

// OverrunManifest is a manifest for the overrunning kernels (library
// overrun.so): fill, then overrun of grid bytes past out (out_bytes of
// out, tmp_bytes of tmp).
func OverrunManifest(name string, grid int, out, tmp int64) *abi.Manifest {
	m := Manifest(name)
	m.Library = "overrun.so"
	m.OutBytes, m.TmpBytes = out, tmp
	m.Chain = []abi.Launch{{Kernel: "fill", Grid: 1, Block: 1}, {Kernel: "overrun", Grid: grid, Block: 2}}
	return m
}
