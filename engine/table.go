package engine

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/api"
	"github.com/plover-run/plover/device"
	"github.com/plover-run/plover/errdefs"
	"github.com/plover-run/plover/funclog"
	"github.com/plover-run/plover/ioshare"
	"github.com/plover-run/plover/registry"
)

// function is a name and its current version, and the versions pipeline
// steps pin that are not current.
type function struct {
	name   string
	out    *funclog.Sink       // where its programs' output goes
	cur    *version            // guarded by table.mu
	pinned map[string]*version // by id; guarded by table.mu
	// labels is, from the fullest record applied (labelsFrom versions:
	// a record only grows while its function lives), each label's latest
	// version id, as the record names it (Record.Find); nil until a
	// record is applied. Guarded by table.mu.
	labels     map[string]string
	labelsFrom int
	stats      stats
	// batches counts the runs of its versions that batch, all of them
	// (plover_batch_size): not a version's, which a redeploy would drop.
	batches batchSizes
	io      atomic.Pointer[ioshare.Flow] // its share of the server's I/O, once made (Engine.ioOf)
}

// output is where f's programs print: its sink, or nil when nothing keeps
// output (never a nil *Sink in the interface).
func (f *function) output() device.Output {
	if f.out == nil {
		return nil
	}
	return f.out
}

// Forgetter keeps something per function name outside the engine: the
// request metrics' series and their label slots (reqmetrics), a
// pipeline's step series (pipeline). The engine tells it, under its
// table's lock and so in the order the node applies them, when a name's
// current version changes on the node (Met: a deploy, a rollback, a
// request's first lookup, a poll that saw another node's change) and
// when its function leaves the node (Forget: a delete here, one seen
// through the store, its record deleted and made anew). It must not call
// the engine.
type Forgetter interface {
	Met(name string)
	Forget(name string)
}

// table is the functions this node knows and their current versions (and
// the versions pipelines pinned): the room every request passes through to
// find what it runs, and every deploy, rollback and refresh to change it.
type table struct {
	reg registry.Registry
	log *slog.Logger
	// forgetFlow drops a deleted function's share of the devices
	// (called under mu, so a redeploy's load gets a new flow).
	forgetFlow func(name string)
	// weighFlows sets a function's device flows (those made) to a
	// version's share and priority: its current version's, at every switch
	// and placement, under mu, so that they land in the switches' order.
	weighFlows func(name string, rv api.Version)
	// forgetters keep series per name outside the engine (Forgets):
	// told under mu, in the order the table changes.
	forgetters []Forgetter
	// logs keeps functions' output: each function (each life of its
	// name, from its lookup or deploy here to its delete) has its sink,
	// given to its programs; a delete (here or on another node) drops the
	// kept lines, ends the followers and the sink.
	logs *funclog.Store

	// mu is released by a defer wherever it guards calls out of the table
	// (forgetFlow, weighFlows: the scheduler's policy; logs): a transport
	// recovers a panic there, and a table left locked would hang every
	// later request while /healthz still answers.
	mu    sync.Mutex
	funcs map[string]*function
	// tags holds the version tag of each record Refresh last applied, so
	// that a poll reads only the records that changed.
	tags     map[string]string
	followed followedLives // of names followed here (followed.go)
	// epoch counts changes of funcs (a version switch, a removal) and the
	// store reads applied that found nothing to change, so that a store
	// read (or write) made without the lock is applied only if nothing was
	// applied meanwhile: a slow Refresh must not undo a deploy that just
	// returned, nor a deploy a delete that came after it (land).
	epoch  uint64
	closed bool
	// flights holds the store reads in progress of names not yet known
	// here, for lookups of the same name to share.
	flights map[string]*flight
	// timeout bounds a request's store read when it has no deadline of
	// its own (the engine's request timeout).
	timeout time.Duration
	// maxTimeout bounds a deadline a request asks for.
	maxTimeout time.Duration
	// life ends at Close, and with it the shared reads in progress.
	life context.Context
	stop context.CancelFunc
}

// newTable is a table of no functions over reg, its programs' output kept
// in logs, a request's store reads bounded by timeout when it has no
// deadline of its own.
func newTable(reg registry.Registry, logs *funclog.Store, timeout, maxTimeout time.Duration) *table {
	life, stop := context.WithCancel(context.Background())
	return &table{reg: reg, logs: logs, timeout: timeout, maxTimeout: maxTimeout, life: life, stop: stop, epoch: 1,
		funcs: map[string]*function{}, tags: map[string]string{}, flights: map[string]*flight{}}
}

// resolve finds the current version of name, reading the store the first
// time, and takes a reference on it. The store read ends at deadline (the
// request's; zero: the engine's request timeout from now), so a store that
// hangs answers 504 as a request's deadline passes, not when the store
// client gives up.
func (t *table) resolve(ctx context.Context, name string, deadline time.Time) (*function, *version, error) {
	for {
		t.mu.Lock()
		f := t.funcs[name]
		var v *version
		if f != nil {
			v = f.cur
		}
		t.mu.Unlock()
		if f == nil {
			if _, err := t.lookup(ctx, name, deadline); err != nil {
				return nil, nil, err
			}
			continue
		}
		if v != nil && v.pool.ref() {
			return f, v, nil
		}
		// Retired between the lock and ref: the next round sees its successor.
	}
}

// deadline is a request's deadline: d, its own (at most the engine's
// longest from t0), or when it brings none (zero) the engine's request
// timeout from t0, when it reached the engine. The one place that rule is
// written: the engine's entry points apply it
// before a request runs (Engine.Invoke, Pin.Invoke and InvokeSince, and
// Engine.Deadline for a front door), and PinVersion and bound when a store
// read needs it, so that what runs a request always has a deadline.
func (t *table) deadline(d, t0 time.Time) time.Time {
	if d.IsZero() && t.timeout > 0 {
		return t0.Add(t.timeout)
	}
	if t.maxTimeout > 0 && d.Sub(t0) > t.maxTimeout {
		return t0.Add(t.maxTimeout)
	}
	return d
}

// bound is ctx ending at deadline (zero: ctx's own, else the engine's
// request timeout from now), for a request's store reads: made only when
// the store is read, so that the hot path makes no context (nor reads the
// clock for a default it does not need).
func (t *table) bound(ctx context.Context, deadline time.Time) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); deadline.IsZero() && (ok || t.timeout <= 0) {
		return ctx, func() {}
	}
	return context.WithDeadline(ctx, t.deadline(deadline, time.Now()))
}

// maxFlights bounds the shared reads in progress on a node (distinct
// names): past it a lookup reads for itself, under its own deadline, so
// that requests with short deadlines for made-up names cannot leave more
// reads running than this beyond their requests.
const maxFlights = 256

// lookup reads name's record and adds the function to this node, unless a
// deploy or delete changed the node while the store was read (then it
// reads again: what it read may be stale). Concurrent lookups of one name
// share one read: a node cold under load, or a flood of requests for a
// name no function has, costs the store one read at a time per name, not
// one per request. The read runs apart from the request that started it,
// until the later of its deadline and the engine's request timeout (or
// Close): a request with a short deadline (or a flood of them) gets its 504
// but does not cut the read the others wait for, so the name still
// resolves. A request whose deadline is later than the read's reads again
// if the read ran out of time. The request waits until deadline or ctx's,
// whichever is earlier (neither: the engine's request timeout from now, so
// that prewarming waits no longer than a request would).
func (t *table) lookup(ctx context.Context, name string, deadline time.Time) (*function, error) {
	if !abi.ValidName(name) {
		return nil, notFound(name, nil, " (names match [a-z0-9][a-z0-9-]{0,62})")
	}
	ctx, cancel := t.bound(ctx, deadline)
	defer cancel()
	for {
		if ctx.Err() != nil { // no read for a request that cannot wait for it
			return nil, readCut(ctx, name)
		}
		t.mu.Lock()
		fl := t.flights[name]
		switch {
		case fl != nil:
			fl.waiters++
		case len(t.flights) >= maxFlights:
			t.mu.Unlock()
			return t.read(ctx, name)
		default:
			fl = &flight{done: make(chan struct{}), deadline: t.flightDeadline(ctx)}
			key := strings.Clone(name) // it outlives the request's bytes
			t.flights[key] = fl
			go t.fly(key, fl)
		}
		t.mu.Unlock()
		select {
		case <-fl.done:
		case <-ctx.Done():
			select {
			case <-fl.done: // answered as well: the answer, not the deadline
			default:
				return nil, readCut(ctx, name)
			}
		}
		if d, ok := ctx.Deadline(); ok && fl.cut && ctx.Err() == nil && d.After(fl.deadline) {
			continue // the read ran out of time before this request would have: read again
		}
		if p, ok := fl.err.(*errdefs.Panic); ok {
			panic(p) // the read's (fly), raised in the request's goroutine
		}
		return fl.f, fl.err
	}
}

// flightDeadline is when a read started for ctx's request ends: the later
// of its deadline and the engine's request timeout from now (zero: none).
func (t *table) flightDeadline(ctx context.Context) time.Time {
	d, _ := ctx.Deadline()
	if late := time.Now().Add(t.timeout); t.timeout > 0 && late.After(d) {
		d = late
	}
	return d
}

// fly makes a flight's read under the table's life (Close cancels it), not
// the request's: values and cancellation of the request are not its.
func (t *table) fly(name string, fl *flight) {
	rctx, cancel := t.life, context.CancelFunc(func() {})
	if !fl.deadline.IsZero() {
		rctx, cancel = context.WithDeadline(rctx, fl.deadline)
	}
	func() {
		// The read is no request's goroutine: a panic in it (a bug in a
		// store's, a load's or a device's Go code) ended the process, and
		// left the flight for every lookup of the name to wait on. Its
		// lookups raise it again in their own (lookup).
		defer func() {
			if p := errdefs.Recovered(recover()); p != nil {
				fl.f, fl.err = nil, p
			}
		}()
		fl.f, fl.err = t.read(rctx, name)
	}()
	fl.cut = fl.err != nil && errors.Is(rctx.Err(), context.DeadlineExceeded)
	cancel()
	t.mu.Lock()
	delete(t.flights, name)
	t.mu.Unlock()
	close(fl.done)
}

// flight is a store read of a name's record that lookups share.
type flight struct {
	done     chan struct{} // closed when f, err and cut are set
	deadline time.Time     // when the read gives up (zero: never)
	f        *function
	err      error
	cut      bool // the read ran out of time: a request with later deadline reads again
	waiters  int  // lookups that joined it after the first, gone or not (guarded by table.mu; for tests)
}

// read is lookup's store read, made by one of the lookups of a name.
func (t *table) read(ctx context.Context, name string) (*function, error) {
	return t.follow(ctx, name, false)
}

// follow reads name's record and makes this node run its current version,
// unless a change here overtook the read (then it reads again). With gone,
// a record the store no longer has drops the function here (nil, no
// error): a control call's view; a lookup's is a 404.
func (t *table) follow(ctx context.Context, name string, gone bool) (*function, error) {
	for attempt := 0; ; attempt++ {
		t.mu.Lock()
		at, closed := t.epoch, t.closed
		t.mu.Unlock()
		if closed {
			return nil, errorf(errdefs.KindUnavailable, nil, "the server is shutting down")
		}
		if attempt >= 3 {
			at = 0 // changes keep coming: take what is read
		}
		rec, err := t.record(ctx, name)
		if gone && errdefs.KindOf(err) == errdefs.KindNotFound {
			if _, ok := t.forget(name, at); ok {
				return nil, nil
			}
			continue
		}
		if err != nil {
			return nil, err
		}
		cv, err := rec.CurrentVersion()
		if err != nil {
			return nil, errorf(errdefs.KindInternal, err, "function %s: corrupt record", name)
		}
		if f, _ := t.switchTo(name, cv, rec, at, ""); f != nil {
			return f, nil
		}
	}
}

// land makes this node follow a control call's change of name's record:
// rv made current (nil: the record deleted). at is the epoch read before
// the call wrote the store: when nothing changed here since, no change
// written after this one has been applied, and this one is; else another
// call's change may have landed in the store before or after this one, and
// the node follows the record as the store has it now (if the store does
// not answer, this change: the latest known). So concurrent deploys,
// rollbacks and deletes leave the node as the last of them left the
// store, whatever order they come back in. rec is the record as the call
// wrote it (rv's), whose versions tell an earlier function of the name
// (deleted since, the record made anew) from this one (switchTo). It
// returns the function (nil: deleted); an error only when the server is
// shutting down.
func (t *table) land(ctx context.Context, name string, rv *api.Version, rec *api.Record, at uint64) (*function, error) {
	if rv == nil {
		if _, ok := t.forget(name, at); ok {
			return nil, nil
		}
	} else if f, _ := t.switchTo(name, *rv, rec, at, ""); f != nil {
		return f, nil
	}
	// The store is changed already: follow it even if the caller has gone.
	f, err := t.follow(context.WithoutCancel(ctx), name, true)
	if err == nil {
		return f, nil
	}
	// The store did not answer: this call's change is the latest known.
	if rv == nil {
		t.forget(name, 0)
		return nil, nil
	}
	if f, _ := t.switchTo(name, *rv, rec, 0, ""); f != nil {
		return f, nil
	}
	return nil, errorf(errdefs.KindUnavailable, nil, "the server is shutting down") // switchTo's only refusal at epoch 0
}

// switchTo makes rv the current version of name, adding the function if
// needed, and retires the previous version once its in-flight requests
// finish. rec, when given, is the record rv comes from: a function here
// whose current version it does not list is an earlier one (records keep
// every version until the function is deleted: the record was deleted and
// made anew), dropped in the same step (forget's), so that the new one
// starts with nothing of it (its counts, logs, flows). With at != 0 it does
// nothing unless the epoch is still at. tag is the store's tag of rec, as
// Refresh read it, recorded as applied with the switch ("": a change made
// here, after which no tag read before it is). It returns the function
// (nil if it did nothing) and whether the version changed.
func (t *table) switchTo(name string, rv api.Version, rec *api.Record, at uint64, tag string) (*function, bool) {
	f, olds, changed := t.switchLocked(name, rv, rec, at, tag)
	for _, v := range olds {
		v.pool.retire()
	}
	return f, changed
}

// switchLocked is switchTo's part under t.mu; it returns the versions to
// retire once t.mu is let go (the previous current one first).
func (t *table) switchLocked(name string, rv api.Version, rec *api.Record, at uint64, tag string) (*function, []*version, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed || (at != 0 && t.epoch != at) {
		return nil, nil, false
	}
	// The tag Refresh applied last is stale after a change made here: the
	// record may later return to those very bytes and tag. Refresh's own
	// is recorded in the same step, under the same lock: recorded after,
	// a change made here in between would leave it standing for a record
	// this node no longer runs, and a poll that met that tag again would
	// skip it for good.
	f := t.funcs[name]
	var dropped []*version
	if rec != nil && f != nil && f.cur != nil && !lists(rec, f.cur.rec.ID) {
		dropped, f = t.dropLocked(name), nil
	}
	if tag != "" {
		t.tags[name] = tag
	} else {
		delete(t.tags, name)
	}
	if f != nil && f.cur != nil && f.cur.rec.ID == rv.ID {
		// Nothing to switch, but a read of the store made before this
		// one's must not apply after it (land): the epoch moves on. Its
		// labels or copies may have changed (a deploy beside it, again).
		f.learn(rec)
		f.cur.fill(&rv)
		t.epoch++
		return f, nil, false
	}
	if f == nil {
		name = strings.Clone(name) // callers may pass borrowed bytes (the HTTP path)
		f = &function{name: name, out: t.followed.sink(t.logs, name, rec)}
		t.funcs[name] = f
	}
	f.learn(rec)
	old := f.cur
	if pv := f.pinned[rv.ID]; pv != nil {
		// A version pipelines pinned becomes current: its warm pool serves both.
		delete(f.pinned, rv.ID)
		pv.side.Store(false)
		f.cur = pv
	} else {
		f.cur = t.newVersion(f, rv)
	}
	if t.weighFlows != nil {
		// The new version may be loaded already (a pinned one), and a
		// placement of the old one's made nothing: no load to wait for.
		t.weighFlows(f.name, f.cur.rec)
	}
	for _, fg := range t.forgetters {
		fg.Met(f.name)
	}
	t.epoch++
	if old != nil {
		dropped = append([]*version{old}, dropped...)
	}
	return f, dropped, true
}

// kept runs mk under the table's lock if f is still its name's function
// (not dropped: deleted here or found deleted), then sets f's device flows
// to its current version's share and priority, whichever of its versions
// asks (a version pipelines pinned must not set the function's share to
// its own), and reports whether it did. What mk makes for the name is
// then dropped with f (forget drops it under the lock), never left to the
// name's next function by a request of this one still loading.
func (t *table) kept(f *function, mk func()) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.funcs[f.name] != f || f.cur == nil {
		return false
	}
	mk()
	if t.weighFlows != nil {
		t.weighFlows(f.name, f.cur.rec)
	}
	return true
}

// ioOwned runs charge under t.mu if fl is still the I/O flow of its name's
// function (Engine.ioOf makes it under t.mu too), with look reading a
// name's current version under the same lock, and reports whether it ran.
// A delete forgets the name's flows under t.mu, so what charge finds by
// name is fl's function's, never the name's next function's.
func (t *table) ioOwned(fl *ioshare.Flow, charge func(look func(string) *version)) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if f := t.funcs[fl.Name()]; f == nil || f.io.Load() != fl {
		return false
	}
	charge(t.curLocked)
	return true
}

// curLocked is name's current version here, nil for none; under t.mu.
func (t *table) curLocked(name string) *version {
	if g := t.funcs[name]; g != nil {
		return g.cur
	}
	return nil
}

// forget drops a function from this node (with at != 0, only if the epoch
// is still at); its version retires once its in-flight requests finish. It
// reports whether it did, and the epoch it left.
func (t *table) forget(name string, at uint64) (uint64, bool) {
	olds, now, ok := func() ([]*version, uint64, bool) {
		t.mu.Lock()
		defer t.mu.Unlock() // see mu: dropLocked calls out
		if at != 0 && t.epoch != at {
			return nil, 0, false
		}
		olds := t.dropLocked(name)
		t.epoch++
		return olds, t.epoch, true
	}()
	if !ok {
		return 0, false
	}
	for _, v := range olds {
		v.pool.retire()
	}
	return now, true
}

// dropLocked drops name's function from the table, its flows and its log
// sink, and returns its versions, to be retired once t.mu is let go.
// Called with t.mu held.
func (t *table) dropLocked(name string) []*version {
	delete(t.tags, name)
	f := t.funcs[name]
	delete(t.funcs, name)
	var olds []*version
	if f != nil {
		if f.cur != nil {
			olds = append(olds, f.cur)
		}
		for _, v := range f.pinned {
			olds = append(olds, v)
		}
		f.cur, f.pinned = nil, nil
	}
	// Under t.mu: a redeploy's program load (place) asks for the flow
	// after the function is back in funcs, so it gets a new flow, never
	// the one dropped here. Its runs in flight end normally.
	if t.forgetFlow != nil {
		t.forgetFlow(name)
	}
	// Under t.mu too: a redeploy's function gets its sink after this, in
	// the name's next life, never in the one that ends here (whose lines,
	// from workers still finishing requests, are dropped from now on).
	t.followed.forget(t.logs, name)
	if f != nil {
		// Under t.mu too: the name's next function is met after this.
		for _, fg := range t.forgetters {
			fg.Forget(f.name)
		}
	}
	return olds
}

// peek is name's function and current version as this node has them,
// reading no store (nil: none).
func (t *table) peek(name string) (*function, *version) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if f := t.funcs[name]; f != nil {
		return f, f.cur
	}
	return nil, nil
}

func (t *table) newVersion(f *function, rv api.Version) *version {
	v := &version{fn: f, rec: rv, lg: t.log, loadState: loadState{loadTok: make(chan struct{}, 1)}}
	v.fill(&rv)
	v.pool.v, v.pool.owner = v, v
	return v
}

type funcVersion struct {
	f *function
	v *version
}

// current is every function's current version (one per function: what
// per-function metrics report).
func (t *table) current() []funcVersion { return t.versions(false) }

// versions is every function's current version and, with pinned, the
// versions pipeline steps pinned (what reaping and eviction go through).
func (t *table) versions(pinned bool) []funcVersion {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]funcVersion, 0, len(t.funcs))
	for _, f := range t.funcs {
		if f.cur != nil {
			out = append(out, funcVersion{f, f.cur})
		}
		if pinned {
			for _, v := range f.pinned {
				out = append(out, funcVersion{f, v})
			}
		}
	}
	return out
}

// record reads name's record from the store: 404 for a function that has
// none, 503 naming the store's trouble otherwise, 504 past ctx's deadline
// (none: the engine's request timeout, so that a store that hangs answers
// control calls too in bounded time).
func (t *table) record(ctx context.Context, name string) (*api.Record, error) {
	ctx, cancel := t.bound(ctx, time.Time{})
	defer cancel()
	rec, err := t.reg.Get(ctx, name)
	if errors.Is(err, registry.ErrNoFunction) {
		return nil, notFound(name, err, "")
	}
	if err != nil && ctx.Err() != nil {
		return nil, readCut(ctx, name)
	}
	if err != nil {
		return nil, unavailable(err, "function %s: store unavailable", name)
	}
	return rec, nil
}

// readCut is the error of a request whose context ended while name's record
// was read (by it or by another request it waited for): the deadline's 504,
// not the store's fault; or a cancellation, which over HTTP is the server
// shutting down (its request contexts end then), not the client: 503.
func readCut(ctx context.Context, name string) error {
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return errorf(errdefs.KindTimeout, nil, "function %s: the request's deadline passed while its record was read from the store", name)
	}
	return errorf(errdefs.KindUnavailable, ctx.Err(), "function %s: the request was cancelled while its record was read from the store (the server is shutting down, or the client went away)", name)
}

// close drops every function and retires their versions (in-flight
// requests finish first); later lookups and deploys are refused, and the
// shared reads in progress end.
func (t *table) close() {
	t.mu.Lock()
	t.closed = true
	var olds []*version
	for _, f := range t.funcs {
		if f.cur != nil {
			olds = append(olds, f.cur)
			f.cur = nil
		}
		for _, v := range f.pinned {
			olds = append(olds, v)
		}
		f.pinned = nil
	}
	t.funcs = map[string]*function{}
	t.mu.Unlock()
	t.stop()
	for _, v := range olds {
		v.pool.retire()
	}
}

// function is name's function as this node has it, reading no store (nil:
// none).
func (t *table) function(name string) *function {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.funcs[name]
}

// currentOf is f's current version (nil: none, f was dropped).
func (t *table) currentOf(f *function) *version {
	t.mu.Lock()
	defer t.mu.Unlock()
	return f.cur
}

// names is the names of the functions this node has.
func (t *table) names() []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]string, 0, len(t.funcs))
	for n := range t.funcs {
		out = append(out, n)
	}
	return out
}

// at is the table's epoch now: a change made from a store read started
// after it applies only if the epoch is still at (switchTo, forget).
func (t *table) at() uint64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.epoch
}

// appliedTag is the tag of the record Refresh last applied for name.
func (t *table) appliedTag(name string) string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.tags[name]
}
