package engine_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/call"
	"github.com/plover-run/plover/device"
	"github.com/plover-run/plover/engine"
	"github.com/plover-run/plover/internal/testkit"
)

// A function whose plover_instance_init always fails backs off after the
// crash limit even when an eviction unloads it between its requests.
// Before, the eviction left a fresh copy of its version with no crash
// record, and it failed for ever without backing off (review G, LOW 7).
func TestEvictionKeepsTheCrashRecord(t *testing.T) {
	mh := &abi.Manifest{Name: "h", ABI: abi.Major, Target: abi.TargetHost, Library: "hooks.so", Constants: "w.bin",
		MaxInputBytes: 1 << 10, OutBytes: 256, Chain: []abi.Launch{{Kernel: "report", Grid: 1, Block: 1}}}
	dir := t.TempDir()
	testkit.BuildLib(t, testkit.HooksSource(), dir, mh.Library, "-DFAIL_INIT")
	testkit.WriteManifest(t, dir, mh)
	if err := os.WriteFile(filepath.Join(dir, mh.Constants), make([]byte, 64<<10), 0o644); err != nil {
		t.Fatal(err)
	}
	per := instanceBytesOf(testkit.Manifest("o"))
	host := device.NewHost(per + 32<<10) // o's instance or h's constants, not both
	e := testkit.Engine(t, engine.Config{Devices: []device.Device{host}})
	testkit.Deploy(t, e, dir)
	testkit.Deploy(t, e, testkit.BundleDir(t, testkit.Manifest("o"), nil))
	for i := range 12 {
		err := e.Invoke(context.Background(), "h", &call.Request{Input: []byte{1}})
		if err == nil {
			t.Fatal("h ran: its plover_instance_init fails")
		}
		if strings.Contains(err.Error(), "backing off") {
			if i < 5 {
				t.Fatalf("h backed off after %d failures, before the crash limit", i)
			}
			return
		}
		invoke(t, e, "o", []byte{1}) // evicts h, loaded with no instance
		if fi := info(t, e, "h"); fi.Loaded {
			t.Fatalf("round %d: o's room did not come from evicting h (device: %+v)", i, host.MemInfo())
		}
	}
	t.Fatal("h failed plover_instance_init 12 times, with an eviction between each, and never backed off")
}
