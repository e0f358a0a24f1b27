// Package samples_test checks what the samples without a test package of
// their own (vecadd, spin) answer a malformed request: the client's fault
// (plover_reject, 422), apart from the function's (plover_fail, 500).
package samples_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/plover-run/plover/bundle"
	"github.com/plover-run/plover/device"
	"github.com/plover-run/plover/internal/testkit"
)

// loadSample builds sample's host bundle from its source and plover.json,
// with consts as its constants file if it names one.
func loadSample(t *testing.T, sample string, consts []byte) device.Program {
	t.Helper()
	dir := t.TempDir()
	m, err := bundle.ReadManifest(sample)
	if err != nil {
		t.Fatal(err)
	}
	testkit.BuildLib(t, filepath.Join(sample, sample+".cu"), dir, m.Library, "-Wall", "-Wextra", "-Werror")
	if m.Constants != "" {
		if err := os.WriteFile(filepath.Join(dir, m.Constants), consts, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return testkit.HostProgram(t, dir, m)
}

func TestMalformedInputIsRefused(t *testing.T) {
	const floats = 16 // vecadd's constants vector
	progs := map[string]device.Program{}
	for _, tt := range []struct {
		sample  string
		in, out int    // the request's bytes, and out_bytes
		want    string // the refusal's or failure's message; "" succeeds
		refused bool
	}{
		{"vecadd", 4 * floats, 4 * floats, "", false},
		{"vecadd", 3, 4 * floats, "input length is not a multiple of 4 (float32)", true},
		{"vecadd", 4 * (floats + 1), 4 * (floats + 1), "input has more floats than the constants vector", true},
		{"vecadd", 4 * floats, 4*floats - 4, "out_bytes is smaller than the input", false},
		{"spin", 64, 64, "", false},
		{"spin", 5, 64, "input must be whole 32-bit words", true},
		{"spin", 64, 60, "out_bytes is smaller than the input", false},
	} {
		prog := progs[tt.sample]
		if prog == nil {
			prog = loadSample(t, tt.sample, make([]byte, 4*floats))
			progs[tt.sample] = prog
		}
		inst := testkit.HostInstance(t, prog, 1<<10, 1<<10)
		err := inst.Run(&device.Run{Input: make([]byte, tt.in), Output: make([]byte, tt.out), Chain: []device.Step{{Entry: 0, Grid: 1, Block: 64}}})
		var ke *device.KernelError
		switch {
		case tt.want == "" && err != nil:
			t.Errorf("%s, %d bytes in, %d out: %v", tt.sample, tt.in, tt.out, err)
		case tt.want != "" && (!errors.As(err, &ke) || ke.Rejected != tt.refused || !strings.Contains(ke.Msg, tt.want)):
			t.Errorf("%s, %d bytes in, %d out: %v, want %q, a refusal: %v", tt.sample, tt.in, tt.out, err, tt.want, tt.refused)
		}
	}
}
