package engine_test

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/plover-run/plover/bundle"
	"github.com/plover-run/plover/call"
	"github.com/plover-run/plover/device"
	"github.com/plover-run/plover/engine"
	"github.com/plover-run/plover/errdefs"
	"github.com/plover-run/plover/internal/testkit"
	"github.com/plover-run/plover/worker"
)

// deployAs deploys the bundle directory dir as function name for tenant.
func deployAs(t *testing.T, e *engine.Engine, name, tenant, dir string) {
	t.Helper()
	b, _, _, err := bundle.PackBytes(dir)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.Control().DeployAs(context.Background(), name, tenant, bytes.NewReader(b), false); err != nil {
		t.Fatal(err)
	}
}

// A function whose load, in its tenant's shared worker (real worker
// processes), outlasts every request's deadline and then fails is backed
// off alone: the load goes on past the request, and its failure is told
// to the function's next request, counted as a crash or a failed
// plover_load. Told no one, each request saw only its deadline, nothing
// was counted, and a load that crashed the worker took its siblings'
// worker down at every request, without end. The sibling answers
// throughout.
func TestLateLoadFailuresBackOff(t *testing.T) {
	for _, tc := range []struct {
		name, flag string
		told       errdefs.Kind
	}{
		{"constructor crash", "-DCRASH", errdefs.KindWorkerCrashed},
		{"plover_load fails", "-DFAIL_LOAD", errdefs.KindKernel},
	} {
		t.Run(tc.name, func(t *testing.T) {
			wd := worker.NewDevice(worker.Options{Exe: os.Args[0], Base: device.NewHost(0), Standby: 1, Landlock: true,
				StageDir: t.TempDir(), Spawner: spawner, TenantScope: true})
			t.Cleanup(func() { wd.Close() })
			var logs testkit.LogBuffer
			e := testkit.Engine(t, engine.Config{Devices: []device.Device{wd}, Log: slog.New(slog.NewTextHandler(&logs, nil))})
			deployAs(t, e, "sibling", "acme", testkit.BundleDir(t, testkit.Manifest("sibling"), nil))
			dir := t.TempDir()
			m := testkit.Manifest("late")
			m.Library = "slowload.so"
			testkit.BuildLib(t, filepath.Join(testkit.Root(), "worker", "testdata", "slowload.cc"), dir, m.Library, "-DSLOW_MS=300", tc.flag)
			testkit.WriteManifest(t, dir, m)
			deployAs(t, e, "late", "acme", dir)
			sibling := func() {
				t.Helper()
				req := &call.Request{Input: []byte("s")}
				if err := e.Invoke(context.Background(), "sibling", req); err != nil || req.Output[0] != 's' {
					t.Fatalf("the sibling: %v\n%s", err, &logs)
				}
			}
			sibling()
			told := 0
			for i := 0; ; i++ {
				if i == 40 {
					t.Fatalf("40 requests, %d of them told the late load's failure, and no back-off\n%s", told, &logs)
				}
				err := e.Invoke(context.Background(), "late", &call.Request{Input: []byte("x"), Deadline: time.Now().Add(100 * time.Millisecond)})
				k := errdefs.KindOf(err)
				if k == errdefs.KindUnavailable && strings.Contains(err.Error(), "backing off") {
					break
				}
				switch k {
				case tc.told:
					told++
				case errdefs.KindTimeout:
				default:
					t.Fatalf("request %d: %v (kind %v), want a timeout, the late load's failure or the back-off", i, err, k)
				}
			}
			if told == 0 {
				t.Fatal("backed off with no failure told")
			}
			sibling()
		})
	}
}
