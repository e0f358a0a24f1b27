package engine_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/api"
	"github.com/plover-run/plover/bundle"
	"github.com/plover-run/plover/call"
	"github.com/plover-run/plover/engine"
	"github.com/plover-run/plover/errdefs"
	"github.com/plover-run/plover/internal/testkit"
)

// batchBundle is a bundle directory of the batching test bundle with m
// (args: extra compiler arguments).
func batchBundle(t *testing.T, m *abi.Manifest, args ...string) string {
	t.Helper()
	dir := t.TempDir()
	testkit.BuildLib(t, testkit.BatchSource(), dir, m.Library, args...)
	testkit.WriteManifest(t, dir, m)
	return dir
}

// item is one request of the batching test bundle.
func item(value, sleepMs uint32) []byte {
	b := make([]byte, 8)
	binary.LittleEndian.PutUint32(b, value)
	binary.LittleEndian.PutUint32(b[4:], sleepMs)
	return b
}

type batchResult struct {
	value, items uint32
	req          *call.Request
	err          error
}

// invokeAsync starts one request and returns where its result will be.
func invokeAsync(e *engine.Engine, name string, in []byte, deadline time.Time) chan batchResult {
	ch := make(chan batchResult, 1)
	go func() {
		req := &call.Request{Input: in, Deadline: deadline}
		err := e.Invoke(context.Background(), name, req)
		r := batchResult{req: req, err: err}
		if err == nil && len(req.Output) == 8 {
			r.value, r.items = binary.LittleEndian.Uint32(req.Output), binary.LittleEndian.Uint32(req.Output[4:])
		}
		ch <- r
	}()
	return ch
}

// waitQueued waits until the function has n requests queued (observed
// state, not a sleep).
func waitQueued(t *testing.T, e *engine.Engine, name string, n int) {
	t.Helper()
	waitInfo(t, e, name, fmt.Sprintf("%d requests queued", n), func(fi api.FunctionInfo) bool { return fi.Queue >= n })
}

// waitBusy waits until n of the function's instances are running.
func waitBusy(t *testing.T, e *engine.Engine, name string, n int) {
	t.Helper()
	waitInfo(t, e, name, fmt.Sprintf("%d instances busy", n), func(fi api.FunctionInfo) bool { return fi.Busy >= n })
}

func waitInfo(t *testing.T, e *engine.Engine, name, what string, ok func(api.FunctionInfo) bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if fi, err := e.Control().Function(context.Background(), name); err == nil && ok(fi) {
			return
		}
		time.Sleep(time.Millisecond)
	}
	t.Fatalf("%s never had %s", name, what)
}

func batchEngine(t *testing.T, m *abi.Manifest) *engine.Engine {
	t.Helper()
	e := testkit.Engine(t, engine.Config{})
	testkit.Deploy(t, e, batchBundle(t, m))
	// Load it, so that the tests below time runs, not the first load.
	if r := <-invokeAsync(e, m.Name, item(1, 0), time.Time{}); r.err != nil || r.value != 2 || r.items != 1 {
		t.Fatalf("first request: %+v", r)
	}
	return e
}

// Requests that queue behind a busy instance run together, each getting its
// own slice of out.
func TestBatchFormsUnderConcurrency(t *testing.T) {
	m := testkit.BatchManifest("b", 16, "")
	m.MaxInstances = 1
	e := batchEngine(t, m)
	busy := invokeAsync(e, "b", item(100, 200), time.Time{})
	waitBusy(t, e, "b", 1)
	var results []chan batchResult
	for i := range 12 {
		results = append(results, invokeAsync(e, "b", item(uint32(1000+i), 0), time.Time{}))
	}
	waitQueued(t, e, "b", 12)
	if r := <-busy; r.err != nil || r.value != 101 || r.items != 1 || r.req.BatchSize != 1 {
		t.Fatalf("the busy request: %+v", r)
	}
	for i, ch := range results {
		r := <-ch
		if r.err != nil || r.value != uint32(1001+i) {
			t.Fatalf("request %d: value %d, err %v", i, r.value, r.err)
		}
		// All twelve queued behind the one instance: one run of 12.
		if r.items != 12 || r.req.BatchSize != 12 {
			t.Fatalf("request %d ran in a batch of %d (BatchSize %d), want 12", i, r.items, r.req.BatchSize)
		}
		if r.req.Timing.Queue < 50*time.Millisecond {
			t.Errorf("request %d queued %v behind a 200 ms run", i, r.req.Timing.Queue)
		}
	}
}

// A lone request never waits for company, however long max_delay is; with
// another run in flight a free instance holds a partial batch for max_delay
// and no longer.
func TestBatchDelay(t *testing.T) {
	m := testkit.BatchManifest("d", 16, "300ms")
	m.MaxInstances = 2
	e := batchEngine(t, m)

	t0 := time.Now()
	r := <-invokeAsync(e, "d", item(7, 0), time.Time{})
	if el := time.Since(t0); r.err != nil || r.items != 1 || r.req.Timing.BatchWait != 0 || el > 200*time.Millisecond {
		t.Fatalf("a lone request: %+v, BatchWait %v, took %v", r, r.req.Timing.BatchWait, el)
	}

	busy := invokeAsync(e, "d", item(1, 1000), time.Time{}) // in flight for 1 s
	waitBusy(t, e, "d", 1)
	t1 := time.Now()
	first := invokeAsync(e, "d", item(2, 0), time.Time{})
	waitQueued(t, e, "d", 1) // held: the second instance is free, but a run is in flight
	second := invokeAsync(e, "d", item(3, 0), time.Time{})
	a, b := <-first, <-second
	el := time.Since(t1)
	for _, r := range []batchResult{a, b} {
		if r.err != nil || r.items != 2 {
			t.Fatalf("held requests: %+v", r)
		}
	}
	if w := a.req.Timing.BatchWait; w < 250*time.Millisecond || w > 600*time.Millisecond {
		t.Errorf("the first held request waited %v for company; max_delay is 300ms", w)
	}
	if el > 900*time.Millisecond {
		t.Errorf("held requests took %v: they waited for the 1 s run, not max_delay", el)
	}
	if r := <-busy; r.err != nil {
		t.Fatal(r.err)
	}
}

// Deadlines and queue limits hold per request; a failing run fails every
// request in it with its error; bad requests are refused.
func TestBatchLimitsAndFailures(t *testing.T) {
	m := testkit.BatchManifest("l", 4, "")
	m.MaxInstances, m.MaxQueue = 1, 2
	e := batchEngine(t, m)

	t.Run("deadline", func(t *testing.T) {
		busy := invokeAsync(e, "l", item(1, 400), time.Time{})
		waitBusy(t, e, "l", 1)
		t0 := time.Now()
		r := <-invokeAsync(e, "l", item(2, 0), time.Now().Add(50*time.Millisecond))
		if errdefs.KindOf(r.err) != errdefs.KindTimeout || time.Since(t0) > 300*time.Millisecond {
			t.Fatalf("got %v after %v; want a timeout at the 50 ms deadline", r.err, time.Since(t0))
		}
		if r := <-busy; r.err != nil {
			t.Fatal(r.err)
		}
	})

	t.Run("queue", func(t *testing.T) {
		busy := invokeAsync(e, "l", item(1, 300), time.Time{})
		waitBusy(t, e, "l", 1)
		// max_queue 2 plus one batch of 4 may wait; the seventh is refused.
		var waiting []chan batchResult
		for i := range 6 {
			waiting = append(waiting, invokeAsync(e, "l", item(uint32(10+i), 0), time.Time{}))
		}
		waitQueued(t, e, "l", 6)
		r := <-invokeAsync(e, "l", item(99, 0), time.Time{})
		if errdefs.KindOf(r.err) != errdefs.KindBusy {
			t.Fatalf("the seventh waiting request: %v, want busy", r.err)
		}
		<-busy
		for _, ch := range waiting {
			if r := <-ch; r.err != nil {
				t.Fatal(r.err)
			}
		}
	})

	t.Run("failing run fails every request", func(t *testing.T) {
		chs := behindABusyRun(t, e, "l", 5, 0xDEAD, 6)
		for i, ch := range chs {
			r := <-ch
			if errdefs.KindOf(r.err) != errdefs.KindKernel || !strings.Contains(r.err.Error(), "an item asked to fail") {
				t.Fatalf("request %d of the failing run: %v", i, r.err)
			}
		}
		// The function goes on.
		if r := <-invokeAsync(e, "l", item(8, 0), time.Time{}); r.err != nil || r.value != 9 {
			t.Fatalf("after the failing run: %+v", r)
		}
	})

	for _, tt := range []struct {
		name string
		req  *call.Request
		want string
	}{
		{"short input", &call.Request{Input: []byte{1, 2, 3}}, "exactly 8 bytes (batch.item_input_bytes)"},
		{"two items in one body", &call.Request{Input: append(item(1, 0), item(2, 0)...)}, "exactly 8 bytes"},
		{"override", &call.Request{Input: item(1, 0), Override: &call.Override{OutBytes: 8, TmpBytes: -1}}, "overrides do not apply"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			err := e.Invoke(context.Background(), "l", tt.req)
			if errdefs.KindOf(err) != errdefs.KindBadRequest || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("got %v, want a bad-input error with %q", err, tt.want)
			}
		})
	}
}

// behindABusyRun queues requests of values behind a 200 ms run of name's
// one instance, so that they run as one batch once it ends, and returns
// where their results will be.
func behindABusyRun(t *testing.T, e *engine.Engine, name string, values ...uint32) []chan batchResult {
	t.Helper()
	busy := invokeAsync(e, name, item(1, 200), time.Time{})
	waitBusy(t, e, name, 1)
	var chs []chan batchResult
	for _, v := range values {
		chs = append(chs, invokeAsync(e, name, item(v, 0), time.Time{}))
	}
	waitQueued(t, e, name, len(values))
	if r := <-busy; r.err != nil {
		t.Fatal(r.err)
	}
	return chs
}

// A batched run whose entry lowers out.len fails: responses are fixed slices.
func TestBatchOutLenFixed(t *testing.T) {
	m := testkit.BatchManifest("s", 4, "")
	m.Chain = append(m.Chain, abi.Launch{Kernel: "bshrink", Grid: 1, Block: 1})
	e := testkit.Engine(t, engine.Config{})
	testkit.Deploy(t, e, batchBundle(t, m))
	err := e.Invoke(context.Background(), "s", &call.Request{Input: item(1, 0)})
	if errdefs.KindOf(err) != errdefs.KindKernel || !strings.Contains(err.Error(), "changed out.len in a batched run") {
		t.Fatalf("got %v", err)
	}
}

// Batching is a contract between the manifest and the library: both say so
// or neither does, and the manifest asks for no more than the library takes.
func TestBatchDeployChecks(t *testing.T) {
	e := testkit.Engine(t, engine.Config{})
	plain := testkit.Manifest("p")
	plain.Batch = &abi.Batch{MaxItems: 4, ItemInputBytes: plain.MaxInputBytes / 4, ItemOutputBytes: plain.OutBytes / 4}
	tooMany := testkit.BatchManifest("m", 32, "")
	unbatched := testkit.BatchManifest("u", 4, "")
	unbatched.Batch = nil
	for _, tt := range []struct {
		name string
		dir  string
		want string
	}{
		{"batch section, library without PLOVER_BATCHED", testkit.BundleDir(t, plain, nil), "does not declare PLOVER_BATCHED"},
		{"max_items over the library's", batchBundle(t, tooMany), "batch.max_items 32 is over the 16 the library declares"},
		{"batching library, no batch section", batchBundle(t, unbatched), "declares PLOVER_BATCHED(16) but plover.json has no \"batch\" section"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			b, _, m, err := bundle.PackBytes(tt.dir)
			if err != nil {
				t.Fatal(err)
			}
			_, err = e.Control().Deploy(context.Background(), m.Name, bytes.NewReader(b), false)
			if errdefs.KindOf(err) != errdefs.KindInvalid || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("got %v, want %q", err, tt.want)
			}
		})
	}
}

// Many concurrent requests: each gets its own answer, and runs are
// batches (the histogram's count is below the number of requests).
func TestBatchManyConcurrent(t *testing.T) {
	m := testkit.BatchManifest("c", 16, "")
	// One instance: in process, a run's cgo call holds one of this test
	// machine's two Ps, and the other must stay free to submit requests.
	m.MaxInstances = 1
	e := batchEngine(t, m)
	const n = 64
	var wg sync.WaitGroup
	errs := make(chan error, n)
	sizes := make(chan int, n)
	// All start together: spawned one by one they may not overlap, as a
	// run's cgo call can hold one of few Ps while the loop would spawn.
	start := make(chan struct{})
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			req := &call.Request{Input: item(uint32(i*7), 2)}
			if err := e.Invoke(context.Background(), "c", req); err != nil {
				errs <- err
				return
			}
			if v := binary.LittleEndian.Uint32(req.Output); v != uint32(i*7+1) {
				errs <- errors.New("a request got another's output")
			}
			sizes <- req.BatchSize
		}()
	}
	close(start)
	wg.Wait()
	close(errs)
	close(sizes)
	for err := range errs {
		t.Fatal(err)
	}
	biggest := 0
	for s := range sizes {
		biggest = max(biggest, s)
	}
	if biggest < 2 {
		t.Fatalf("64 concurrent requests on one instance never shared a run (largest run %d)", biggest)
	}
}

// A run whose requests all gave up still holds its version: a redeploy
// while it runs must not unload the library under it. The old version is
// unloaded (logged) only once the run has ended.
func TestBatchRunOutlivesItsRequests(t *testing.T) {
	m := testkit.BatchManifest("o", 4, "")
	m.MaxInstances = 1
	var logs testkit.LogBuffer
	e := testkit.Engine(t, engine.Config{Log: slog.New(slog.NewTextHandler(&logs, nil))})
	old := testkit.Deploy(t, e, batchBundle(t, m))
	t0 := time.Now()
	r := <-invokeAsync(e, "o", item(1, 800), time.Now().Add(100*time.Millisecond))
	if errdefs.KindOf(r.err) != errdefs.KindTimeout {
		t.Fatalf("got %v, want a timeout", r.err)
	}
	waitBusy(t, e, "o", 1) // the run goes on without its request
	b, _, _, err := bundle.PackBytes(batchBundle(t, m))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.Control().Deploy(context.Background(), "o", bytes.NewReader(b), true); err != nil {
		t.Fatal(err)
	}
	if r := <-invokeAsync(e, "o", item(41, 0), time.Time{}); r.err != nil || r.value != 42 {
		t.Fatalf("the new version: %+v", r)
	}
	unloaded := "msg=unloaded function=o version=" + old.Version
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(logs.String(), unloaded) {
		if time.Now().After(deadline) {
			t.Fatalf("the old version was never unloaded:\n%s", logs.String())
		}
		time.Sleep(time.Millisecond)
	}
	if el := time.Since(t0); el < 750*time.Millisecond {
		t.Fatalf("the old version was unloaded %v after its 800 ms run started", el)
	}
}

// A slot freed by warming (min_instances) starts queued batches: a request
// that arrived while the only instance was being created runs as soon as
// it exists, not at its deadline.
func TestBatchAfterWarm(t *testing.T) {
	m := testkit.BatchManifest("w", 4, "")
	m.MinInstances, m.MaxInstances = 1, 1
	dir := batchBundle(t, m, "-DSLOW_INIT_MS=700")
	e := testkit.Engine(t, engine.Config{})
	b, _, _, err := bundle.PackBytes(dir)
	if err != nil {
		t.Fatal(err)
	}
	deployed := make(chan error, 1)
	go func() {
		_, err := e.Control().Deploy(context.Background(), "w", bytes.NewReader(b), false)
		deployed <- err
	}()
	waitInfo(t, e, "w", "a deployed version", func(api.FunctionInfo) bool { return true })
	t0 := time.Now()
	r := <-invokeAsync(e, "w", item(1, 0), time.Now().Add(4*time.Second))
	if r.err != nil || r.value != 2 {
		t.Fatalf("a request during the warm-up: %+v", r)
	}
	if el := time.Since(t0); el > 2500*time.Millisecond {
		t.Fatalf("a request during a 700 ms warm-up took %v: it waited for its deadline, not the instance", el)
	}
	if err := <-deployed; err != nil {
		t.Fatal(err)
	}
}

// One request's input refused (plover_reject) is that request's fault
// alone: it gets the 422, and the requests that shared its run get their
// own answers, not the refusal of an input they did not send.
func TestBatchRefusedInputFailsOnlyItsRequest(t *testing.T) {
	m := testkit.BatchManifest("r", 4, "")
	m.MaxInstances = 1
	e := batchEngine(t, m)
	values := []uint32{5, 0xBAD, 6}
	chs := behindABusyRun(t, e, "r", values...)
	for i, ch := range chs {
		r := <-ch
		if values[i] == 0xBAD {
			if errdefs.KindOf(r.err) != errdefs.KindRejected || !strings.Contains(r.err.Error(), "an item's input is refused") {
				t.Errorf("the refused request: %v, want its refusal", r.err)
			}
			continue
		}
		if r.err != nil || r.value != values[i]+1 {
			t.Errorf("request %d (value %d), in a run with a refused input: value %d, err %v", i, values[i], r.value, r.err)
		}
	}
}

// Runs of a batching function that follow one another on its instances
// each report their own copy and kernel times: a run read them from its
// instance after putting it back, when the next run may already be using
// it (a data race, which go test -race reports here).
func TestBatchRunsReadTheirOwnTimingBeforeTheNextTakesTheInstance(t *testing.T) {
	m := testkit.BatchManifest("tm", 4, "")
	m.MaxInstances = 2
	e := batchEngine(t, m)
	const clients, perClient = 8, 150
	var wg sync.WaitGroup
	errs := make(chan error, clients)
	stop := time.Now().Add(20 * time.Second)
	for c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range perClient {
				if time.Now().After(stop) {
					return
				}
				v := uint32(c*1000 + i)
				req := &call.Request{Input: item(v, 0)}
				if err := e.Invoke(context.Background(), "tm", req); err != nil {
					errs <- err
					return
				}
				if got := binary.LittleEndian.Uint32(req.Output); got != v+1 {
					errs <- fmt.Errorf("request %d got %d", v, got)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

// A batching function's requests are copied on the host (README, "The path
// a byte takes"): each one's input into its run's, and its output out of
// the run's, beside the device's own copies. Each request counts its part
// (call.Request.Copied, plover_payload_copied_bytes_total), as an unbatched
// request counts its run's; they counted nothing. Here the in-process host
// device copies each run's input (8 bytes an item) into its buffers and the
// output (8 an item) back: 16 bytes an item, and the batch's own 8 + 8.
func TestBatchCountsItsCopies(t *testing.T) {
	m := testkit.BatchManifest("cp", 4, "")
	m.MaxInstances = 1
	e := batchEngine(t, m)
	const want = 8 + 8 + 16
	for _, tt := range []struct {
		name   string
		values []uint32
	}{
		{"alone", []uint32{5}},
		{"in a batch of three", []uint32{5, 6, 7}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var chs []chan batchResult
			if len(tt.values) == 1 {
				chs = append(chs, invokeAsync(e, "cp", item(tt.values[0], 0), time.Time{}))
			} else {
				chs = behindABusyRun(t, e, "cp", tt.values...)
			}
			for i, ch := range chs {
				r := <-ch
				if r.err != nil || r.value != tt.values[i]+1 || r.req.BatchSize != len(tt.values) {
					t.Fatalf("request %d: %+v", i, r)
				}
				if r.req.Copied != want {
					t.Errorf("request %d of a run of %d counted %d bytes copied, want %d", i, len(tt.values), r.req.Copied, want)
				}
			}
		})
	}
}

// A run that fails (here its input refused) leaves the length of runs the
// hold rule goes by as it was: a run refused at once lowered it, and a
// request with a tight deadline was then held past it.
func TestAFailedBatchRunIsNoRunsLength(t *testing.T) {
	m := testkit.BatchManifest("len", 4, "")
	e := batchEngine(t, m)
	if err := e.Invoke(context.Background(), "len", &call.Request{Input: item(1, 50)}); err != nil {
		t.Fatal(err)
	}
	took := e.BatchRunTook("len")
	if took <= 0 {
		t.Fatalf("after a run: runs take %v", took)
	}
	if err := e.Invoke(context.Background(), "len", &call.Request{Input: item(0xBAD, 0)}); errdefs.KindOf(err) != errdefs.KindRejected {
		t.Fatalf("a refused input: %v", err)
	}
	if got := e.BatchRunTook("len"); got != took {
		t.Fatalf("after a refused run: runs take %v, want %v as before", got, took)
	}
}

// A run's buffers are as large as its items need, not max_items' (host
// memory in the server that nothing else bounds, up to 1 GiB each): a run
// of one item makes an input and an output of one item's bytes.
func TestBatchBuffersFitTheRun(t *testing.T) {
	sizes := engine.BatchAllocs(t)
	e := batchEngine(t, testkit.BatchManifest("b", 16, ""))
	if r := <-invokeAsync(e, "b", item(1, 0), time.Time{}); r.err != nil || r.value != 2 {
		t.Fatalf("the request: %+v", r)
	}
	// Two buffers a run (in and out), from a sync.Pool: the warm-up's,
	// reused, unless a collection emptied the pool between the runs (CI
	// saw [8 8 8 8]).
	got := *sizes
	if len(got) < 2 || len(got)%2 != 0 {
		t.Fatalf("runs of one item made buffers of %v bytes, want an input and an output at a time", got)
	}
	for _, n := range got {
		if n != 8 {
			t.Fatalf("a run of one item made buffers of %v bytes, want 8 each, not max_items' 128", got)
		}
	}
}
