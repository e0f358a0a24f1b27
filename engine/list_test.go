package engine_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"github.com/plover-run/plover/internal/fakecuda"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/plover-run/plover/api"
	"github.com/plover-run/plover/bundle"
	"github.com/plover-run/plover/call"
	"github.com/plover-run/plover/device"
	"github.com/plover-run/plover/engine"
	"github.com/plover-run/plover/internal/testkit"
	"github.com/plover-run/plover/objectstore"
	"github.com/plover-run/plover/registry"
	"github.com/plover-run/plover/worker"
	"github.com/plover-run/plover/worker/contain"
	"github.com/plover-run/plover/worker/inside"
)

// TestMain lets the test binary be its own worker (worker.Options.Exe is
// os.Args[0]), as plover is.
func TestMain(m *testing.M) {
	inside.RunIfWorker()
	code := m.Run()
	fakecuda.Remove()
	os.Exit(code)
}

var spawner = contain.NewSpawner()

// manyFunctions is a node with total functions deployed, the first live
// of them loaded, each in a worker process of its own: what GET
// /v1/functions lists on a busy node. Every record names the same bundle
// (published once, then only its record per name), so that building it
// costs the live workers' cold starts and little else.
func manyFunctions(tb testing.TB, total, live int) *engine.Engine {
	tb.Helper()
	dir := tb.TempDir()
	store, err := objectstore.NewFS(filepath.Join(dir, "store"))
	if err != nil {
		tb.Fatal(err)
	}
	exe := os.Args[0]
	if w := os.Getenv("PLOVER_BENCH_WORKER"); w != "" {
		exe = w
	}
	wd := worker.NewDevice(worker.Options{Exe: exe, Base: device.NewHost(0), Standby: 8, MaxStandby: 16,
		Landlock: true, StageDir: tb.TempDir(), Spawner: spawner})
	tb.Cleanup(func() { wd.Close() })
	e := testkit.Engine(tb, engine.Config{Store: store, Devices: []device.Device{wd}})

	m := testkit.Manifest("echo")
	b, sha, _, err := bundle.PackBytes(testkit.BundleDir(tb, m, nil))
	if err != nil {
		tb.Fatal(err)
	}
	reg := registry.Registry{Store: store}
	for i := range total {
		mi := *m
		mi.Name = fnName(i)
		if _, _, err := reg.Publish(context.Background(), &mi, bytes.NewReader(b), sha, int64(len(b)), false); err != nil {
			tb.Fatal(err)
		}
	}
	// Two at a time: the cold starts' workers come from the standby pool,
	// which refills on the same CPUs.
	var wg sync.WaitGroup
	errs := make(chan error, live)
	next := make(chan int)
	for range 2 {
		wg.Go(func() {
			for i := range next {
				if err := e.Invoke(context.Background(), fnName(i), &call.Request{Input: []byte{1}}); err != nil {
					errs <- err
				}
			}
		})
	}
	for i := range live {
		next <- i
	}
	close(next)
	wg.Wait()
	close(errs)
	for err := range errs {
		tb.Fatal(err)
	}
	return e
}

func fnName(i int) string { return fmt.Sprintf("fn-%04d", i) }

// BenchmarkListMany is GET /v1/functions with 1,000 functions deployed,
// 200 of them with a live worker: engine is the engine's side (the store's
// listing and each function's figures), json adds the encoding the HTTP
// handler does, apart lists a second apart, and unread lists nothing. It
// reports the CPU time of the whole process, background work included,
// per listing and per second between listings: on a shared machine the
// time swings with the load, the CPU time much less. PLOVER_BENCH_WORKER
// names a plover-worker binary to run the workers (default: the test
// binary, which maps more and so costs more to read PSS of).
func BenchmarkListMany(b *testing.B) {
	e := manyFunctions(b, 1000, 200)
	ctx := context.Background()
	list := func(b *testing.B) []api.FunctionInfo {
		fs, err := e.Control().Functions(ctx)
		if err != nil {
			b.Fatal(err)
		}
		if len(fs) != 1000 {
			b.Fatalf("listed %d functions, want 1000", len(fs))
		}
		return fs
	}
	list(b) // the node has read every record once, as a running node has
	// The standby pool refills after the cold starts: let it, so that its
	// starts are not counted as the listing's CPU.
	time.Sleep(2 * time.Second)
	b.Run("engine", func(b *testing.B) {
		cpu := cpuTime()
		for b.Loop() {
			list(b)
		}
		b.ReportMetric(float64(cpuTime()-cpu)/1e6/float64(b.N), "cpu-ms/op")
	})
	b.Run("json", func(b *testing.B) {
		cpu := cpuTime()
		for b.Loop() {
			if _, err := json.Marshal(map[string]any{"functions": list(b)}); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(cpuTime()-cpu)/1e6/float64(b.N), "cpu-ms/op")
	})
	// Listings a second apart, as a dashboard or a probe makes them: what
	// one listing costs when nothing it reads was read just before, and
	// the CPU the process spends per second between listings (the
	// workers' figures sampled in the background).
	b.Run("apart", func(b *testing.B) {
		var cpu, idleCPU, idle time.Duration
		for b.Loop() {
			b.StopTimer()
			c0, t0 := cpuTime(), time.Now()
			time.Sleep(time.Second)
			idleCPU, idle = idleCPU+cpuTime()-c0, idle+time.Since(t0)
			b.StartTimer()
			c0 = cpuTime()
			list(b)
			cpu += cpuTime() - c0
		}
		b.ReportMetric(float64(cpu)/1e6/float64(b.N), "cpu-ms/op")
		b.ReportMetric(float64(idleCPU)/1e6/idle.Seconds(), "idle-cpu-ms/s")
	})
	// No listing at all, a second per op: the CPU the process spends
	// while nothing reads the workers' figures.
	b.Run("unread", func(b *testing.B) {
		c0, t0 := cpuTime(), time.Now()
		for b.Loop() {
			time.Sleep(time.Second)
		}
		b.ReportMetric(float64(cpuTime()-c0)/1e6/time.Since(t0).Seconds(), "idle-cpu-ms/s")
	})
}

// cpuTime is the CPU time this process has used, user and system.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// The listing's worker figures are sampled in the background: they must
// be each function's own worker's, close to what /proc says of it, and the
// same in the listing, the function's view and /metrics.
func TestListingWorkerFigures(t *testing.T) {
	const total, live = 5, 3
	e := manyFunctions(t, total, live)
	ctx := context.Background()
	root := os.Geteuid() == 0 // PSS needs it: workers are not dumpable
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(e.Collector())

	// The three views, taken until no sample changed between them: the
	// listing, /metrics and each function's own view, then the listing
	// again (a sample taken between two views would differ from one of them).
	var list []api.FunctionInfo
	var metrics map[string]api.WorkerInfo
	var views map[string]api.FunctionInfo
	// On a loaded machine a sample may land between the views many times
	// running: taken again until they agree, for up to 20 s.
	for start := time.Now(); ; {
		var err error
		if list, err = e.Control().Functions(ctx); err != nil {
			t.Fatal(err)
		}
		metrics = workerMetrics(t, reg)
		views = map[string]api.FunctionInfo{}
		for _, fi := range list {
			one, err := e.Control().Function(ctx, fi.Name)
			if err != nil {
				t.Fatal(err)
			}
			views[fi.Name] = one
		}
		again, err := e.Control().Functions(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if sameListing(list, again) && sameWorkers(list, views) {
			break
		}
		if time.Since(start) > 20*time.Second {
			t.Fatalf("the listing, its functions' views and the listing again never agreed for 20 s (a sample between each): last %+v", again)
		}
	}
	if len(list) != total {
		t.Fatalf("listed %d functions, want %d", len(list), total)
	}
	pids := map[int]string{}
	for i, fi := range list {
		if fi.Name != fnName(i) {
			t.Fatalf("listing[%d] is %s, want %s", i, fi.Name, fnName(i))
		}
		if i >= live {
			if fi.Loaded || len(fi.Workers) != 0 {
				t.Errorf("%s was never invoked, yet loaded %v with workers %+v", fi.Name, fi.Loaded, fi.Workers)
			}
			continue
		}
		if !fi.Loaded || len(fi.Workers) != 1 {
			t.Fatalf("%s: loaded %v, workers %+v; want loaded, one worker", fi.Name, fi.Loaded, fi.Workers)
		}
		w := fi.Workers[0]
		if other, dup := pids[w.PID]; dup {
			t.Errorf("%s and %s both list worker %d", fi.Name, other, w.PID)
		}
		pids[w.PID] = fi.Name
		rss, threads := procStatus(t, w.PID)
		// An idle worker's memory moves by a few pages between a sample
		// and now; threads may come and go in its Go runtime.
		if w.RSSBytes < rss*9/10 || w.RSSBytes > rss*11/10 || w.Threads < 2 || w.Threads > threads+2 {
			t.Errorf("%s: worker %+v; /proc/%d says %d bytes resident, %d threads", fi.Name, w, w.PID, rss, threads)
		}
		if root && (w.PSSBytes <= 0 || w.PSSBytes > w.RSSBytes) {
			t.Errorf("%s: PSS %d with %d resident: want 0 < PSS <= RSS", fi.Name, w.PSSBytes, w.RSSBytes)
		}
		if !root && w.PSSBytes != 0 {
			t.Errorf("%s: PSS %d read by a server that is not root", fi.Name, w.PSSBytes)
		}
		if one := views[fi.Name]; !reflect.DeepEqual(one.Workers, fi.Workers) {
			t.Errorf("%s: its view's workers %+v, the listing's %+v", fi.Name, one.Workers, fi.Workers)
		}
		m := metrics[fi.Name]
		m.PID = w.PID // no pid label
		if m != w {
			t.Errorf("%s: /metrics says %+v, the listing %+v", fi.Name, m, w)
		}
	}
}

// sameListing is whether two listings say the same, their device
// fractions within 1e-9: each is a ratio of two decaying sums brought to
// the reading's time by steps that differ between the two (the series
// below 1e-3 of the decay's time is exact to 1e-10 a step), and readings
// a millisecond apart (-race) drifted by 1e-12 a listing.
func sameListing(a, b []api.FunctionInfo) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		x, y := a[i], b[i]
		if math.Abs(x.DeviceFraction-y.DeviceFraction) > 1e-9 {
			return false
		}
		x.DeviceFraction, y.DeviceFraction = 0, 0
		if !reflect.DeepEqual(x, y) {
			return false
		}
	}
	return true
}

// sameWorkers reports whether each function's own view lists the workers
// the listing does.
func sameWorkers(list []api.FunctionInfo, views map[string]api.FunctionInfo) bool {
	for _, fi := range list {
		if !reflect.DeepEqual(views[fi.Name].Workers, fi.Workers) {
			return false
		}
	}
	return true
}

// procStatus is a process's resident bytes and threads, from /proc.
func procStatus(t *testing.T, pid int) (rss int64, threads int) {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.Lines(string(b)) {
		k, v, _ := strings.Cut(line, ":")
		f := strings.Fields(v)
		switch {
		case len(f) == 0:
		case k == "VmRSS":
			kb, _ := strconv.ParseInt(f[0], 10, 64)
			rss = kb << 10
		case k == "Threads":
			threads, _ = strconv.Atoi(f[0])
		}
	}
	return rss, threads
}

// workerMetrics is the engine's worker series by function (device, memory
// and threads; /metrics has no pid).
func workerMetrics(t *testing.T, reg *prometheus.Registry) map[string]api.WorkerInfo {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]api.WorkerInfo{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			w := out[labels["function"]]
			v := m.GetGauge().GetValue()
			switch mf.GetName() {
			case "plover_worker_resident_bytes":
				w.Device, w.RSSBytes = labels["device"], int64(v)
			case "plover_worker_pss_bytes":
				w.PSSBytes = int64(v)
			case "plover_worker_threads":
				w.Threads = int(v)
			default:
				continue
			}
			out[labels["function"]] = w
		}
	}
	return out
}
