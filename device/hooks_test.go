package device_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/device"
	"github.com/plover-run/plover/internal/testkit"
	"github.com/plover-run/plover/loader"
)

// TestHostHooks runs the ABI 2 lifecycle on the host device: each hook once,
// in order, with the constants writable at load; and a failing hook fails
// its step without the matching teardown hook running.
func TestHostHooks(t *testing.T) {
	tests := []struct {
		name    string
		define  string
		loadErr string
		instErr string
		want    [4]int64 // load, init, fini, unload
	}{
		{"all succeed", "", "", "", [4]int64{1, 1, 1, 1}},
		{"load fails", "-DFAIL_LOAD", "plover_load failed: the weights are corrupt", "", [4]int64{1, 0, 0, 0}},
		{"init fails", "-DFAIL_INIT", "", "plover_instance_init failed: no handle for this instance", [4]int64{1, 1, 0, 1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			args := []string{}
			if tt.define != "" {
				args = append(args, tt.define)
			}
			lib := testkit.BuildLib(t, testkit.HooksSource(), dir, "hooks.so", args...)
			if err := os.WriteFile(filepath.Join(dir, "c.bin"), []byte{1, 2, 3}, 0o644); err != nil {
				t.Fatal(err)
			}
			m := testkit.Manifest("hooks")
			m.Library, m.Constants, m.Chain = "hooks.so", "c.bin", []abi.Launch{{Kernel: "report", Grid: 1, Block: 1}}
			// Our own handle keeps the library (and its counters) loaded
			// after the program closes its own.
			own, err := loader.Open(lib, abi.TargetHost, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer own.Close()
			sym, err := own.Symbol("hooks_calls")
			if err != nil {
				t.Fatal(err)
			}
			calls := (*[4]int64)(sym)

			prog, err := device.NewHost(0).Load(context.Background(), device.ProgramSpec{Dir: dir, Manifest: m})
			if tt.loadErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.loadErr) {
					t.Fatalf("Load: %v, want %q", err, tt.loadErr)
				}
			} else if err != nil {
				t.Fatal(err)
			} else {
				inst, err := prog.NewInstance(device.InstanceConfig{MaxInput: 16, Out: 64})
				if tt.instErr != "" {
					if err == nil || !strings.Contains(err.Error(), tt.instErr) {
						t.Fatalf("NewInstance: %v, want %q", err, tt.instErr)
					}
				} else if err != nil {
					t.Fatal(err)
				} else {
					r := &device.Run{Output: make([]byte, 64), Chain: []device.Step{{Entry: 0, Grid: 1, Block: 1}}}
					if err := inst.Run(r); err != nil {
						t.Fatal(err)
					}
					if got := r.Output[:r.OutLen]; r.OutLen != 12 || got[0] != 0xfe || got[2] != 0xfc || got[3] != 1 || got[11] != 1 {
						t.Fatalf("report: %v (want the constants decoded by plover_load, count 1, program tag 1)", got)
					}
					inst.Close()
				}
				prog.Close()
			}
			if *calls != tt.want {
				t.Fatalf("hook calls (load, init, fini, unload) = %v, want %v", *calls, tt.want)
			}
		})
	}
}
