package engine_test

import (
	"context"
	"encoding/binary"
	"testing"
	"time"

	"github.com/plover-run/plover/call"
	"github.com/plover-run/plover/engine"
	"github.com/plover-run/plover/errdefs"
	"github.com/plover-run/plover/internal/testkit"
)

// stampedResult is a batchResult with when its Invoke returned.
type stampedResult struct {
	batchResult
	at time.Time
}

func invokeStamped(e *engine.Engine, name string, in []byte, deadline time.Time) chan stampedResult {
	ch := make(chan stampedResult, 1)
	go func() {
		req := &call.Request{Input: in, Deadline: deadline}
		err := e.Invoke(context.Background(), name, req)
		r := stampedResult{batchResult{req: req, err: err}, time.Now()}
		if err == nil && len(req.Output) == 8 {
			r.value, r.items = binary.LittleEndian.Uint32(req.Output), binary.LittleEndian.Uint32(req.Output[4:])
		}
		ch <- r
	}()
	return ch
}

// refusedBatch queues 8 requests of the batching test bundle, one at a
// time, behind a busy run of 500 ms on its one instance (room to queue
// them on a loaded machine), the first refused (0xBAD, which refuses the
// batch at once), the others each running for runMs alone, all with the
// deadline t0+dl (t0: once the busy run is under way), and returns their
// results in order.
func refusedBatch(t *testing.T, name string, runMs uint32, dl time.Duration) ([]stampedResult, time.Time) {
	t.Helper()
	m := testkit.BatchManifest(name, 8, "")
	m.MaxInstances = 1
	e := batchEngine(t, m)
	busy := invokeAsync(e, name, item(1, 500), time.Time{})
	waitBusy(t, e, name, 1)
	t0 := time.Now()
	var chs []chan stampedResult
	for i := range 8 {
		v := uint32(100 + i)
		if i == 0 {
			v = 0xBAD
		}
		chs = append(chs, invokeStamped(e, name, item(v, runMs), t0.Add(dl)))
		// One at a time, so that the batch (and its one-by-one runs,
		// deadlines being equal) has them in this order.
		waitQueued(t, e, name, i+1)
	}
	if r := <-busy; r.err != nil {
		t.Fatal(r.err)
	}
	rs := make([]stampedResult, len(chs))
	for i, ch := range chs {
		rs[i] = <-ch
		t.Logf("request %d: at %v value %d items %d err %v", i, rs[i].at.Sub(t0).Round(time.Millisecond), rs[i].value, rs[i].items, rs[i].err)
	}
	return rs, t0
}

// After a batch refused for one input, each request runs alone and is
// answered as soon as its own run ends, not after the last batch-mate's:
// the first batch-mate's answer comes runs before the last's, and the
// refused request's 422 before either (it runs first, and its run refuses
// at once). Answered only after all the one-by-one runs, all eight came
// within a millisecond of one another.
func TestBatchRefusalAnswersEachRequestAfterItsOwnRun(t *testing.T) {
	const runMs = 100
	rs, _ := refusedBatch(t, "ra", runMs, 5*time.Second)
	if errdefs.KindOf(rs[0].err) != errdefs.KindRejected {
		t.Fatalf("the refused request: %v, want its refusal", rs[0].err)
	}
	for i, r := range rs[1:] {
		if r.err != nil || r.value != uint32(102+i) || r.items != 1 {
			t.Fatalf("batch-mate %d: value %d items %d err %v, want value %d run alone", i+1, r.value, r.items, r.err, 102+i)
		}
	}
	first, last := rs[1].at, rs[len(rs)-1].at
	// Six one-by-one runs of 100 ms lie between them: 600 ms, more on a
	// loaded machine, never less; held to the end, none.
	if gap := last.Sub(first); gap < 3*runMs*time.Millisecond {
		t.Errorf("the first batch-mate was answered %v before the last (want at least %v): answers were held for the last one-by-one run", gap, 3*runMs*time.Millisecond)
	}
	if !rs[0].at.Before(last) {
		t.Errorf("the refused request was answered at the same time as the last batch-mate, or after: its 422 waited for their runs")
	}
}

// With a deadline that leaves room for a few one-by-one runs but not for
// all: the refused request gets its 422 (its run is first), not a 504; the
// batch-mates whose runs fit get their answers, in run order, and those
// whose deadline passed first time out, none with another's answer. Held
// until every run ended, all eight timed out.
func TestBatchRefusalShortDeadlineAnswersWhatFits(t *testing.T) {
	const runMs = 100
	// The busy run ends by 500 ms; then the batch's run and the refused
	// one's alone (at once), then 100 ms each: about 4 fit by 950 ms, 7
	// need 1200 ms.
	rs, _ := refusedBatch(t, "rs", runMs, 950*time.Millisecond)
	if errdefs.KindOf(rs[0].err) != errdefs.KindRejected {
		t.Fatalf("the refused request: %v, want its refusal (422), not its deadline", rs[0].err)
	}
	ok, timedOut := 0, false
	for i, r := range rs[1:] {
		switch {
		case r.err == nil:
			if r.value != uint32(102+i) || r.items != 1 {
				t.Errorf("batch-mate %d: value %d items %d, want %d run alone", i+1, r.value, r.items, 102+i)
			}
			if timedOut {
				t.Errorf("batch-mate %d was answered after an earlier one timed out: runs out of order", i+1)
			}
			ok++
		case errdefs.KindOf(r.err) == errdefs.KindTimeout:
			timedOut = true
		default:
			t.Errorf("batch-mate %d: %v, want its answer or its deadline", i+1, r.err)
		}
	}
	if ok == 0 {
		t.Errorf("no batch-mate was answered within a deadline that leaves room for about four one-by-one runs")
	}
	if !timedOut {
		t.Logf("every batch-mate met a deadline meant to cover only some of them (a fast machine?)")
	}
}

// The one-by-one runs after a refusal go earliest deadline first: a
// batch-mate queued last but with the soonest deadline is answered before
// the others (arrival order among equal deadlines).
func TestBatchRefusalRerunsEarliestDeadlineFirst(t *testing.T) {
	m := testkit.BatchManifest("rd", 8, "")
	m.MaxInstances = 1
	e := batchEngine(t, m)
	busy := invokeAsync(e, "rd", item(1, 500), time.Time{})
	waitBusy(t, e, "rd", 1)
	t0 := time.Now()
	dls := []time.Duration{10 * time.Second, 10 * time.Second, 10 * time.Second, 5 * time.Second}
	var chs []chan stampedResult
	for i, dl := range dls {
		v := uint32(100 + i)
		if i == 0 {
			v = 0xBAD
		}
		chs = append(chs, invokeStamped(e, "rd", item(v, 100), t0.Add(dl)))
		waitQueued(t, e, "rd", i+1)
	}
	if r := <-busy; r.err != nil {
		t.Fatal(r.err)
	}
	var rs []stampedResult
	for _, ch := range chs {
		rs = append(rs, <-ch)
	}
	for i, r := range rs[1:] {
		if r.err != nil || r.value != uint32(102+i) {
			t.Fatalf("batch-mate %d: value %d err %v", i+1, r.value, r.err)
		}
	}
	if last := rs[3]; !last.at.Before(rs[1].at) || !rs[1].at.Before(rs[2].at) {
		t.Errorf("answered at %v, %v, %v after t0: want the last queued (soonest deadline) first, then the others in arrival order",
			rs[1].at.Sub(t0), rs[2].at.Sub(t0), rs[3].at.Sub(t0))
	}
}

// After a refusal, batch-mates with mixed fates (one refused, one
// cancelled during the one-by-one runs, one with a short deadline, the
// others plain) each get their own outcome: the refused its 422, the rest
// their own value+1 or their own failure, never another request's output.
// (The shape of a read-only review's check.)
func TestBatchRefusalMixedFates(t *testing.T) {
	m := testkit.BatchManifest("mx", 8, "")
	m.MaxInstances = 1
	e := batchEngine(t, m)
	busy := invokeAsync(e, "mx", item(1, 300), time.Time{})
	waitBusy(t, e, "mx", 1)
	type job struct {
		v, sleep uint32
		dl       time.Duration
		cancel   bool
	}
	jobs := []job{{10, 80, 0, false}, {0xBAD, 0, 0, false}, {30, 80, 0, true}, {40, 0, 450 * time.Millisecond, false}, {50, 80, 0, false}, {60, 0, 0, false}}
	var chs []chan batchResult
	var cancels []context.CancelFunc
	for _, j := range jobs {
		ctx, cancel := context.WithCancel(context.Background())
		cancels = append(cancels, cancel)
		var dl time.Time
		if j.dl > 0 {
			dl = time.Now().Add(j.dl)
		}
		ch := make(chan batchResult, 1)
		in := item(j.v, j.sleep)
		go func() {
			req := &call.Request{Input: in, Deadline: dl}
			err := e.Invoke(ctx, "mx", req)
			r := batchResult{req: req, err: err}
			if err == nil && len(req.Output) == 8 {
				r.value, r.items = binary.LittleEndian.Uint32(req.Output), binary.LittleEndian.Uint32(req.Output[4:])
			}
			ch <- r
		}()
		chs = append(chs, ch)
	}
	defer func() {
		for _, c := range cancels {
			c()
		}
	}()
	waitQueued(t, e, "mx", len(jobs))
	if r := <-busy; r.err != nil {
		t.Fatal(r.err)
	}
	time.Sleep(100 * time.Millisecond) // the one-by-one runs are under way
	cancels[2]()
	for i, ch := range chs {
		r := <-ch
		t.Logf("job %d (value %#x): value %d items %d batch %d err %v", i, jobs[i].v, r.value, r.items, r.req.BatchSize, r.err)
		switch {
		case jobs[i].v == 0xBAD:
			if errdefs.KindOf(r.err) != errdefs.KindRejected {
				t.Errorf("refused job: %v, want its refusal", r.err)
			}
		case r.err != nil:
			if jobs[i].dl == 0 && !jobs[i].cancel {
				t.Errorf("job %d, with neither deadline nor cancellation: %v", i, r.err)
			}
		case r.value != jobs[i].v+1 || r.items != 1:
			t.Errorf("job %d got value %d items %d, want %d run alone", i, r.value, r.items, jobs[i].v+1)
		}
	}
}
