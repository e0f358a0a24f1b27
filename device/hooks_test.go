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

// unexportedHooksSource defines the hooks as plain functions, without
// PLOVER_EXPORT: plover.h's declarations alone make them C functions the
// runtime finds. check fails the run unless both ran.
const unexportedHooksSource = `#include "plover.h"
PLOVER_BUNDLE("host");
static int program_tag, instance_tag;
void plover_load(plover_state_t *s) { s->program = &program_tag; }
void plover_instance_init(plover_state_t *s) { s->instance = &instance_tag; }
PLOVER_ENTRY(check) {
  if (s->program != &program_tag) plover_fail(s, "plover_load never ran");
  else if (s->instance != &instance_tag) plover_fail(s, "plover_instance_init never ran");
}
`

// A hook defined without PLOVER_EXPORT runs: in C++ its name was mangled,
// under -fvisibility=hidden not exported, and either way the function ran
// without it.
func TestHostHooksWithoutExport(t *testing.T) {
	for _, tt := range []struct {
		name string
		args []string
	}{
		{"C++", nil},
		{"C++ with hidden visibility", []string{"-fvisibility=hidden"}},
		{"C", []string{"-x", "c"}},
		{"C with hidden visibility", []string{"-x", "c", "-fvisibility=hidden"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			prog := loadSource(t, "hooks", unexportedHooksSource, "check", func(t testing.TB, src, dir, name string) string {
				return testkit.BuildLib(t, src, dir, name, tt.args...)
			})
			inst := testkit.HostInstance(t, prog, 16, 16)
			if err := inst.Run(&device.Run{Output: make([]byte, 16), Chain: []device.Step{{Entry: 0, Grid: 1, Block: 1}}}); err != nil {
				t.Fatalf("run: %v", err)
			}
		})
	}
}
