package pipeline_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/plover-run/plover/apierr"
	"github.com/plover-run/plover/call"
	"github.com/plover-run/plover/engine"
	"github.com/plover-run/plover/errdefs"
	"github.com/plover-run/plover/internal/testkit"
	"github.com/plover-run/plover/netguard"
	"github.com/plover-run/plover/pipeline"
)

// What a pipeline's request holds of step outputs at its peak is read from
// its functions' out_bytes, the record's copy before they are loaded and
// the manifest after: a step's input (the step before it's output) beside
// its own output; parallel branches all at once, or their outputs twice
// over while they are joined.
func TestWhatAPipelineHolds(t *testing.T) {
	e := testkit.Engine(t, engine.Config{})
	a, b := testkit.Manifest("a"), testkit.Manifest("b") // out_bytes 256
	b.OutBytes = 1024
	testkit.Deploy(t, e, testkit.BundleDir(t, a, nil))
	testkit.Deploy(t, e, testkit.BundleDir(t, b, nil))
	bm := testkit.BatchManifest("batched", 16, "") // 8 bytes an item, 128 a batch
	dir := t.TempDir()
	testkit.BuildLib(t, testkit.BatchSource(), dir, bm.Library)
	testkit.WriteManifest(t, dir, bm)
	testkit.Deploy(t, e, dir)
	testkit.Deploy(t, e, pipelineDir(t, "inner", map[string]any{"parallel": []string{"a", "a"}})) // 512 out, 1024 at its join
	for _, tc := range []struct {
		name  string
		steps []any
		want  int64
		input []byte
	}{
		{"one after another: b's output beside a's", []any{"a", "b"}, 256 + 1024, []byte("abcdefgh")},
		{"a join, then its output beside the next step's", []any{map[string]any{"parallel": []string{"a", "b"}}, "a"}, 2 * (256 + 1024), []byte("abcdefgh")},
		{"nested: two inner joins and b at once, then the outer join", []any{map[string]any{"parallel": []string{"inner", "inner", "b"}}}, 2 * (512 + 512 + 1024), []byte("abcdefgh")},
		{"a batching function's item", []any{"batched", "batched"}, 16, []byte{1, 0, 0, 0, 0, 0, 0, 0}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			testkit.Deploy(t, e, pipelineDir(t, "p", tc.steps...))
			r := pipeline.New(e, prometheus.NewRegistry())
			for _, when := range []string{"before its functions run", "after"} {
				p, err := r.Pin(context.Background(), "p", time.Time{})
				if err != nil {
					t.Fatal(err)
				}
				if got := p.Holds(); got != tc.want {
					t.Errorf("%s: Holds = %d, want %d", when, got, tc.want)
				}
				err = p.Invoke(context.Background(), &call.Request{Input: tc.input})
				p.Release()
				if err != nil {
					t.Fatal(err)
				}
			}
		})
	}
	f, err := runner(e).Pin(context.Background(), "a", time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Release()
	if got := f.Holds(); got != 0 {
		t.Errorf("a function's Holds = %d, want 0 (its answer is its transport's)", got)
	}
}

func runner(e *engine.Engine) *pipeline.Runner { return pipeline.New(e, prometheus.NewRegistry()) }

// peakMemory is a node's Memory that records the most it held.
type peakMemory struct {
	*netguard.Budget
	peak, acquired atomic.Int64
}

func (m *peakMemory) Acquire(ctx context.Context, n int64) error {
	if err := m.Budget.Acquire(ctx, n); err != nil {
		return err
	}
	m.acquired.Add(1)
	for {
		p, now := m.peak.Load(), m.InUse()
		if now <= p || m.peak.CompareAndSwap(p, now) {
			return nil
		}
	}
}

// Pipeline requests hold their outputs' bytes of the node's budget while
// they run: with room for one request's, concurrent requests run one at a
// time and every one is served; a budget smaller than one request's
// outputs runs it alone rather than never; the budget is whole again after.
func TestPipelinesHoldTheirOutputsInTheNodesBudget(t *testing.T) {
	e := testkit.Engine(t, engine.Config{})
	m := testkit.Slow("slow", 30)
	m.MaxInstances, m.MaxQueue = 4, 8
	testkit.Deploy(t, e, testkit.BundleDir(t, m, nil))
	testkit.Deploy(t, e, pipelineDir(t, "fan", map[string]any{"parallel": []string{"slow", "slow"}}, "slow"))
	const holds = 2 * (256 + 256)
	for _, tc := range []struct {
		name   string
		budget int64
	}{
		{"room for one request's", holds},
		{"less than one request's: each runs alone", holds / 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mem := &peakMemory{Budget: netguard.NewBudget(tc.budget)}
			run := runner(e)
			run.Bound(mem)
			var wg sync.WaitGroup
			errs := make(chan error, 4)
			for range 4 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					errs <- run.Invoke(context.Background(), "fan", &call.Request{Input: []byte("abcdefgh")})
				}()
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				if err != nil {
					t.Error(err)
				}
			}
			if got := mem.acquired.Load(); got != 4 {
				t.Errorf("%d requests took room, want 4", got)
			}
			if got := mem.peak.Load(); got > tc.budget {
				t.Errorf("held %d bytes at once, more than the budget's %d", got, tc.budget)
			}
			if got := mem.InUse(); got != 0 {
				t.Errorf("%d bytes still held after the requests", got)
			}
		})
	}
}

// A request that finds no room waits for it, and fails when none comes:
// with a 504 at its deadline, or a 503 naming the flag after the wait, or
// a 503 when its context ends (the server's, as for the engine's waits).
// It runs no step, and the pipeline counts it.
func TestAPipelineWithoutRoomFails(t *testing.T) {
	defer pipeline.SetMemoryWait(100 * time.Millisecond)()
	e := testkit.Engine(t, engine.Config{})
	testkit.Deploy(t, e, testkit.BundleDir(t, testkit.Manifest("a"), nil))
	testkit.Deploy(t, e, pipelineDir(t, "p", "a", "a"))
	mem := netguard.NewBudget(1 << 20)
	if err := mem.Acquire(context.Background(), 1<<20); err != nil { // others' requests hold it all
		t.Fatal(err)
	}
	run := runner(e)
	run.Bound(mem)
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	for _, tc := range []struct {
		name     string
		ctx      context.Context
		deadline time.Duration
		kind     errdefs.Kind
		status   apierr.Status
	}{
		{"past its deadline", context.Background(), 30 * time.Millisecond, errdefs.KindTimeout, apierr.Status{}},
		{"past the wait", context.Background(), 10 * time.Second, 0, apierr.Unavailable},
		{"cancelled", cancelled, 10 * time.Second, errdefs.KindUnavailable, apierr.Status{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req := &call.Request{Input: []byte("abcdefgh"), Deadline: time.Now().Add(tc.deadline)}
			err := run.Invoke(tc.ctx, "p", req)
			if err == nil {
				t.Fatal("served without room")
			}
			if tc.kind != 0 && errdefs.KindOf(err) != tc.kind {
				t.Errorf("err = %v (kind %v), want kind %v", err, errdefs.KindOf(err), tc.kind)
			}
			var ae *apierr.Error
			if tc.status != (apierr.Status{}) && (!errors.As(err, &ae) || ae.Status != tc.status) {
				t.Errorf("err = %v, want status %v", err, tc.status)
			}
			if tc.ctx == context.Background() && !strings.Contains(err.Error(), "--max-pipeline-memory") {
				t.Errorf("err = %v, want it to name --max-pipeline-memory", err)
			}
			if len(req.Steps) != 0 {
				t.Errorf("%d steps ran without room", len(req.Steps))
			}
		})
	}
	fi, err := e.Control().Function(context.Background(), "a")
	if err != nil {
		t.Fatal(err)
	}
	if fi.Requests != 0 {
		t.Errorf("a served %d requests of pipelines refused room", fi.Requests)
	}
	pi, err := e.Control().Function(context.Background(), "p")
	if err != nil {
		t.Fatal(err)
	}
	if pi.Requests != 3 {
		t.Errorf("p counted %d requests, want the 3 refused room", pi.Requests)
	}
	mem.Release(1 << 20)
	if err := run.Invoke(context.Background(), "p", &call.Request{Input: []byte("abcdefgh")}); err != nil {
		t.Fatalf("with room again: %v", err)
	}
	if got := mem.InUse(); got != 0 {
		t.Errorf("%d bytes held after the requests", got)
	}
}
