package engine_test

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/api"
	"github.com/plover-run/plover/bundle"
	"github.com/plover-run/plover/call"
	"github.com/plover-run/plover/device"
	"github.com/plover-run/plover/engine"
	"github.com/plover-run/plover/errdefs"
	"github.com/plover-run/plover/funclog"
	"github.com/plover-run/plover/internal/testkit"
	"github.com/plover-run/plover/objectstore"
)

func info(t *testing.T, e *engine.Engine, name string) api.FunctionInfo {
	t.Helper()
	fi, err := e.Control().Function(context.Background(), name)
	if err != nil {
		t.Fatal(err)
	}
	return fi
}

func TestMinInstancesAreWarmBeforeTheFirstRequest(t *testing.T) {
	store, err := objectstore.NewFS(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	e := testkit.Engine(t, engine.Config{Store: store})
	m := testkit.Manifest("fn")
	m.MinInstances = 2
	testkit.Deploy(t, e, testkit.BundleDir(t, m, nil))
	if fi := info(t, e, "fn"); !fi.Loaded || fi.Idle != 2 {
		t.Fatalf("after deploy: loaded=%v idle=%d, want 2 warm instances", fi.Loaded, fi.Idle)
	}
	if r := invoke(t, e, "fn", []byte("x")); r.Start != call.Hot {
		t.Fatalf("first request start %v, want hot", r.Start)
	}
	// Idle TTL never takes an instance below the minimum.
	e.Reap(time.Now().Add(time.Hour))
	if fi := info(t, e, "fn"); fi.Idle != 2 {
		t.Fatalf("after reap: %d idle, want 2", fi.Idle)
	}
	// A fresh engine over the same store pre-warms at start, fetching only
	// the bundles of functions that want instances.
	testkit.Deploy(t, e, testkit.BundleDir(t, testkit.Manifest("lazy"), nil))
	cache, err := bundle.NewCache(t.TempDir(), 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	e2 := testkit.Engine(t, engine.Config{Store: store, Cache: cache})
	if err := e2.Prewarm(context.Background()); err != nil {
		t.Fatal(err)
	}
	if fi := info(t, e2, "fn"); fi.Idle != 2 {
		t.Fatalf("after Prewarm: %d idle, want 2", fi.Idle)
	}
	if n := cache.Stats().Bundles; n != 1 {
		t.Fatalf("Prewarm fetched %d bundles, want 1 (only fn has min_instances)", n)
	}
}

func TestMaxInstancesCapsConcurrency(t *testing.T) {
	e := testkit.Engine(t, engine.Config{})
	m := testkit.Slow("fn", 100)
	m.MaxInstances = 2
	testkit.Deploy(t, e, testkit.BundleDir(t, m, nil))
	var peak atomic.Int32
	stop := make(chan struct{})
	go func() { // sample busy instances while the load runs
		for {
			select {
			case <-stop:
				return
			default:
			}
			if fi, err := e.Control().Function(context.Background(), "fn"); err == nil && int32(fi.Busy) > peak.Load() {
				peak.Store(int32(fi.Busy))
			}
			time.Sleep(5 * time.Millisecond)
		}
	}()
	start := time.Now()
	var wg sync.WaitGroup
	for i := 0; i < 6; i++ {
		wg.Add(1)
		go func() { defer wg.Done(); invoke(t, e, "fn", []byte{1}) }()
	}
	wg.Wait()
	close(stop)
	elapsed := time.Since(start)
	if fi := info(t, e, "fn"); fi.Idle != 2 || peak.Load() > 2 || peak.Load() == 0 {
		t.Fatalf("instances %d, peak busy %d; want 2 and at most 2", fi.Idle, peak.Load())
	}
	if elapsed < 300*time.Millisecond {
		t.Fatalf("6 requests of 100 ms on 2 instances took %v, want >= 300ms", elapsed)
	}
}

func TestIdleTTLReleasesAndUnloads(t *testing.T) {
	host := device.NewHost(0)
	e := testkit.Engine(t, engine.Config{Devices: []device.Device{host}})
	m := testkit.Manifest("fn")
	m.IdleTTL = "100ms"
	m.Constants = "c.bin"
	testkit.Deploy(t, e, testkit.BundleDir(t, m, make([]byte, 1000)))
	invoke(t, e, "fn", []byte("x"))
	if host.MemInfo().Used == 0 {
		t.Fatal("nothing allocated after a request")
	}
	e.Reap(time.Now()) // not idle long enough yet
	if fi := info(t, e, "fn"); fi.Idle != 1 {
		t.Fatalf("reaped too early: %+v", fi)
	}
	e.Reap(time.Now().Add(200 * time.Millisecond))
	if fi := info(t, e, "fn"); fi.Loaded || fi.Idle != 0 {
		t.Fatalf("after idle_ttl: loaded=%v idle=%d, want unloaded", fi.Loaded, fi.Idle)
	}
	if used := host.MemInfo().Used; used != 0 {
		t.Fatalf("%d bytes still held after scale to zero (constants not freed?)", used)
	}
	if r := invoke(t, e, "fn", []byte("y")); r.Start != call.Cold || r.Output[0] != 'y' {
		t.Fatalf("after scale to zero: start %v output %q", r.Start, r.Output[:1])
	}
}

func TestMemoryBudgetEvictsIdleNeverBusy(t *testing.T) {
	mx := testkit.Slow("x", 1)
	per := mx.MaxInputBytes + mx.TmpBytes + mx.OutBytes
	host := device.NewHost(2*per + per/2) // room for two instances
	e := testkit.Engine(t, engine.Config{Devices: []device.Device{host}})
	for _, n := range []string{"a", "b", "c"} {
		testkit.Deploy(t, e, testkit.BundleDir(t, testkit.Slow(n, 1), nil))
	}
	testkit.Deploy(t, e, testkit.BundleDir(t, testkit.Slow("slow", 1500), nil))
	invoke(t, e, "a", []byte{1})
	invoke(t, e, "b", []byte{1})
	instances := func(n string) int { fi := info(t, e, n); return fi.Idle + fi.Busy }
	invoke(t, e, "c", []byte{1}) // evicts a's instance, the least recently used idle one
	if instances("a") != 0 || instances("b") != 1 || instances("c") != 1 {
		t.Fatalf("after c: a=%d b=%d c=%d instances, want a evicted", instances("a"), instances("b"), instances("c"))
	}
	done := make(chan error)
	go func() { done <- e.Invoke(context.Background(), "slow", &call.Request{Input: []byte{1}}) }() // evicts b
	testkit.WaitFor(t, e, "slow", "slow running", testkit.Busy(1, 0))
	invoke(t, e, "a", []byte{1}) // evicts c, never the busy slow instance
	if instances("slow") != 1 || instances("b") != 0 || instances("c") != 0 || instances("a") != 1 {
		t.Fatalf("a busy function was evicted, or an idle one was kept: slow=%d a=%d b=%d c=%d",
			instances("slow"), instances("a"), instances("b"), instances("c"))
	}
	if used, total := host.MemInfo().Used, host.MemInfo().Total; used > total {
		t.Fatalf("device overcommitted: %d of %d", used, total)
	}
	// Both slots busy (slow runs; a is made busy too): nothing can be evicted.
	go func() {
		e.Invoke(context.Background(), "a", &call.Request{Input: []byte{1}, Override: &call.Override{Chain: []abi.Launch{{Kernel: "sleep_ms", Grid: 800, Block: 1}}, OutBytes: -1, TmpBytes: -1}})
	}()
	testkit.WaitFor(t, e, "a", "a running", testkit.Busy(1, 0))
	err := e.Invoke(context.Background(), "b", &call.Request{Input: []byte{1}})
	if errdefs.KindOf(err) != errdefs.KindUnavailable || !strings.Contains(err.Error(), "needs") || !strings.Contains(err.Error(), "free") {
		t.Fatalf("over budget with everything busy: %v", err)
	}
	if err := <-done; err != nil {
		t.Fatalf("the busy request failed: %v", err)
	}
}

func TestFullQueueAndDeadlines(t *testing.T) {
	e := testkit.Engine(t, engine.Config{})
	m := testkit.Manifest("fn")
	m.MaxInstances, m.MaxQueue = 1, 1
	// 1.5 s per request, and 1 s for the queued request's deadline: the
	// windows in which the test observes a request running, then one
	// queued, must outlast a poll on a loaded 2-core machine (700 and
	// 350 ms once did not, under the whole suite).
	m.Chain = []abi.Launch{{Kernel: "sleep_ms", Grid: 1500, Block: 1}, {Kernel: "count", Grid: 1, Block: 1}}
	testkit.Deploy(t, e, testkit.BundleDir(t, m, nil))
	ctx := context.Background()
	invoke(t, e, "fn", nil) // warm up: count = 1

	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); invoke(t, e, "fn", nil) }() // runs: count 2
	testkit.WaitFor(t, e, "fn", "the second request running", testkit.Busy(1, 0))
	// Asked before the third request is sent: once its goroutine starts,
	// the queue may already hold it.
	if err := full(t, e, "fn"); err != nil {
		t.Fatalf("Full with the queue empty: %v", err)
	}
	var queuedErr error
	go func() { // queued with a deadline it cannot meet: never runs
		defer wg.Done()
		queuedErr = e.Invoke(ctx, "fn", &call.Request{Deadline: time.Now().Add(time.Second)})
	}()
	testkit.WaitFor(t, e, "fn", "the third request queued", testkit.Busy(1, 1))
	if err := full(t, e, "fn"); errdefs.KindOf(err) != errdefs.KindBusy { // what a front door asks first
		t.Fatalf("Full with the queue full: %v, want busy", err)
	}
	err := e.Invoke(ctx, "fn", &call.Request{}) // queue (1) is full
	if errdefs.KindOf(err) != errdefs.KindBusy {
		t.Fatalf("third request: %v, want busy", err)
	}
	wg.Wait()
	if errdefs.KindOf(queuedErr) != errdefs.KindTimeout {
		t.Fatalf("queued request past its deadline: %v, want timeout", queuedErr)
	}
	if err := e.Invoke(ctx, "fn", &call.Request{Deadline: time.Now().Add(-time.Second)}); errdefs.KindOf(err) != errdefs.KindTimeout {
		t.Fatalf("expired deadline: %v", err)
	}
	r := invoke(t, e, "fn", nil)
	if got := binary.LittleEndian.Uint64(r.Output); got != 3 {
		t.Fatalf("count = %d, want 3: a request that timed out or was refused ran", got)
	}
}

// Constants are uploaded once per device however many requests create
// instances at the same time (uploads run outside the memory lock).
func TestConcurrentColdRequestsUploadConstantsOnce(t *testing.T) {
	host := device.NewHost(0)
	e := testkit.Engine(t, engine.Config{Devices: []device.Device{host}})
	m := testkit.Slow("fn", 200)
	m.MaxInstances = 4
	m.Constants = "c.bin"
	const consts = 100 << 10
	testkit.Deploy(t, e, testkit.BundleDir(t, m, make([]byte, consts)))
	var wg sync.WaitGroup
	for i := 0; i < 4; i++ {
		wg.Add(1)
		go func() { defer wg.Done(); invoke(t, e, "fn", []byte{1}) }()
	}
	wg.Wait()
	fi := info(t, e, "fn")
	per := m.MaxInputBytes + m.TmpBytes + m.OutBytes
	want := int64(fi.Idle)*per + consts
	if used := host.MemInfo().Used; fi.Idle < 2 || used != want {
		t.Fatalf("%d instances, %d bytes used; want %d (constants once)", fi.Idle, used, want)
	}
}

// full is what a front door asks before reading a body: the pinned
// version's Full.
func full(t *testing.T, e *engine.Engine, name string) error {
	t.Helper()
	p, err := e.Pin(context.Background(), name, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Release()
	return p.Full()
}

// A server whose devices keep no function output (functions in the
// server's own process) says so for a function's logs, rather than
// answering an empty log that a follower would wait on forever.
func TestLogsWithoutKeeper(t *testing.T) {
	e := testkit.Engine(t, engine.Config{})
	testkit.Deploy(t, e, testkit.BundleDir(t, testkit.Manifest("echo"), nil))
	_, _, err := e.Control().Logs(context.Background(), "echo", time.Time{}, true)
	if errdefs.KindOf(err) != errdefs.KindConflict || !strings.Contains(err.Error(), "--isolation none") {
		t.Fatalf("logs without a keeper: %v, want a 409 naming --isolation none", err)
	}
	if _, _, err := e.Control().Logs(context.Background(), "nope", time.Time{}, false); errdefs.KindOf(err) != errdefs.KindNotFound {
		t.Fatalf("logs of an unknown function: %v, want 404", err)
	}
}

// keepsOutput is a device whose functions' output the engine keeps (none
// arrives: the bundle runs in this process).
type keepsOutput struct{ device.Device }

func (keepsOutput) KeepsOutput() bool { return true }

// A function's output has at most funclog.MaxFollowers followers on a node:
// the next is a 429 saying so, and a closed one frees its place.
func TestFollowersOfAFunctionBounded(t *testing.T) {
	e := testkit.Engine(t, engine.Config{Devices: []device.Device{keepsOutput{device.NewHost(0)}}})
	testkit.Deploy(t, e, testkit.BundleDir(t, testkit.Manifest("echo"), nil))
	var fs []*funclog.Follower
	for range funclog.MaxFollowers {
		_, f, err := e.Control().Logs(context.Background(), "echo", time.Time{}, true)
		if err != nil {
			t.Fatal(err)
		}
		fs = append(fs, f)
	}
	_, _, err := e.Control().Logs(context.Background(), "echo", time.Time{}, true)
	if errdefs.KindOf(err) != errdefs.KindBusy || !strings.Contains(err.Error(), "its output has 32 on this node, the most a function may") {
		t.Fatalf("follower %d: %v, want a 429 saying why", funclog.MaxFollowers+1, err)
	}
	if _, _, err := e.Control().Logs(context.Background(), "echo", time.Time{}, false); err != nil {
		t.Fatalf("reading without following: %v", err)
	}
	fs[0].Close()
	if _, f, err := e.Control().Logs(context.Background(), "echo", time.Time{}, true); err != nil {
		t.Fatalf("after one closed: %v", err)
	} else {
		f.Close()
	}
	for _, f := range fs[1:] {
		f.Close()
	}
}

// A version kept warm holds its bundle in the bundle cache, where bundles
// in use are never evicted: a pre-warm whose bundle would take the bundles
// in use past --cache-limit is not done (at a deploy or at a server's
// start), so that deploys of large bundles with min_instances cannot fill
// the node's disk; the function still loads at its first request. A
// bundle of zeros is measured unpacked (the deploy records it): packed, a
// MiB of them is a few KiB, and each such pre-warm passed the check (a
// review's HIGH).
func TestPrewarmsStayWithinTheCacheLimit(t *testing.T) {
	for _, zeros := range []bool{false, true} {
		t.Run(fmt.Sprintf("zeros %v", zeros), func(t *testing.T) {
			store, err := objectstore.NewFS(t.TempDir())
			if err != nil {
				t.Fatal(err)
			}
			const big = 1 << 20
			newCache := func() *bundle.Cache {
				c, err := bundle.NewCache(t.TempDir(), 0, big+big/2) // one bundle in use, not two
				if err != nil {
					t.Fatal(err)
				}
				return c
			}
			e := testkit.Engine(t, engine.Config{Store: store, Cache: newCache()})
			for _, name := range []string{"a", "b"} {
				m := testkit.Manifest(name)
				m.Constants, m.MinInstances = "c.bin", 1
				consts := make([]byte, big)
				if !zeros {
					rand.Read(consts) // incompressible: packed as large
				}
				testkit.Deploy(t, e, testkit.BundleDir(t, m, consts))
			}
			if a, b := info(t, e, "a"), info(t, e, "b"); a.Idle != 1 || b.Loaded {
				t.Fatalf("after deploys: a loaded=%v idle=%d, b loaded=%v idle=%d; want a warm and b left to its first request", a.Loaded, a.Idle, b.Loaded, b.Idle)
			}
			invoke(t, e, "b", []byte("x"))
			e2 := testkit.Engine(t, engine.Config{Store: store, Cache: newCache()})
			if err := e2.Prewarm(context.Background()); err != nil {
				t.Fatal(err)
			}
			if a, b := info(t, e2, "a"), info(t, e2, "b"); a.Idle != 1 || b.Loaded {
				t.Fatalf("after Prewarm: a idle=%d, b loaded=%v; want a warm, b not", a.Idle, b.Loaded)
			}
		})
	}
}

// A pre-warm's reservation is given back once its load holds the bundle
// in use: kept until its constructors ended, the bundle counted twice
// meanwhile, and another pre-warm was refused for room it had (and not
// tried again: it loaded at its first request; a review's finding).
func TestAPrewarmInItsConstructorsCountsItsBundleOnce(t *testing.T) {
	store, err := objectstore.NewFS(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	const big = 1 << 20
	cache, err := bundle.NewCache(t.TempDir(), 0, big*5/2) // a and b in use; not a twice beside b
	if err != nil {
		t.Fatal(err)
	}
	e := testkit.Engine(t, engine.Config{Store: store, Cache: cache})
	consts := func() []byte {
		b := make([]byte, big)
		rand.Read(b) // packed as large
		return b
	}
	slow := &abi.Manifest{Name: "slow", ABI: abi.Major, Target: abi.TargetHost, Library: "hooks.so", Constants: "c.bin",
		MaxInputBytes: 1 << 10, OutBytes: 256, Chain: []abi.Launch{{Kernel: "report", Grid: 1, Block: 1}}, MinInstances: 1}
	dir := testkit.BundleDir(t, slow, consts())
	testkit.BuildLib(t, testkit.HooksSource(), dir, slow.Library, "-DSLOW_INIT_MS=3000")
	deployed := make(chan struct{})
	go func() {
		defer close(deployed)
		testkit.Deploy(t, e, dir) // returns once its pre-warm made the instance
	}()
	for end := time.Now().Add(20 * time.Second); cache.Stats().InUse == 0; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatal("slow's pre-warm did not load its bundle within 20 s")
		}
	}
	m := testkit.Manifest("b")
	m.Constants, m.MinInstances = "c.bin", 1
	testkit.Deploy(t, e, testkit.BundleDir(t, m, consts()))
	<-deployed
	if b := info(t, e, "b"); b.Idle != 1 {
		t.Fatalf("b, deployed while slow's constructors ran: idle %d, want its pre-warm done (it fits beside slow)", b.Idle)
	}
}
