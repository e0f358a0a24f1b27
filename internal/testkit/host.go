package testkit

import (
	"context"
	"testing"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/device"
)

// HostProgram loads the bundle in dir, described by m, on a host device of
// the test's own process; it is closed when the test ends.
func HostProgram(t testing.TB, dir string, m *abi.Manifest) device.Program {
	t.Helper()
	prog, err := device.NewHost(0).Load(context.Background(), device.ProgramSpec{Dir: dir, Manifest: m})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { prog.Close() })
	return prog
}

// HostInstance is a new instance of prog with maxInput bytes of input and
// out of output, closed when the test ends (before its program, whose
// cleanup was registered first).
func HostInstance(t testing.TB, prog device.Program, maxInput, out int64) device.Instance {
	t.Helper()
	inst, err := prog.NewInstance(device.InstanceConfig{MaxInput: maxInput, Out: out})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(inst.Close)
	return inst
}
