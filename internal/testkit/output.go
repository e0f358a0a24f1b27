package testkit

import (
	"path/filepath"

	"github.com/plover-run/plover/abi"
)

// OutputSource is the source of the printing test kernels: say (a line on
// stdout, one on stderr, one per thread from a kernel), say_then_crash,
// flood (grid lines, then one of 10000 bytes, then "flood done") and
// say_then_spin. Build it with BuildLib.
func OutputSource() string { return filepath.Join(Root(), "internal", "testkit", "output.cu") }

// OutputManifest is a manifest for the printing kernels (library
// output.so), its chain the one kernel named.
func OutputManifest(name, kernel string, grid, block int) *abi.Manifest {
	m := Manifest(name)
	m.Library = "output.so"
	m.Chain = []abi.Launch{{Kernel: kernel, Grid: grid, Block: block}}
	return m
}
