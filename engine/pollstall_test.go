package engine_test

import (
	"context"
	"io"
	"log/slog"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/engine"
	"github.com/plover-run/plover/internal/testkit"
	"github.com/plover-run/plover/objectstore"
)

// stallingRecord is a store whose reads of one record, once armed, send
// their headers and then no byte of the body until the reader's context
// ends: an S3 read stalled after its headers, which minio-go does not time
// out. A read asked once its context ended fails, as S3's. It counts the polls' listings and says when a read stalls.
type stallingRecord struct {
	objectstore.Store
	key     string
	armed   atomic.Bool
	lists   atomic.Int64
	stalled chan struct{} // one send per stalled read, if one waits
}

func (s *stallingRecord) List(ctx context.Context, prefix string) ([]objectstore.Info, error) {
	s.lists.Add(1)
	return s.Store.List(ctx, prefix)
}

func (s *stallingRecord) GetTagged(ctx context.Context, key string) (io.ReadCloser, objectstore.Info, error) {
	if err := ctx.Err(); err != nil {
		return nil, objectstore.Info{}, err // as S3 does; a file store reads on
	}
	rc, in, err := s.Store.GetTagged(ctx, key)
	if err != nil || key != s.key || !s.armed.Load() {
		return rc, in, err
	}
	rc.Close()
	select {
	case s.stalled <- struct{}{}:
	default:
	}
	return stalledBody{ctx}, in, nil
}

type stalledBody struct{ ctx context.Context }

func (b stalledBody) Read([]byte) (int, error) {
	<-b.ctx.Done()
	return 0, b.ctx.Err()
}

func (stalledBody) Close() error { return nil }

// A record read that stalls on one node (its body never comes) is cut by
// the poll's deadline, said in the log, and read last at the next poll:
// a rollback of another function made elsewhere still lands there, the
// poll after the one cut.
func TestAStalledRecordReadDoesNotFreezeThePoll(t *testing.T) {
	fs, err := objectstore.NewFS(filepath.Join(t.TempDir(), "store"))
	if err != nil {
		t.Fatal(err)
	}
	store := &stallingRecord{Store: fs, key: "functions/stuck.json", stalled: make(chan struct{})}
	a := testkit.Engine(t, engine.Config{Store: fs})
	var logs testkit.LogBuffer
	b := testkit.Engine(t, engine.Config{Store: store, Log: slog.New(slog.NewTextHandler(&logs, nil))})
	b.SetPollDeadline(300 * time.Millisecond)

	stuck := testkit.Manifest("stuck")
	testkit.Deploy(t, a, testkit.BundleDir(t, stuck, nil))
	m := testkit.Manifest("fn")
	m.Chain = []abi.Launch{{Kernel: "echo", Grid: 1, Block: 8}}
	v1 := testkit.Deploy(t, a, testkit.BundleDir(t, m, nil))
	m.Chain = append(m.Chain, abi.Launch{Kernel: "add_one", Grid: 1, Block: 1})
	v2 := testkit.Deploy(t, a, testkit.BundleDir(t, m, nil))
	invoke(t, b, "stuck", []byte{1})
	if r := invoke(t, b, "fn", []byte{5}); r.Version != v2.Version {
		t.Fatalf("node b serves fn %s, want %s", r.Version, v2.Version)
	}

	// stuck's record changes, so that b's polls read it, and stall there.
	store.armed.Store(true)
	stuck.OutBytes++
	testkit.Deploy(t, a, testkit.BundleDir(t, stuck, nil))
	ctx, cancel := context.WithCancel(context.Background())
	watched := make(chan struct{})
	go func() { b.Watch(ctx, 10*time.Millisecond); close(watched) }()
	t.Cleanup(func() { cancel(); <-watched })
	select {
	case <-store.stalled:
	case <-time.After(10 * time.Second):
		t.Fatal("no poll read stuck's record in 10 s")
	}
	stalledIn := store.lists.Load() // the poll stalled now
	if _, err := a.Control().Rollback(context.Background(), "fn", v1.Version); err != nil {
		t.Fatal(err)
	}
	// The poll stalled may have read fn before stuck, with fn's tag of
	// before the rollback; the one after it reads fn first.
	engine.WaitFor(t, "two polls after the stalled one", func() bool { return store.lists.Load() >= stalledIn+2 })
	if r := invoke(t, b, "fn", []byte{5}); r.Version != v1.Version || r.Output[0] != 5 {
		t.Errorf("node b serves fn %s (output %d) after the poll that followed the stalled one, want the rollback's %s (5)", r.Version, r.Output[0], v1.Version)
	}
	engine.WaitFor(t, "the overrun said in the log", func() bool { return strings.Contains(logs.String(), "ran past its deadline") })
	if line := logs.String(); !strings.Contains(line, "function stuck") {
		t.Errorf("the overrun's line does not name the function whose read was cut:\n%s", line)
	}
}

// stalledListing is a store whose listings stall until their context
// ends.
type stalledListing struct{ objectstore.Store }

func (s stalledListing) List(ctx context.Context, prefix string) ([]objectstore.Info, error) {
	<-ctx.Done()
	return nil, ctx.Err()
}

// A server's start pre-warms under the server's life: a listing of the
// records that stalls fails the pre-warm within a request's time, which
// the server logs, instead of holding it, silently, for as long as the
// server runs.
func TestAStalledListingEndsThePrewarm(t *testing.T) {
	fs, err := objectstore.NewFS(filepath.Join(t.TempDir(), "store"))
	if err != nil {
		t.Fatal(err)
	}
	e := testkit.Engine(t, engine.Config{Store: stalledListing{fs}, Timeout: 200 * time.Millisecond})
	done := make(chan error, 1)
	go func() { done <- e.Prewarm(context.Background()) }()
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "prewarm") {
			t.Errorf("prewarm over a stalled listing: %v, want its error", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("prewarm still waits for a stalled listing after 10 s (its request timeout is 200 ms, the listing's bound 4 s)")
	}
}
