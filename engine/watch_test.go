package engine_test

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/plover-run/plover/bundle"
	"github.com/plover-run/plover/call"
	"github.com/plover-run/plover/device"
	"github.com/plover-run/plover/engine"
	"github.com/plover-run/plover/internal/testkit"
	"github.com/plover-run/plover/worker"
)

// exitWatchers counts the engine's goroutines watching a program's exit.
func exitWatchers() int { return testkit.Goroutines(".watchExit(") }

// awaitWatchers waits (10 s at most) for want exit watchers.
func awaitWatchers(t *testing.T, what string, want int) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); exitWatchers() != want; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%s: %d exit watchers, want %d", what, exitWatchers(), want)
		}
	}
}

// A function unloaded from its tenant's worker while a sibling keeps the
// worker leaves nothing behind: the engine's watcher of its program's exit
// ends with the program, counting no crash, not with the worker, which
// may live on for as long as its siblings are used and would keep every
// unloaded version (its pool, manifest, batcher) meanwhile.
func TestUnloadedTenantProgramLeavesNoWatcher(t *testing.T) {
	awaitWatchers(t, "before the test (earlier tests' workers ending)", 0)
	wd := worker.NewDevice(worker.Options{Exe: os.Args[0], Base: device.NewHost(0), Landlock: true,
		StageDir: t.TempDir(), Spawner: spawner, TenantScope: true})
	t.Cleanup(func() { wd.Close() })
	var logs testkit.LogBuffer
	e := testkit.Engine(t, engine.Config{Devices: []device.Device{wd}, Log: slog.New(slog.NewTextHandler(&logs, nil))})
	ctx := context.Background()
	invoke := func(name string) {
		t.Helper()
		req := &call.Request{Input: []byte("x")}
		if err := e.Invoke(ctx, name, req); err != nil || req.Output[0] != 'x' {
			t.Fatalf("invoke %s: %v", name, err)
		}
	}
	for _, name := range []string{"a", "b"} {
		b, _, _, err := bundle.PackBytes(testkit.BundleDir(t, testkit.Manifest(name), nil))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := e.Control().DeployAs(ctx, name, "acme", bytes.NewReader(b), false); err != nil {
			t.Fatal(err)
		}
		invoke(name)
	}
	awaitWatchers(t, "a and b loaded", 2)
	if err := e.Control().Delete(ctx, "a", true); err != nil {
		t.Fatal(err)
	}
	awaitWatchers(t, "a deleted, b keeping the tenant's worker", 1)
	invoke("b")
	if strings.Contains(logs.String(), "worker died") {
		t.Errorf("an unload was counted as a crash:\n%s", logs.String())
	}
}
