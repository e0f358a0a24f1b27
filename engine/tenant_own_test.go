package engine_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"testing"

	"github.com/plover-run/plover/call"
	"github.com/plover-run/plover/device"
	"github.com/plover-run/plover/engine"
	"github.com/plover-run/plover/errdefs"
	"github.com/plover-run/plover/internal/testkit"
	"github.com/plover-run/plover/worker"
)

// ownEngine is an engine over one host device in tenant scope (real worker
// processes, tenants named by the deploying token), the worker layer
// logging to the engine's log.
func ownEngine(t *testing.T) (*engine.Engine, *testkit.LogBuffer) {
	t.Helper()
	var logs testkit.LogBuffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	wd := worker.NewDevice(worker.Options{Exe: os.Args[0], Base: device.NewHost(0), Landlock: true,
		StageDir: t.TempDir(), Spawner: spawner, TenantScope: true, Log: log})
	t.Cleanup(func() { wd.Close() })
	return testkit.Engine(t, engine.Config{Devices: []device.Device{wd}, NamedTenants: true, Log: log}), &logs
}

// workerOf is the pid of the worker that holds name's current version.
func workerOf(t *testing.T, e *engine.Engine, name string) int {
	t.Helper()
	fi, err := e.Control().Function(context.Background(), name)
	if err != nil || len(fi.Workers) != 1 {
		t.Fatalf("%s: %v, workers %+v; want one", name, err, fi.Workers)
	}
	return fi.Workers[0].PID
}

// A function whose library dlopen refuses beside its tenant's other
// functions for what they hold (here glibc's static TLS reserve: two
// libraries of 300 bytes of initial-exec TLS fit no one process), though a
// fresh process would load it, is served from a worker of its own, logged
// so. Refused, the version was refused (400) on the node for the server's
// life, even once the sibling had gone; which function broke hung on the
// order of their first loads. The sibling stays in the tenant's worker.
func TestTenantRefusedBesideSiblingIsServedAlone(t *testing.T) {
	e, logs := ownEngine(t)
	deployAs(t, e, "first", "acme", testkit.StaticTLSBundleDir(t, testkit.Manifest("first"), 300))
	deployAs(t, e, "plain", "acme", testkit.BundleDir(t, testkit.Manifest("plain"), nil))
	deployAs(t, e, "second", "acme", testkit.StaticTLSBundleDir(t, testkit.Manifest("second"), 300))
	invoke := func(name string) {
		t.Helper()
		req := &call.Request{Input: []byte(name)}
		if err := e.Invoke(context.Background(), name, req); err != nil || !strings.HasPrefix(string(req.Output), name) {
			t.Fatalf("%s: %v (kind %v), answered %q\n%s", name, err, errdefs.KindOf(err), req.Output, logs)
		}
	}
	invoke("first")
	invoke("plain")
	shared := workerOf(t, e, "first")
	// Two first requests at once: one loads, the other waits for it.
	errs := make(chan error, 2)
	for range 2 {
		go func() {
			req := &call.Request{Input: []byte("second")}
			err := e.Invoke(context.Background(), "second", req)
			if err == nil && !strings.HasPrefix(string(req.Output), "second") {
				err = fmt.Errorf("answered %q", req.Output)
			}
			errs <- err
		}()
	}
	for range 2 {
		if err := <-errs; err != nil {
			t.Fatalf("second: %v (kind %v)\n%s", err, errdefs.KindOf(err), logs)
		}
	}
	invoke("first")
	invoke("second")
	if workerOf(t, e, "first") != shared || workerOf(t, e, "plain") != shared {
		t.Errorf("the tenant's worker %d did not go on holding first and plain (now %d and %d)", shared, workerOf(t, e, "first"), workerOf(t, e, "plain"))
	}
	if workerOf(t, e, "second") == workerOf(t, e, "first") {
		t.Error("second runs in the tenant's worker, beside first")
	}
	var moved []string
	for _, l := range strings.Split(logs.String(), "\n") {
		if strings.Contains(l, "worker of its own") {
			moved = append(moved, l)
		}
	}
	if len(moved) != 1 || !strings.Contains(moved[0], "function=second") || !strings.Contains(moved[0], "static TLS") {
		t.Errorf("want one line saying second runs in a worker of its own and why, got %q", moved)
	}
}

// A library dlopen refuses in a worker of its own too (64 KiB of
// initial-exec TLS fits no process's reserve) is refused with the loader's
// message, tried once alone after its refusal beside its sibling, and the
// version stays refused: its next request loads nothing.
func TestTenantRefusedAloneTooStaysRefused(t *testing.T) {
	e, logs := ownEngine(t)
	deployAs(t, e, "plain", "acme", testkit.BundleDir(t, testkit.Manifest("plain"), nil))
	deployAs(t, e, "huge", "acme", testkit.StaticTLSBundleDir(t, testkit.Manifest("huge"), 64<<10))
	plain := &call.Request{Input: []byte("p")}
	if err := e.Invoke(context.Background(), "plain", plain); err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		err := e.Invoke(context.Background(), "huge", &call.Request{Input: []byte("h")})
		if errdefs.KindOf(err) != errdefs.KindInvalid || !strings.Contains(err.Error(), "cannot allocate memory in static TLS block") {
			t.Fatalf("request %d: %v (kind %v), want the loader's refusal\n%s", i, err, errdefs.KindOf(err), logs)
		}
	}
	if n := strings.Count(logs.String(), "refused in a worker of its own too"); n != 1 {
		t.Errorf("the refusal in a worker of its own is logged %d times, want once (the version refused after it)\n%s", n, logs)
	}
	if err := e.Invoke(context.Background(), "plain", &call.Request{Input: []byte("p")}); err != nil {
		t.Fatal(err)
	}
}
