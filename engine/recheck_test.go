package engine_test

import (
	"context"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/plover-run/plover/bundle"
	"github.com/plover-run/plover/call"
	"github.com/plover-run/plover/device"
	"github.com/plover-run/plover/engine"
	"github.com/plover-run/plover/internal/testkit"
	"github.com/plover-run/plover/worker"
)

// loadsSeen is a device that keeps the programs it loaded, for the test
// to kill their workers.
type loadsSeen struct {
	device.Device
	mu    sync.Mutex
	progs []device.Program
}

func (d *loadsSeen) Load(ctx context.Context, spec device.ProgramSpec) (device.Program, error) {
	p, err := d.Device.Load(ctx, spec)
	if err == nil {
		d.mu.Lock()
		d.progs = append(d.progs, p)
		d.mu.Unlock()
	}
	return p, err
}

func (d *loadsSeen) last() device.Program {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.progs[len(d.progs)-1]
}

// A version's worker killed after its cached library was damaged on the
// node's disk loads from a library fetched again, not from the damaged
// one: the restarted worker's load checks the bundle's files as a cold
// start does (bundle.Cache.Recheck). It loaded the damaged file as it
// was: 422 "corrupt ELF file", the version refused for as long as it
// stayed loaded, a node's disk fault told as the bundle's (M1).
func TestARestartedWorkerLoadsNoDamagedBundle(t *testing.T) {
	for _, tc := range []struct {
		name   string
		damage func(lib string) error
	}{
		{"library truncated", func(lib string) error { return os.Truncate(lib, 4000) }},
		{"library replaced", func(lib string) error {
			if err := os.WriteFile(lib+".new", []byte("not a library"), 0o755); err != nil {
				return err
			}
			return os.Rename(lib+".new", lib)
		}},
		// The whole cache directory removed (a tmp cleaner): made again by
		// the load's fetch, as a cold start's is (its 503 "fetching bundle
		// ... failed (no such file or directory)" at every load, before).
		{"cache directory removed", func(lib string) error { return os.RemoveAll(filepath.Dir(filepath.Dir(lib))) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			awaitWatchers(t, "before the test (earlier tests' workers ending)", 0)
			wd := worker.NewDevice(worker.Options{Exe: os.Args[0], Base: device.NewHost(0), Landlock: true,
				StageDir: t.TempDir(), Spawner: spawner})
			t.Cleanup(func() { wd.Close() })
			dev := &loadsSeen{Device: wd}
			cache, err := bundle.NewCache(filepath.Join(t.TempDir(), "cache"), 0, 0)
			if err != nil {
				t.Fatal(err)
			}
			e := testkit.Engine(t, engine.Config{Devices: []device.Device{dev}, Cache: cache})
			m := testkit.Manifest("vec")
			fi := testkit.Deploy(t, e, testkit.BundleDir(t, m, nil))
			invoke := func(what string) {
				t.Helper()
				req := &call.Request{Input: []byte("x")}
				if err := e.Invoke(context.Background(), "vec", req); err != nil || len(req.Output) == 0 || req.Output[0] != 'x' {
					t.Fatalf("%s: %v", what, err)
				}
			}
			invoke("the first invoke")
			lib := filepath.Join(cache.Dir(), fi.SHA256, m.Library)
			want, err := os.ReadFile(lib)
			if err != nil {
				t.Fatal(err)
			}
			if err := tc.damage(lib); err != nil {
				t.Fatal(err)
			}
			p := dev.last().(interface {
				PID() int
				Exited() <-chan struct{}
			})
			if err := syscall.Kill(p.PID(), syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			select {
			case <-p.Exited():
			case <-time.After(10 * time.Second):
				t.Fatal("the killed worker not reaped in 10 s")
			}
			awaitWatchers(t, "the killed worker's program abandoned", 0)
			invoke("the invoke after the worker's death")
			invoke("the next")
			if got, _ := os.ReadFile(lib); string(got) != string(want) {
				t.Errorf("the cached library is %d bytes, not the bundle's %d", len(got), len(want))
			}
		})
	}
}
