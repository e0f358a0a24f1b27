package engine_test

import (
	"context"
	"github.com/plover-run/plover/api"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/call"
	"github.com/plover-run/plover/device"
	"github.com/plover-run/plover/engine"
	"github.com/plover-run/plover/internal/testkit"
)

// failingInit is a node whose one device holds o's instance or h's
// constants, not both, with h, whose plover_instance_init always fails,
// and o deployed; deployH deploys more of h before o (nil: none).
func failingInit(t *testing.T, deployH func(e *engine.Engine)) (*engine.Engine, api.FunctionInfo) {
	t.Helper()
	mh := &abi.Manifest{Name: "h", ABI: abi.Major, Target: abi.TargetHost, Library: "hooks.so", Constants: "w.bin",
		MaxInputBytes: 1 << 10, OutBytes: 256, Chain: []abi.Launch{{Kernel: "report", Grid: 1, Block: 1}}}
	dir := t.TempDir()
	testkit.BuildLib(t, testkit.HooksSource(), dir, mh.Library, "-DFAIL_INIT")
	testkit.WriteManifest(t, dir, mh)
	if err := os.WriteFile(filepath.Join(dir, mh.Constants), make([]byte, 64<<10), 0o644); err != nil {
		t.Fatal(err)
	}
	per := instanceBytesOf(testkit.Manifest("o"))
	host := device.NewHost(per + 32<<10)
	e := testkit.Engine(t, engine.Config{Devices: []device.Device{host}})
	failing := testkit.Deploy(t, e, dir)
	if deployH != nil {
		deployH(e)
	}
	testkit.Deploy(t, e, testkit.BundleDir(t, testkit.Manifest("o"), nil))
	return e, failing
}

// A function whose plover_instance_init always fails backs off after the
// crash limit even when an eviction unloads it between its requests.
// Before, the eviction left a fresh copy of its version with no crash
// record, and it failed for ever without backing off (review G, LOW 7).
func TestEvictionKeepsTheCrashRecord(t *testing.T) {
	e, _ := failingInit(t, nil)
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
			t.Fatalf("round %d: o's room did not come from evicting h", i)
		}
	}
	t.Fatal("h failed plover_instance_init 12 times, with an eviction between each, and never backed off")
}

// The same for a version a pipeline pinned beside the current one: an
// eviction drops it from the table (the next pin loads it again), and
// its record of crashes goes with the copy that the next pin finds.
func TestEvictionKeepsAPinnedVersionsCrashRecord(t *testing.T) {
	e, failing := failingInit(t, func(e *engine.Engine) {
		testkit.Deploy(t, e, testkit.BundleDir(t, testkit.Manifest("h"), nil)) // h's current version: another
	})
	ctx := context.Background()
	for i := range 12 {
		p, err := e.PinVersion(ctx, "h", failing.Version, time.Time{})
		if err != nil {
			t.Fatal(err)
		}
		err = p.Invoke(ctx, &call.Request{Input: []byte{1}})
		p.Release()
		if err == nil {
			t.Fatal("the pinned version ran: its plover_instance_init fails")
		}
		if strings.Contains(err.Error(), "backing off") {
			if i < 5 {
				t.Fatalf("backed off after %d failures, before the crash limit", i)
			}
			return
		}
		invoke(t, e, "o", []byte{1}) // evicts the pinned version, loaded with no instance
	}
	t.Fatal("a pinned version failed plover_instance_init 12 times, with an eviction between each, and never backed off")
}
