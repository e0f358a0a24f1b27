package engine

import (
	"context"
	"errors"
	"math/bits"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/call"
	"github.com/plover-run/plover/device"
	"github.com/plover-run/plover/errdefs"
)

// batcher gathers a batching version's requests into runs of one chain
// (manifest "batch", ABI 2.1). It is work-conserving: a run starts as soon
// as a slot (an instance) is free and requests are queued, taking up to
// max_items of them in arrival order. With max_delay set, a free slot may
// hold a partial batch for company, but only while other runs of the
// function are in flight (so a lone request never waits), never longer
// than max_delay after the oldest request in it arrived, and not at all
// when a request in it has a deadline before then and a run after it
// (holdFor).
//
// Runs execute on their own goroutines; a request's goroutine only waits
// for its item, so its deadline, cancellation and client checks act on it
// alone: a request that gives up leaves the run it was taken into, which
// goes on for the others.
type batcher struct {
	e               *Engine
	v               *version
	maxItems        int
	delay           time.Duration
	itemIn, itemOut int64
	// pad rounds a run up to a power of two items (zero inputs, outputs
	// dropped) so that a CUDA instance records one graph per bucket.
	pad bool

	mu        sync.Mutex
	pending   []*batchItem
	running   int         // runs in flight
	holdSince time.Time   // when a free slot began holding for company; zero: not holding
	timer     *time.Timer // ends a hold
	// soonest is the earliest deadline of the pending items, kept as they
	// come and found again (a walk) after any leaves (stale), so that a
	// hold looks at it once and not at every item on every arrival.
	soonest time.Time
	stale   bool
	// runTook is how long a batch's run takes, smoothed over the last
	// runs: what a request held for company must still have before its
	// deadline once the hold ends.
	runTook time.Duration
	bufs    sync.Pool // *batchBufs
}

// batchSizes counts runs by items, in power-of-two buckets (the
// plover_batch_size histogram): counts[k] is runs of at most 2^k items.
// A function's (function.batches), like its other counters: its versions'
// runs add up, so a redeploy or rollback neither drops the counts (a
// counter going back) nor brings an earlier version's back.
type batchSizes struct {
	counts [abi.MaxBatchItemsLog2 + 1]atomic.Uint64
	sum    atomic.Uint64
}

func (s *batchSizes) observe(n int) {
	s.counts[bits.Len(uint(n-1))].Add(1)
	s.sum.Add(uint64(n))
}

type batchBufs struct{ in, out []byte }

// Item states: a request is pending, having its input copied into a run,
// taken into the run, having its result written by the run, or abandoned by
// its waiter (deadline, cancellation, client gone). A waiter may leave only
// while its request's buffers are not being read or written.
const (
	itemPending int32 = iota
	itemCopying
	itemTaken
	itemWriting
	itemAbandoned
)

type batchItem struct {
	req      *call.Request
	deadline time.Time
	enq      time.Time
	state    atomic.Int32
	// running is set by its run once the device admits it, from itemTaken
	// on (written before the state says taken).
	running *atomic.Bool
	done    chan struct{} // closed once the run has written the result
	// Written by the run before done is closed.
	err       error
	start     call.Start
	queue     time.Duration // enqueued until its run started
	batchWait time.Duration // the part of queue a free slot held it for company
	load      time.Duration
	sched     time.Duration // the run's wait for the device's scheduler
	size      int
	device    string
}

func newBatcher(e *Engine, v *version) *batcher {
	b := v.manifest.Batch
	return &batcher{e: e, v: v, maxItems: b.MaxItems, delay: b.Delay(), itemIn: b.ItemInputBytes, itemOut: b.ItemOutputBytes,
		pad: device.PadsBatches(v.manifest.Target)}
}

// invoke runs req as one item of a batch and waits for its result; t0 is
// when it reached the engine, enq the clock reading its queue time counts
// from. Its timing is ended, whatever the outcome (timed).
func (b *batcher) invoke(ctx context.Context, req *call.Request, deadline, t0, enq time.Time) error {
	v := b.v
	if req.Override != nil {
		return endUnqueued(req, t0, errorf(errdefs.KindBadRequest, nil, "function %s batches requests (plover.json \"batch\"): per-request chain, out_bytes and tmp_bytes overrides do not apply to it", v.fn.name))
	}
	if int64(len(req.Input)) != b.itemIn {
		return endUnqueued(req, t0, errorf(errdefs.KindBadRequest, nil, "input is %d bytes; function %s batches requests of exactly %d bytes (batch.item_input_bytes)", len(req.Input), v.fn.name, b.itemIn))
	}
	it := &batchItem{req: req, deadline: deadline, enq: enq, done: make(chan struct{})}
	b.mu.Lock()
	if b.fullLocked() {
		b.mu.Unlock()
		req.Timing.EndIn(&req.Timing.Queue, time.Since(t0)) // refused at its queue: no dispatch
		return v.pool.busy()
	}
	b.pending = append(b.pending, it)
	if len(b.pending) == 1 || it.deadline.Before(b.soonest) {
		b.soonest = it.deadline
	}
	b.mu.Unlock()
	// A panic before the item ends (dispatch's, say; the transport
	// recovers it) takes it back: left listed, a later run would copy
	// into req, which the transport has pooled for another request by
	// then.
	ended := false
	defer func() {
		if !ended {
			b.abandon(it)
		}
	}()
	b.dispatch()
	err := b.await(ctx, it, deadline)
	ended = true
	b.timed(it, time.Since(t0))
	return err
}

// timed ends the timing of it's request, of total time in the engine: one
// that left before its batch's answer (its deadline, its client gone)
// spent it waiting for its batch, queue as far as it knows (the run may
// have taken it, but a run's time is no item's until answered), not
// Dispatch; one whose batch's run never reached an instance spent what
// its queue and load do not hold on a load that failed or outlasted the
// deadlines; one that ran is timed as the unbatched path times it.
func (b *batcher) timed(it *batchItem, total time.Duration) {
	t := &it.req.Timing
	switch {
	case it.state.Load() == itemAbandoned:
		t.EndIn(&t.Queue, total)
	case it.req.BatchSize == 0:
		t.EndIn(&t.Load, total)
	default:
		t.End(total)
	}
}

// await waits for it's batch to end within ctx and deadline, or takes it
// back (abandon), and gives its result.
func (b *batcher) await(ctx context.Context, it *batchItem, deadline time.Time) error {
	v, req := b.v, it.req
	t := time.NewTimer(time.Until(deadline))
	defer t.Stop()
	var poll <-chan time.Time
	if req.Gone != nil {
		tk := time.NewTicker(goneInterval)
		defer tk.Stop()
		poll = tk.C
	}
	shut := b.e.shutting()
	for {
		select {
		case <-it.done:
			return b.finish(it)
		case <-shut:
			if b.unlist(it) {
				return shutDown(v.fn.name, "waited for its batch")
			}
			// A run took it: that run answers it, refused at its turn
			// on the device if it had not started.
			shut = nil
		case <-ctx.Done():
			if err := b.abandon(it); err == nil {
				return errorf(errdefs.KindUnavailable, ctx.Err(), "function %s: the request was cancelled while it waited for its batch", v.fn.name)
			}
			return b.finish(it)
		case <-t.C:
			if err := b.abandon(it); err == nil {
				return errorf(errdefs.KindTimeout, nil, "function %s: the request's deadline passed before its batch finished", v.fn.name)
			}
			return b.finish(it)
		case <-poll:
			// Looked for until its run is on the device, as an unbatched
			// request is: from then on a client that only half-closed its
			// connection (nc -N, some proxies; to the transport's check,
			// gone) gets the answer computed for it.
			if st := it.state.Load(); st != itemPending && st != itemCopying && it.running != nil && it.running.Load() {
				poll = nil
				continue
			}
			if !req.Gone() {
				continue
			}
			if err := b.abandon(it); err == nil {
				return errorf(errdefs.KindGone, nil, "function %s: the client went away while the request waited", v.fn.name)
			}
			return b.finish(it)
		}
	}
}

// errWritten says the run is writing the item's result: wait for it.
var errWritten = errors.New("the run is writing the result")

// abandon takes it out of the batcher: out of pending, or out of the run
// that took it (the run then skips it). It fails when the run is already
// writing it.
func (b *batcher) abandon(it *batchItem) error {
	for {
		switch it.state.Load() {
		case itemPending:
			if b.unlist(it) {
				return nil
			}
		case itemTaken:
			if it.state.CompareAndSwap(itemTaken, itemAbandoned) {
				return nil
			}
		case itemCopying:
			// The run is copying this request's input (a few KiB): the
			// caller may reuse the buffer once Invoke returns.
			runtime.Gosched()
		default:
			<-it.done
			return errWritten
		}
	}
}

// unlist takes it, abandoned, out of pending, unless a run took it
// meanwhile (false).
func (b *batcher) unlist(it *batchItem) bool {
	if !it.state.CompareAndSwap(itemPending, itemAbandoned) {
		return false
	}
	b.mu.Lock()
	if i := slices.Index(b.pending, it); i >= 0 {
		b.pending = slices.Delete(b.pending, i, i+1)
		b.stale = true
	}
	b.mu.Unlock()
	return true
}

// finish copies a finished item's result into its request. A run that
// panicked (runChain) panics again here, in the request's own goroutine,
// as an unbatched request's run panics in its own, for its transport to
// recover (errdefs.Panic).
func (b *batcher) finish(it *batchItem) error {
	if p, ok := it.err.(*errdefs.Panic); ok {
		panic(p)
	}
	r := it.req
	if r.Start < it.start {
		r.Start = it.start
	}
	r.Timing.Queue, r.Timing.Load = it.queue, r.Timing.Load+it.load
	r.Timing.BatchWait, r.Timing.Sched, r.BatchSize, r.Device = it.batchWait, it.sched, it.size, it.device
	return it.err
}

// dispatch starts runs while requests are queued, a slot is free and the
// hold rule (see batcher) lets them go.
func (b *batcher) dispatch() {
	for {
		b.mu.Lock()
		if len(b.pending) == 0 {
			b.holdSince = time.Time{}
			b.mu.Unlock()
			return
		}
		now := time.Now()
		if hold := b.holdFor(now); hold > 0 {
			// Only a free slot holds: with none free, a finishing run
			// dispatches anyway.
			if b.v.pool.slotFree() {
				if b.holdSince.IsZero() {
					b.holdSince = now
				}
				if b.timer == nil {
					b.timer = time.AfterFunc(hold, b.dispatch)
				} else {
					b.timer.Reset(hold)
				}
			}
			b.mu.Unlock()
			return
		}
		if !b.v.pool.trySlot() {
			b.mu.Unlock()
			return
		}
		// The run holds the version like a request does: its requests may
		// all give up while it runs, and a redeploy must not unload the
		// library under it.
		if !b.v.pool.ref() {
			b.v.pool.dropSlot()
			b.mu.Unlock()
			return
		}
		n := min(len(b.pending), b.maxItems)
		items := make([]*batchItem, n)
		copy(items, b.pending)
		b.pending = slices.Delete(b.pending, 0, n)
		b.stale = true
		held := b.holdSince
		b.holdSince = time.Time{}
		b.running++
		b.mu.Unlock()
		for _, it := range items {
			it.queue = now.Sub(it.enq)
			if !held.IsZero() {
				it.batchWait = now.Sub(maxTime(held, it.enq))
			}
		}
		go b.run(items)
	}
}

// holdFor is how much longer a free slot should hold the pending partial
// batch for company; 0: run it now. A request whose deadline comes before
// the hold would end and a run after it (runTook) is not held: it runs
// now. Called with b.mu held.
func (b *batcher) holdFor(now time.Time) time.Duration {
	if b.delay <= 0 || b.running == 0 || len(b.pending) >= b.maxItems {
		return 0
	}
	if b.stale {
		b.soonest = b.pending[0].deadline
		for _, it := range b.pending[1:] { // fewer than max_items
			if it.deadline.Before(b.soonest) {
				b.soonest = it.deadline
			}
		}
		b.stale = false
	}
	end := b.pending[0].enq.Add(b.delay)
	if b.soonest.Before(end.Add(b.runTook)) {
		return 0
	}
	return max(0, end.Sub(now))
}

func maxTime(a, c time.Time) time.Time {
	if a.After(c) {
		return a
	}
	return c
}

// run executes one batch on an instance (holding a slot), hands each item
// its result, and dispatches what queued meanwhile.
func (b *batcher) run(items []*batchItem) {
	defer b.v.pool.unref()
	// Buffers for the run's items, not max_items': host memory in the
	// server that nothing else bounds (up to twice abi.MaxBufferBytes a
	// run in flight), so as large as the items' own bytes and answers.
	k := int64(b.padded(len(items)))
	bb, _ := b.bufs.Get().(*batchBufs)
	if bb == nil {
		bb = &batchBufs{}
	}
	bb.in, bb.out = sized(bb.in, k*b.itemIn), sized(bb.out, k*b.itemOut)
	// Items abandoned while pending were removed; the rest have their
	// input copied and are taken now, and from here an abandoned item is
	// only skipped.
	live := items[:0]
	running := new(atomic.Bool)
	for _, it := range items {
		if it.state.CompareAndSwap(itemPending, itemCopying) {
			copy(bb.in[int64(len(live))*b.itemIn:], it.req.Input)
			it.running = running
			it.state.Store(itemTaken)
			live = append(live, it)
		}
	}
	if len(live) > 0 {
		b.runItems(live, bb)
	} else {
		b.ended(0)
	}
	b.bufs.Put(bb)
	b.v.pool.release() // and dispatches what queued meanwhile
}

// ended counts a run as ended, having taken took (0: it ran nothing):
// from then on a lone request does not wait for company (holdFor). Before
// its items are answered, so that one answered and at once followed by the
// next finds no run in flight.
func (b *batcher) ended(took time.Duration) {
	b.mu.Lock()
	b.running--
	switch {
	case took > 0 && b.runTook == 0: // the first run: all there is to go by
		b.runTook = took
	case took > 0:
		b.runTook += (took - b.runTook) / 4
	}
	b.mu.Unlock()
}

// padded is how many items a run of n takes: with padding (a CUDA graph
// per length), the next power of two, up to max_items.
func (b *batcher) padded(n int) int {
	if b.pad {
		return min(1<<bits.Len(uint(n-1)), b.maxItems)
	}
	return n
}

// sized is buf as n bytes long, in place where it has the room.
func sized(buf []byte, n int64) []byte {
	if int64(cap(buf)) >= n {
		return buf[:n]
	}
	hookBatchAlloc(n)
	return make([]byte, n)
}

// hookBatchAlloc is told the size of each batch buffer made: a test sees
// what a run asked for (a plain variable, set only by tests, which do not
// run in parallel).
var hookBatchAlloc = func(int64) {}

// runItems runs one chain over items, whose inputs are in bb.in already,
// and delivers each its slice of out, or the run's error to all of them;
// but for an input refused (plover_reject), whose run is then retried
// item by item (rerunAlone), so that the refusal goes to its own request
// alone.
func (b *batcher) runItems(items []*batchItem, bb *batchBufs) {
	start := time.Now()
	n := len(items)
	k := b.padded(n)
	in := bb.in[:int64(k)*b.itemIn]
	clear(in[int64(n)*b.itemIn:])
	out := bb.out[:int64(k)*b.itemOut]
	all := b.runChain(items, in, out, k)
	took := time.Since(start) - all.load // a cold start's load is no run's length
	if all.ran {
		// Only now: a batch whose instance could not be had, or whose
		// deadline passed while it loaded, is no run of n items.
		b.v.fn.batches.observe(n)
	}
	if all.err != nil {
		// A run that failed (a refused input, a device unhealthy, a
		// deadline) says nothing of how long a run takes, nor do the
		// one-by-one runs after a refusal: counted, they lowered or raised
		// the hold rule's guess, and requests with tight deadlines were
		// held past them, or none were held.
		took = 0
	}
	// Before any answer, the one-by-one runs' too: a request answered
	// and at once followed by the next finds no batch run in flight to
	// hold it for (holdFor); the one-by-one runs take no company.
	b.ended(took)
	if n > 1 && errdefs.KindOf(all.err) == errdefs.KindRejected {
		b.rerunAlone(items, in, out, all)
		return
	}
	for i := range items {
		b.answer(items, i, all, nil, out)
	}
}

// rerunAlone runs each item of a run that was refused (plover_reject) by
// itself, its input and output where they are in the run's, and answers
// it as soon as its own run ends: the ABI has no refusal per item (the
// bundle's message does not say whose input it refused), so one request's
// bad input refuses the run and only running each alone finds it, while
// its batch-mates sent nothing wrong. Each waits for the one-by-one runs
// before its own, not for all of them: answered only after the last, every
// request of a batch of n waited for n runs, and met no deadline that
// fewer would have allowed (the refused one's 422 turned into a 504 too).
// The runs go earliest deadline first (arrival order among equals), so
// that as many as can meet theirs; a request that gave up (cancelled,
// client gone) or whose deadline has passed is not run at all: its waiter
// leaves with its own error (invoke), which a run would only have
// delayed for those after it.
func (b *batcher) rerunAlone(items []*batchItem, in, out []byte, all batchRun) {
	order := make([]int, len(items))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(i, j int) int { return items[i].deadline.Compare(items[j].deadline) })
	for _, i := range order {
		it := items[i]
		if it.state.Load() != itemTaken || !time.Now().Before(it.deadline) {
			continue
		}
		o := int64(i) * b.itemOut
		alone := b.runChain(items[i:i+1], in[int64(i)*b.itemIn:int64(i+1)*b.itemIn], out[o:o+b.itemOut], 1)
		b.answer(items, i, all, &alone, out)
	}
}

// answer hands items[i] its result: its part of all, the run of the
// whole batch, or with alone its own one-by-one run after the batch's
// refusal, its output at its slice of out either way.
func (b *batcher) answer(items []*batchItem, i int, all batchRun, alone *batchRun, out []byte) {
	it, n := items[i], len(items)
	if !it.state.CompareAndSwap(itemTaken, itemWriting) {
		return // its request gave up
	}
	res, size := all, n
	// Its input was copied into the run's (run), and it has its part of
	// the run's host copies (the device's), as an unbatched request has
	// its run's.
	copied := b.itemIn + partOf(all.tm.Copied, i, n)
	if alone != nil {
		res, size = *alone, 1
		res.start, res.load, res.sched = max(res.start, all.start), res.load+all.load, res.sched+all.sched
		copied += res.tm.Copied
	}
	if !all.ran {
		// The batch's run never reached an instance (and so had no
		// one-by-one runs, which follow a run's refusal): as an unbatched
		// request's that did not run, its start is not counted (invoke
		// counts one for a batch size), and it was in no run to report.
		size = 0
	}
	it.err, it.start, it.load, it.sched, it.size, it.device = res.err, res.start, res.load, res.sched, size, res.dev
	rq := it.req
	if res.err == nil {
		if int64(cap(rq.Output)) < b.itemOut {
			rq.Output = make([]byte, b.itemOut)
		}
		rq.Output = rq.Output[:b.itemOut]
		copy(rq.Output, out[int64(i)*b.itemOut:])
		copied += b.itemOut
		rq.Timing.CopyIn, rq.Timing.Kernels, rq.Timing.CopyOut = res.tm.CopyIn, res.tm.Kernels, res.tm.CopyOut
		rq.Timing.Handoff, rq.Timing.Handback = res.tm.Handoff, res.tm.Handback
	}
	rq.Copied += copied
	close(it.done)
}

// partOf is item i's part of c bytes a run of n items copied: an even
// split, the remainder to the first items, so that the parts add up to c.
func partOf(c int64, i, n int) int64 {
	p := c / int64(n)
	if int64(i) < c%int64(n) {
		p++
	}
	return p
}

// batchRun is what one chain over some of a batch's items gave them.
type batchRun struct {
	err         error
	start       call.Start
	load, sched time.Duration
	dev         string
	tm          device.Timing // the run's, read before its instance went back
	// ran says the chain reached an instance's run, well or not, as
	// pool.run's ran: false when no instance was had, the deadline passed
	// before the run, or a run to go again found no instance to go on.
	ran bool
}

// runChain runs the chain once over items (k of them in the chain's eyes:
// padding), their inputs in in and their outputs to go to out, on an
// instance it takes and puts back.
func (b *batcher) runChain(items []*batchItem, in, out []byte, k int) (res batchRun) {
	// The run is the batcher's own goroutine, where nothing recovers a
	// panic (a bug in a device's Go code): the process ended, every
	// tenant's requests with it. runOn has closed the instance; the
	// run's requests each get the panic to raise again (finish).
	defer func() {
		if p := errdefs.Recovered(recover()); p != nil {
			res.err = p
		}
	}()
	e, v, f := b.e, b.v, b.v.fn
	m, pool := v.manifest, &b.v.pool
	// The run may take as long as its most patient request allows; a
	// request with a shorter deadline leaves the run at its own.
	deadline, ok := liveDeadline(items)
	if !ok { // every request gave up since the run took them
		res.err = b.allGone()
		return res
	}
	// The run's requests are its clients: once every one has left, a run
	// still waiting for the device's scheduler leaves it, as an unbatched
	// request whose client went away does, and runs nothing.
	gone := func() bool { _, left := liveDeadline(items); return !left }
	t0 := time.Now()
	inst, fresh, spent, err := pool.takeRetrying(context.Background(), deadline, nil)
	h := held{pool, inst}
	defer h.drop() // runs before the recovery above: the instance is closed first
	var r *device.Run
	var ended time.Time // the last run's end
	for retried := false; err == nil; retried = true {
		if fresh != call.Hot {
			load := time.Since(t0)
			res.start, res.load = max(res.start, fresh), res.load+load // a replaced worker's load adds to the first's
			if fresh == call.Cold {
				e.coldStarted(f, v, inst, load)
			}
		}
		now := time.Now()
		if deadline, err = b.stillDue(items, now, res.load); err != nil {
			ended = now
			break
		}
		r = &inst.run
		r.Input, r.Output, r.Chain, r.TmpLen, r.ZeroTmp, r.ZeroOut, r.ChainKey, r.Deadline = in, out, v.steps, m.TmpBytes, m.ZeroTmp, m.ZeroesOut(), 0, deadline
		if m.Graphs() {
			r.ChainKey = 1
		}
		r.Items = uint32(k)
		var wait time.Duration
		h.in = nil
		wait, ended, err = pool.runOn(context.Background(), inst, r, now, deadline, gone, items[0].running) // the run's items share it
		res.sched += wait
		res.ran = true
		r.Input, r.Output, r.Items = nil, nil, 0
		if err == nil || retried || !mayRunAgain(err) || spent && collateral(err) {
			break
		}
		// The worker died while the instance was idle (the run reached no
		// bundle code), or with its tenant's shared worker by another
		// function's fault: the run goes once more on a fresh worker, as
		// an unbatched request would; as its, the batch ran only if that
		// run happens (pool.runRetrying returns no run otherwise).
		res.ran, r = false, nil // a run on the next worker, or none: not the dead one's timing
		if inst, fresh, t0, err = pool.replace(context.Background(), inst, err, deadline, nil); inst != nil {
			h.in = inst
		} else if err == nil {
			err = errorf(errdefs.KindTimeout, nil, "function %s: the requests' deadline passed before they ran (their worker had died)", f.name)
		}
	}
	b.settle(&res, &h, inst, r, len(out), ended, err)
	return res
}

// allGone is the error of a run whose requests all gave up before it ran.
func (b *batcher) allGone() error {
	return errorf(errdefs.KindUnavailable, nil, "function %s: every request of the run gave up before it ran", b.v.fn.name)
}

// stillDue is the deadline the run's items still allow at now, or why it
// runs nothing. Requests that gave up (cancelled, client gone, deadline)
// while the instance was taken or made left the run: it runs for those
// left, until the latest of their deadlines, and for none runs nothing (an
// unbatched request's cancelled context stops its run at the scheduler;
// this run's context is no request's, and it leaves the scheduler's queue
// by gone). As run.go's, a load or a take that outlasted every request's
// deadline runs nothing (the scheduler refuses it too, but with the
// schedulers off nothing else would stop it).
func (b *batcher) stillDue(items []*batchItem, now time.Time, load time.Duration) (time.Time, error) {
	deadline, anyLeft := liveDeadline(items)
	if !anyLeft {
		return deadline, b.allGone()
	}
	if !now.Before(deadline) {
		return deadline, errorf(errdefs.KindTimeout, nil, "function %s: the requests' deadline passed before they ran (load %v)", b.v.fn.name, load)
	}
	return deadline, nil
}

// settle ends a run that took inst (nil: none was had): its output's
// length checked against the outLen the batch expects, inst put back
// (broken where the device or its program failed) at the run's end, as
// runOn read it, and the run's failure or success counted.
func (b *batcher) settle(res *batchRun, h *held, inst *instance, r *device.Run, outLen int, ended time.Time, err error) {
	pool := &b.v.pool
	var p *placement
	if inst != nil {
		p, res.dev = inst.dev, inst.dev.name
		if err == nil && r.OutLen != int64(outLen) {
			err = &device.KernelError{Msg: abi.OutLenChanged}
		}
		if r != nil {
			res.tm = r.Timing
		}
		broken := err != nil && (errors.Is(err, device.ErrUnhealthy) || inst.dev.dead.Load() || programLost(err))
		h.in = nil
		pool.put(inst, broken, ended)
	}
	if err != nil {
		res.err = b.v.runFailed(p, err)
	} else {
		pool.succeeded()
	}
}

// liveDeadline is the latest deadline of the items still in their run
// (taken, not abandoned); ok is false when none is.
func liveDeadline(items []*batchItem) (deadline time.Time, ok bool) {
	for _, it := range items {
		if it.state.Load() == itemTaken {
			ok = true
			if it.deadline.After(deadline) {
				deadline = it.deadline
			}
		}
	}
	return deadline, ok
}

// full reports a queue that refuses the next request.
func (b *batcher) full() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.fullLocked()
}

func (b *batcher) fullLocked() bool { return len(b.pending) >= b.v.policy.queue+b.maxItems }

// pendingCount is the requests waiting for a batch (queue depth).
func (b *batcher) pendingCount() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.pending)
}
