package engine

import (
	"context"
	"math"
	"time"

	"github.com/plover-run/plover/errdefs"
	"github.com/plover-run/plover/pipedef"
)

// PinVersion resolves a version of name other than, or equal to, its
// current one: ref is a version id or a prefix of 8 or more characters (a
// pipeline step that pins a version). A version that is not current gets a
// warm pool of its own beside the current one's, kept while requests use
// it and unloaded by idle_ttl as any other. Every successful PinVersion
// must be released. Its store reads end at deadline, as Pin's.
func (e *Engine) PinVersion(ctx context.Context, name, ref string, deadline time.Time) (Pin, error) {
	for attempt := 0; ; attempt++ {
		f, v := e.tab.match(name, ref)
		if v != nil {
			if v.pool.ref() {
				return Pin{e, f, v}, nil
			}
			continue // retired between the lock and ref: look again
		}
		if attempt == 4 {
			return Pin{}, errorf(errdefs.KindUnavailable, nil, "function %s version %s: its record kept changing while this node loaded it; retry", name, errdefs.QuoteName(ref))
		}
		deadline = e.tab.deadline(deadline, time.Now()) // one bound for all its reads
		if f == nil {
			if _, err := e.tab.lookup(ctx, name, deadline); err != nil {
				return Pin{}, err
			}
			continue
		}
		rctx, cancel := e.tab.bound(ctx, deadline)
		rec, err := e.tab.record(rctx, name)
		cancel()
		if err != nil {
			return Pin{}, err
		}
		rv, err := pipedef.Pick(rec, ref)
		if err != nil {
			return Pin{}, errorf(errdefs.KindNotFound, err, "%s", err.Error())
		}
		e.tab.pin(f, rv, rec)
	}
}

// Name is the function's name as the engine keeps it: a copy of its own,
// safe to keep (a plan, a metric label) after the request that named it
// has gone and its buffer serves another.
func (p Pin) Name() string { return p.f.name }

// MaxInput is the most input bytes the pinned version takes (its
// manifest's max_input_bytes), known before it is loaded from the record's
// copy; 0 when unknown (a record written before the copy, not loaded yet).
func (p Pin) MaxInput() int64 {
	if p.v.loaded.Load() { // loaded: the manifest is written and read-only
		return p.v.manifest.MaxInputBytes
	}
	return p.v.maxIn.Load()
}

// OutBytes is the most output bytes one request to the pinned version
// gets (abi.Manifest.RequestOutBytes), known before it is loaded from the
// record's copy; 0 when unknown (a record written before the copy, not
// loaded yet) or for a pipeline.
func (p Pin) OutBytes() int64 {
	if p.v.loaded.Load() { // loaded: the manifest is written and read-only
		return p.v.manifest.RequestOutBytes()
	}
	return p.v.out.Load()
}

// Full is the 429 a request to the pinned version would get now for its
// full queue (max_queue), or nil: a front door asks before it reads a
// request's body, so that a flood of large bodies for one function is
// turned away without its bytes. It reads no store and waits for nothing;
// a version not loaded is never full.
func (p Pin) Full() error {
	if !p.v.loaded.Load() || !p.v.full() {
		return nil
	}
	return p.v.pool.busy()
}

// Room is how many of one caller's requests the pinned version takes at
// once on this node without refusing one (429): max_instances running
// and max_queue waiting (a batching version: max_queue past its batch's
// max_items). 0 until it is loaded here: its manifest is not known
// before.
func (p Pin) Room() int {
	if !p.v.loaded.Load() { // loaded: the manifest and policy are written and read-only
		return 0
	}
	if b := p.v.batch; b != nil {
		return addRoom(p.v.policy.queue, b.maxItems)
	}
	return addRoom(p.v.policy.max, p.v.policy.queue)
}

// addRoom is a+b of two non-negative counts, at most math.MaxInt: a sum
// that wrapped negative (a Go caller's MaxQueue of math.MaxInt) ran a
// pipeline's parallel branches one at a time.
func addRoom(a, b int) int {
	if a > math.MaxInt-b {
		return math.MaxInt
	}
	return a + b
}

// full reports a version whose next request would be refused now for its
// full queue (a batching one: its batch queue); busy is that refusal.
func (v *version) full() bool {
	if v.batch != nil {
		return v.batch.full()
	}
	return v.pool.full(v.policy.queue)
}

// Account counts a request the pinned version served other than through
// Invoke (a pipeline's, whose steps ran as requests of their own), in the
// function's requests, client errors or errors and mean latency. Not in
// its starts: the steps' functions counted theirs, and they are the
// programs that loaded; counted under the pipeline's name too, one load
// showed as two cold starts in plover_starts_total summed by kind.
func (p Pin) Account(total time.Duration, err error) {
	p.f.stats.ended(err, total)
}

// Retried takes back from the function's counts a refusal Invoke just
// returned (its full queue's 429) that its caller answers no client with
// but asks again: a pipeline's parallel branch refused while its own
// siblings held the room. Counted, the function showed refusals no
// client got.
func (p Pin) Retried() {
	p.f.stats.requests.Add(-1)
	p.f.stats.clientErrors.Add(-1)
}

// Refused counts a request for name that its transport refused itself
// before running it (a body it could not read or parse, over the
// function's max_input_bytes, of a type it does not take, a full queue,
// a body still arriving at the deadline), which Invoke never saw, in the
// function's requests and, by status's class, its client errors (4xx) or
// errors. A name no function has on this node counts nothing; it reads no
// store.
func (e *Engine) Refused(name string, status int) {
	if f := e.tab.function(name); f != nil {
		f.stats.requests.Add(1)
		if status < 500 {
			f.stats.clientErrors.Add(1)
		} else {
			f.stats.errors.Add(1)
		}
	}
}

// Deadline is a request's deadline: d, its own, or when it brings none
// (zero) the engine's request timeout from start, when it reached the
// server: the rule the engine applies to a request that comes without one,
// which the front door (frontdoor.Door.Begin, through the pipeline
// runner) applies as a transport begins a request.
func (e *Engine) Deadline(d, start time.Time) time.Time { return e.tab.deadline(d, start) }
