package engine_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/plover-run/plover/api"
	"github.com/plover-run/plover/bundle"
	"github.com/plover-run/plover/call"
	"github.com/plover-run/plover/engine"
	"github.com/plover-run/plover/errdefs"
	"github.com/plover-run/plover/httpapi"
	"github.com/plover-run/plover/internal/testkit"
	"github.com/plover-run/plover/objectstore"
)

// staleStore answers its first record reads (held of them; 0: one) as the
// store was when each began, but only once released: slow reads that
// another node's deploy overtakes. Later reads pass through.
type staleStore struct {
	objectstore.Store
	held         int64
	reads, ended atomic.Int64 // ended: held reads whose context ended first
	release      chan struct{}
}

func (s *staleStore) GetTagged(ctx context.Context, key string) (io.ReadCloser, objectstore.Info, error) {
	if !strings.HasPrefix(key, "functions/") || s.reads.Add(1) > max(s.held, 1) {
		return s.Store.GetTagged(ctx, key)
	}
	rc, info, err := s.Store.GetTagged(ctx, key)
	var b []byte
	if err == nil {
		b, err = io.ReadAll(rc)
		rc.Close()
	}
	select {
	case <-s.release:
	case <-ctx.Done():
		s.ended.Add(1)
		return nil, objectstore.Info{}, ctx.Err()
	}
	return io.NopCloser(bytes.NewReader(b)), info, err
}

// A deploy of the bundle another node just deployed answers from the
// record as it is now, not from a read of it begun before (a request for
// the name, still waiting on a slow store): here, while such a read would
// answer 404, the deploy says the version is unchanged and serves it.
func TestDeployReadsTheRecordAfresh(t *testing.T) {
	fs := fsStore(t)
	slow := &staleStore{Store: fs, release: make(chan struct{})}
	here := testkit.Engine(t, engine.Config{Store: slow})
	there := testkit.Engine(t, engine.Config{Store: fs})

	early := make(chan error, 1)
	go func() { early <- here.Invoke(context.Background(), "late", &call.Request{Input: []byte("x")}) }()
	for slow.reads.Load() == 0 { // the request's read began (the record absent then)
		time.Sleep(time.Millisecond)
	}
	dir := testkit.BundleDir(t, testkit.Manifest("late"), nil)
	fi := testkit.Deploy(t, there, dir)

	b, _, _, err := bundle.PackBytes(dir)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		got, err := here.Control().Deploy(context.Background(), "late", bytes.NewReader(b), false)
		if err == nil && (!got.Unchanged || got.Version != fi.Version) {
			t.Errorf("deploy here: version %s, unchanged %v; want %s unchanged", got.Version, got.Unchanged, fi.Version)
		}
		done <- err
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("deploy here of the bundle deployed there: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the deploy waited for a record read begun before it")
	}
	req := &call.Request{Input: []byte("x")}
	if err := here.Invoke(context.Background(), "late", req); err != nil || req.Version != fi.Version {
		t.Fatalf("after the deploy: %v, version %q, want %s", err, req.Version, fi.Version)
	}
	close(slow.release)
	<-early // whatever it read; it must only end
}

// A request whose deadline passes while its function's record is read from
// a store that does not answer gets 504 at its deadline, naming the
// function (the store is not blamed), whether it reads the record itself
// or waits for another request's read.
func TestHungStoreReadEndsAtTheDeadline(t *testing.T) {
	e, hung := hungEngine(t, 0)
	invoke := func(d time.Duration) chan error {
		ch := make(chan error, 1)
		go func() { ch <- e.Invoke(context.Background(), "fn", &call.Request{Deadline: time.Now().Add(d)}) }()
		return ch
	}
	t0 := time.Now()
	reader := invoke(300 * time.Millisecond)
	for hung.reads.Load() == 0 {
		time.Sleep(time.Millisecond)
	}
	joiner := invoke(100 * time.Millisecond)
	for _, r := range []struct {
		who string
		ch  chan error
	}{{"the joiner", joiner}, {"the reader", reader}} {
		var err error
		select {
		case err = <-r.ch:
		case <-time.After(10 * time.Second):
			t.Fatalf("%s still waits for the store 10 s on", r.who)
		}
		if errdefs.KindOf(err) != errdefs.KindTimeout || !strings.Contains(err.Error(), "function fn") {
			t.Errorf("%s: %v, want a timeout naming fn", r.who, err)
		}
	}
	if d := time.Since(t0); d > 5*time.Second {
		t.Errorf("answered after %v", d)
	}
}

// Without a deadline of their own (a pipeline pinning a step's version, a
// request before its body is read, a control call reading a record), store
// reads end at the engine's request timeout.
func TestHungStoreReadEndsAtTheTimeout(t *testing.T) {
	e, _ := hungEngine(t, 100*time.Millisecond)
	pin := func(p engine.Pin, err error) error {
		if err == nil {
			p.Release()
		}
		return err
	}
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		call func() error
	}{
		{"Pin", func() error { return pin(e.Pin(ctx, "fn", time.Time{})) }},
		{"PinVersion", func() error { return pin(e.PinVersion(ctx, "fn", "0123456789abcdef", time.Time{})) }},
		{"Control.Function", func() error { _, err := e.Control().Function(ctx, "fn"); return err }},
		{"Control.Versions", func() error { _, err := e.Control().Versions(ctx, "fn"); return err }},
	} {
		ch := make(chan error, 1)
		go func() { ch <- tc.call() }()
		select {
		case err := <-ch:
			if errdefs.KindOf(err) != errdefs.KindTimeout || !strings.Contains(err.Error(), "function fn") {
				t.Errorf("%s: %v, want a timeout naming fn", tc.name, err)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("%s still waits for the store 10 s on", tc.name)
		}
	}
}

// Served over HTTP, a request's own deadline (X-Plover-Timeout-Ms) bounds
// its function's record read, below the server's timeout: for a small body
// (read with the headers, the function resolved as it runs) and for one
// whose function is asked first what it takes (over 8 KiB).
func TestHungStoreServedAtTheRequestsDeadline(t *testing.T) {
	e, _ := hungEngine(t, time.Minute)
	url := testkit.Serve(t, e, httpapi.Options{}) + "/v1/functions/fn/invoke"
	for _, size := range []int{16, 64 << 10} {
		req, err := http.NewRequest("POST", url, bytes.NewReader(make([]byte, size)))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/octet-stream")
		req.Header.Set("X-Plover-Timeout-Ms", "200")
		client := http.Client{Timeout: 20 * time.Second}
		t0 := time.Now()
		resp, err := client.Do(req)
		if err != nil {
			t.Fatalf("%d-byte body: %v", size, err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusGatewayTimeout || !strings.Contains(string(body), "function fn") {
			t.Errorf("%d-byte body: %d %s, want 504 naming fn", size, resp.StatusCode, body)
		}
		if d := time.Since(t0); d > 10*time.Second {
			t.Errorf("%d-byte body: answered after %v; the request's deadline was 200ms, the server's a minute", size, d)
		}
	}
}

// distantStore answers record reads after a delay.
type distantStore struct {
	objectstore.Store
	delay time.Duration
	reads atomic.Int64
}

func (s *distantStore) GetTagged(ctx context.Context, key string) (io.ReadCloser, objectstore.Info, error) {
	if strings.HasPrefix(key, "functions/") {
		s.reads.Add(1)
		select {
		case <-time.After(s.delay):
		case <-ctx.Done():
			return nil, objectstore.Info{}, ctx.Err()
		}
	}
	return s.Store.GetTagged(ctx, key)
}

// Requests whose deadlines are shorter than the store's answer time get
// their 504 but do not cut the read they share: it completes, the name
// resolves, and a flood of such requests costs the store one read, not
// one per request.
func TestShortDeadlinesDoNotStarveTheRead(t *testing.T) {
	fs := fsStore(t)
	ctx := context.Background()
	rec, _ := json.Marshal(api.Record{Name: "fn", Current: "v1", Versions: []api.Version{{ID: "v1", SHA256: fmt.Sprintf("%064x", 1)}}})
	if err := fs.Put(ctx, "functions/fn.json", bytes.NewReader(rec), int64(len(rec))); err != nil {
		t.Fatal(err)
	}
	slow := &distantStore{Store: fs, delay: 200 * time.Millisecond}
	e := testkit.Engine(t, engine.Config{Store: slow, Timeout: time.Minute})
	var wg sync.WaitGroup
	var timedOut atomic.Int64
	for range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p, err := e.Pin(ctx, "fn", time.Now().Add(5*time.Millisecond))
			switch {
			case err == nil:
				p.Release() // scheduled after the read ended: fine
			case errdefs.KindOf(err) == errdefs.KindTimeout:
				timedOut.Add(1)
			default:
				t.Errorf("a 5 ms request: %v, want a timeout", err)
			}
		}()
	}
	wg.Wait()
	p, err := e.Pin(ctx, "fn", time.Now().Add(10*time.Second))
	if err != nil {
		t.Fatalf("a request with room, after the flood: %v", err)
	}
	p.Release()
	t.Logf("%d of 32 short requests timed out", timedOut.Load())
	if n := slow.reads.Load(); n != 1 {
		t.Errorf("33 requests made %d record reads, want 1", n)
	}
}

// The reads that outlive their requests are bounded: none starts for a
// request already past its deadline; at most maxFlights (256) run apart
// from their requests, the rest end with their requests; Close ends those
// that run apart.
func TestReadsApartAreBounded(t *testing.T) {
	e, hung := hungEngine(t, time.Minute)
	ctx := context.Background()
	for i := range 50 {
		if _, err := e.Pin(ctx, fmt.Sprintf("past-%d", i), time.Now().Add(-time.Second)); errdefs.KindOf(err) != errdefs.KindTimeout {
			t.Fatalf("a request past its deadline: %v, want a timeout", err)
		}
	}
	if n := hung.reads.Load(); n != 0 {
		t.Fatalf("50 requests already past their deadlines started %d store reads", n)
	}
	const names = 300
	var wg sync.WaitGroup
	for i := range names {
		wg.Add(1)
		go func() {
			defer wg.Done()
			e.Pin(ctx, fmt.Sprintf("made-up-%d", i), time.Now().Add(300*time.Millisecond))
		}()
	}
	wg.Wait()
	running := hung.reads.Load() - hung.ended.Load()
	t.Logf("%d requests for made-up names: %d reads, %d still running after the requests", names, hung.reads.Load(), running)
	if running > 256 {
		t.Errorf("%d reads, %d still running after their requests; want at most 256", hung.reads.Load(), running)
	}
	e.Close()
	engine.WaitFor(t, "Close to end the reads", func() bool { return hung.reads.Load() == hung.ended.Load() })
}

// A request whose deadline is later than the shared read's (the engine's
// timeout, the read started by a request with a short deadline) is not
// answered at the read's end: it reads again, and waits until its own
// deadline.
func TestLongerDeadlineOutwaitsTheSharedRead(t *testing.T) {
	e, hung := hungEngine(t, 100*time.Millisecond)
	ctx := context.Background()
	short := make(chan error, 1)
	go func() {
		_, err := e.Pin(ctx, "fn", time.Now().Add(200*time.Millisecond))
		short <- err
	}()
	engine.WaitFor(t, "the first read", func() bool { return hung.reads.Load() == 1 })
	long := time.Now().Add(time.Second)
	_, err := e.Pin(ctx, "fn", long)
	if early := time.Until(long); errdefs.KindOf(err) != errdefs.KindTimeout || early > 5*time.Millisecond {
		t.Errorf("a request with a 1 s deadline: %v, %v before its deadline; want a timeout at it", err, early)
	}
	if n := hung.reads.Load(); n != 2 {
		t.Errorf("%d reads, want 2 (the shared one, then the longer request's own)", n)
	}
	<-short
}

func fsStore(t *testing.T) objectstore.Store {
	t.Helper()
	fs, err := objectstore.NewFS(filepath.Join(t.TempDir(), "store"))
	if err != nil {
		t.Fatal(err)
	}
	return fs
}

// hungEngine is an engine whose store holds every record read until the
// test ends (timeout 0: the default request timeout).
func hungEngine(t *testing.T, timeout time.Duration) (*engine.Engine, *staleStore) {
	hung := &staleStore{Store: fsStore(t), held: 1 << 30, release: make(chan struct{})}
	t.Cleanup(func() { close(hung.release) })
	return testkit.Engine(t, engine.Config{Store: hung, Timeout: timeout}), hung
}
