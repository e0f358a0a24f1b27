package repository

// The repository API's side (the Open Inference Protocol's model
// repository extension): the index, load and unload.

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/plover-run/plover/api"
	"github.com/plover-run/plover/errdefs"
)

// Index is the repository's models, by name: one entry per version
// folder (its label as the version), and one without a version for the
// whole folder while it settles, when it has no versions to show
// (unreadable, unloaded), or when its last deploy failed beside the
// versions that still serve (the store down); with ready, only READY ones.
func (r *Repository) Index(ctx context.Context, ready bool) []api.RepositoryModel {
	l := r.noticeDeleted(ctx, true)
	if r.backInListing(l) {
		// Only Run's scan re-adopts: it checks the folder is still there
		// and its record, and settles or retries as after any scan.
		r.kick()
	}
	r.mu.Lock()
	var listed map[string]bool
	if l != nil && l.at == r.epoch {
		// A deploy settled since the listing began may have made a step
		// it missed: then no step is judged by it.
		listed = l.names
	}
	out := make([]api.RepositoryModel, 0, len(r.models))
	type at struct {
		i int // in out
		v version
	}
	var deployed []at // the READY versions
	for _, m := range r.models {
		if len(m.versions) == 0 || m.unloaded || m.state != "" {
			out = append(out, api.RepositoryModel{Name: m.name, State: m.state, Reason: m.reason})
			if len(m.versions) == 0 || m.unloaded {
				continue
			}
		}
		for _, v := range m.versions {
			if v.state == Ready {
				deployed = append(deployed, at{len(out), v})
			}
			out = append(out, api.RepositoryModel{Name: m.name, Version: v.label, State: v.state, Reason: v.reason})
		}
	}
	r.mu.Unlock()
	// Deployed is not READY when the node cannot run it: READY said so
	// of a version whose library the node refused, while its ready said
	// 503 and its requests failed.
	for _, d := range deployed {
		e := &out[d.i]
		if reason, _ := r.unready(e.Name, d.v); reason != "" {
			e.State, e.Reason = Unavailable, reason
		} else if i := slices.IndexFunc(d.v.steps, func(s string) bool { return listed != nil && !listed[s] }); i >= 0 {
			// The node knows only the steps it has loaded: the listing
			// knows the others were deleted (plover rm --force).
			e.State, e.Reason = Unavailable, fmt.Sprintf("%s: deployed, but its step %s was deleted since (plover rm --force): its requests fail", d.v.where, d.v.steps[i])
		}
	}
	if ready {
		out = slices.DeleteFunc(out, func(e api.RepositoryModel) bool { return e.State != Ready })
	}
	slices.SortFunc(out, func(a, b api.RepositoryModel) int {
		if a.Name != b.Name {
			if a.Name < b.Name {
				return -1
			}
			return 1
		}
		return byNumber(a.Version, b.Version)
	})
	return out
}

// Load deploys name's folder now, as it is (an unload ends): its versions
// the node lacks are deployed and the highest made current. An unknown
// name is 404; a folder that does not deploy is 400 with the reason.
func (r *Repository) Load(ctx context.Context, name string) error {
	if !r.take(ctx) {
		return shuttingDown("load", name)
	}
	held := true // settledNow gives the turn up while it waits
	defer func() {
		if held {
			r.give()
		}
	}()
	// Its folder alone: the index and the scans look at the others.
	f, ok, err := r.listOne(name)
	if err != nil {
		// The server's path in the log only (the cause), DIR's name in
		// the answer.
		return errdefs.New(errdefs.KindUnavailable, err, "load %s: cannot read the model repository: %s", name, r.quiet(err))
	}
	if !ok {
		return errdefs.New(errdefs.KindNotFound, nil, "model %s is not in the model repository %s", errdefs.QuoteName(name), r.top)
	}
	if f, held, err = r.settledNow(ctx, name, f); err != nil {
		return err
	}
	defer r.saveKept()
	r.mu.Lock()
	m := r.modelLocked(name, f)
	m.unloaded, m.seen, m.seenAt, m.done, m.deploying = false, f.print, time.Now(), "", true
	if f.unreadable {
		r.unreadableLocked(m, f)
		reason := m.reason
		r.mu.Unlock()
		r.warnUnreadable(name, reason, f)
		// The node's failure, as a file of the folder that cannot be read
		// is (503); the error with its path is the cause, for the log.
		return errdefs.New(errdefs.KindUnavailable, f.err, "load %s: %s", name, reason)
	}
	r.mu.Unlock()
	vers, _, err := r.versionsOf(m)
	// A load applies the folder: its highest version becomes current
	// even over a plover deploy since (which a scan leaves current).
	// Under guard as a scan's: a panic (a library that breaks a check)
	// leaves m UNAVAILABLE, not LOADING for good.
	r.guard(m, func() { r.deploy(ctx, m, vers, err, true) })
	r.mu.Lock()
	if m.retry || m.state == Loading {
		// Run's scans try it again (without Poll they wait for this),
		// as the index says they will.
		r.kick()
	}
	if m.state == Loading {
		defer r.mu.Unlock()
		return errdefs.Unavailable(nil, "load %s: %s", name, m.reason)
	}
	if reason, kind := m.failure(); reason != "" {
		r.mu.Unlock()
		// The failure's class: a bundle the node or the repository
		// refuses is 400 (as Triton answers), the store down 503, a
		// conflict 409, ...
		if kind == errdefs.KindInvalid {
			kind = errdefs.KindBadRequest
		}
		return errdefs.New(kind, nil, "load %s: %s", name, reason)
	}
	var current *version
	if n := len(m.versions); n > 0 {
		v := m.versions[n-1]
		current = &v
	}
	r.mu.Unlock()
	// Asked of the engine without r.mu: it walks the steps of a pipeline,
	// and the index waits on r.mu.
	if current != nil {
		if reason, kind := r.unready(name, *current); reason != "" {
			return errdefs.New(kind, nil, "load %s: %s", name, reason)
		}
	}
	return nil
}

// settling is called as a load gives the turn up to wait for name's
// folder to settle; tests learn so.
var settling = func(name string) {}

// settleEnded is a load's error for ctx ended while its folder settled.
// shuttingDown is a load's or an unload's refusal once Run's context
// ended (or its own ended before it had the turn).
func shuttingDown(what, name string) error {
	return errdefs.Unavailable(nil, "%s %s: the server is shutting down", what, name)
}

func settleEnded(ctx context.Context, name string, settle time.Duration) error {
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return errdefs.New(errdefs.KindTimeout, ctx.Err(), "load %s: the deadline passed while its folder settled (files changed within the last %s)", name, settle)
	}
	return errdefs.New(errdefs.KindGone, ctx.Err(), "load %s: gone while its folder settled", name)
}

// settledNow is name's folder f once its files have been still for the
// settle time, as a scan deploys it: a load right after a copy waits for
// it to settle (within twice the settle time and ctx) rather than deploy
// what is there so far under the folder's label. 503 while it changes.
// Called with the turn, which it gives up while it waits, so that scans
// and other loads go on meanwhile; held says whether it has the turn on
// return (always, unless err).
func (r *Repository) settledNow(ctx context.Context, name string, f folder) (_ folder, held bool, err error) {
	giveUp := time.Now().Add(2 * r.cfg.Settle)
	seenAt := time.Now()
	for !f.unreadable && !f.standIn {
		wait := r.cfg.Settle - time.Since(f.stillSince(seenAt))
		if f.err != nil {
			wait = max(wait, r.cfg.Settle/4) // a file going while it was read
		}
		if wait <= 0 {
			break
		}
		if time.Now().Add(wait).After(giveUp) {
			why := "its files changed within the last " + r.cfg.Settle.String()
			if f.err != nil {
				why = "cannot read it yet: " + f.why
			}
			return f, true, errdefs.Unavailable(nil, "load %s: %s: still being copied; load it again once the copy ends", name, why)
		}
		r.give()
		settling(name)
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return f, false, settleEnded(ctx, name, r.cfg.Settle)
		case <-r.ended:
			t.Stop()
			return f, false, shuttingDown("load", name)
		case <-t.C:
		}
		if !r.take(ctx) {
			if r.stopping() {
				return f, false, shuttingDown("load", name)
			}
			return f, false, settleEnded(ctx, name, r.cfg.Settle)
		}
		if ctx.Err() != nil { // take may pick the free turn over an ended ctx
			return f, true, settleEnded(ctx, name, r.cfg.Settle)
		}
		g, ok, err := r.listOne(name)
		switch {
		case err != nil:
			return f, true, errdefs.New(errdefs.KindUnavailable, err, "load %s: cannot read the model repository: %s", name, r.quiet(err))
		case !ok:
			return f, true, errdefs.New(errdefs.KindNotFound, nil, "model %s is not in the model repository %s", errdefs.QuoteName(name), r.top)
		case g.print != f.print || g.err != nil:
			seenAt = time.Now()
		}
		f = g
	}
	return f, true, nil
}

// unready is why the node cannot run v, a deployed version of name, and
// its class (a library refused is the bundle's: 400), or "".
func (r *Repository) unready(name string, v version) (string, errdefs.Kind) {
	err := r.node.Unready(name, v.id)
	if err == nil {
		return "", 0
	}
	kind := errdefs.KindOf(err)
	if kind == errdefs.KindInvalid {
		kind = errdefs.KindBadRequest
	}
	return brief(fmt.Sprintf("%s: deployed, but this node cannot run it: %v", v.where, err)), kind
}

// failure is why m is not ready ("" when its current version is) and its
// class; under r.mu.
func (m *model) failure() (string, errdefs.Kind) {
	if m.state == Unavailable || len(m.versions) == 0 {
		return m.reason, m.kind
	}
	if last := m.versions[len(m.versions)-1]; last.state != Ready {
		return last.reason, last.kind
	}
	return "", 0
}

// Unload stops serving name until a load (or, while polling, until its
// folder changes): its function is deleted from the node (requests in
// flight finish) and the repository remembers it is unloaded. A function
// a pipeline runs is refused (409), as plover rm refuses it; one whose
// record cannot be read, 503.
func (r *Repository) Unload(ctx context.Context, name string) error {
	if !r.take(ctx) {
		return shuttingDown("unload", name)
	}
	defer r.give()
	r.mu.Lock()
	m := r.models[name]
	r.mu.Unlock()
	if m == nil {
		return errdefs.New(errdefs.KindNotFound, nil, "model %s is not in the model repository %s", errdefs.QuoteName(name), r.top)
	}
	// A function of that name the repository never deployed (its folder
	// refused, a plover deploy), or whose current version a plover deploy
	// replaced since, is left alone, as the scan's removal leaves it. Its
	// record says what this server's memory may not: a current version
	// with a version folder's label is the repository's (an earlier
	// run's too, whose first deploy since has failed).
	ours, err := r.labelledErr(ctx, name)
	if err != nil {
		// Taken for not ours, the unload would answer 200 and delete
		// nothing, and a scan once the store is back would take the
		// function back.
		return errdefs.New(errdefs.KindOf(err), err, "unload %s: whether its function is the repository's could not be read: %v", name, err)
	}
	if ours {
		if _, err := r.deleteOurs(ctx, name); err != nil {
			return fmt.Errorf("unload %s: %w", name, err)
		}
	}
	r.mu.Lock()
	r.unloadedLocked(m, "unloaded")
	r.mu.Unlock()
	r.saveKept()
	r.cfg.Log.Info("model repository: unloaded", "model", name)
	return nil
}

// unloadedLocked marks m unloaded, its function gone, for reason. Its
// versions went with the function: none shows READY until a load or a
// change of the folder deploys them again. The folder as last seen is
// what is unloaded, a copy still settling included: only a change after
// the unload (or a load) brings it back.
func (r *Repository) unloadedLocked(m *model, reason string) {
	m.unloaded, m.deployed, m.state, m.reason, m.versions, m.retry = true, false, Unavailable, reason, nil, false
	m.done, m.lookAt, m.lookWait, m.changing = m.seen, time.Time{}, 0, false
	m.removing = false // its function is gone: no delete left to try
	m.markSettled()
}

// deletedReason is the index's reason for a model whose function was
// deleted by other means than this repository's: a listing of the store
// tells plover rm from another node's unload in nothing.
const deletedReason = "deleted (plover rm, or unloaded on another node): a load deploys it again"

// listing is the store's functions as a listing found them.
type listing struct {
	names map[string]bool
	at    uint64 // Repository.epoch as it began
}

// listWait bounds the store listing an index answer waits for.
const listWait = 2 * time.Second

// noticeDeleted marks unloaded the models the repository deployed and
// serves whose function the store no longer has (plover rm, here or on
// another node sharing the store): the index said READY while requests
// answered 404, and they stay deleted through polls as an unload does,
// rather than deployed again behind the operator's back. One listing of
// the store; none while no model serves or is unloaded; a store that
// does not answer changes nothing. With share (the index's), one listing
// at a time, shared by those who ask meanwhile; a scan's is its own,
// taken after its look at the folders. It returns the listing (nil: none).
func (r *Repository) noticeDeleted(ctx context.Context, share bool) *listing {
	r.mu.Lock()
	serving := false
	for _, m := range r.models {
		serving = serving || m.serving() || m.unloaded
	}
	if !serving {
		r.mu.Unlock()
		return nil
	}
	if !share {
		at := r.epoch
		r.mu.Unlock()
		l, _ := r.listDeleted(ctx, at) // the scan saves the state file at its end
		return l
	}
	f := r.flight
	if f != nil {
		f.sharing++
	} else {
		f = &flight{done: make(chan struct{})}
		r.flight = f
		at := r.epoch
		// Run, returning, waits for its write: a deletion an index saw
		// is kept for the restart. Added under mu, before Run's Wait.
		tracked := !r.stopped
		if tracked {
			r.writes.Add(1)
		}
		// Not under the first asker's context: its client leaving would
		// leave every index sharing the listing without one.
		go r.listShared(context.WithoutCancel(ctx), f, at, tracked)
	}
	r.mu.Unlock()
	select {
	case <-f.done:
		return f.l
	case <-ctx.Done():
		return nil
	}
}

// listShared takes the listing f shares, and then saves the state file
// if it marked a model: those waiting for the listing do not wait for
// the write's fsyncs.
func (r *Repository) listShared(ctx context.Context, f *flight, at uint64, tracked bool) {
	if tracked {
		defer r.writes.Done()
	}
	l, marked := r.listDeleted(ctx, at)
	r.mu.Lock()
	r.flight, f.l = nil, l
	r.mu.Unlock()
	close(f.done)
	if marked {
		r.saveKept()
	}
}

// flight is a listing of the store on its way, which those who ask for
// one meanwhile wait for.
type flight struct {
	done    chan struct{}
	l       *listing // once done
	sharing int      // how many wait for it besides the one listing
}

// listDeleted is noticeDeleted's listing, taken at epoch at, and its
// marks; marked: it marked a model unloaded, for the state file.
func (r *Repository) listDeleted(ctx context.Context, at uint64) (l *listing, marked bool) {
	ctx, cancel := context.WithTimeout(ctx, listWait)
	defer cancel()
	names, err := r.node.Listed(ctx)
	if err != nil {
		r.cfg.Log.Debug("model repository: cannot list the functions to see which were deleted", "error", err)
		return nil, false
	}
	// One settled after the listing began may have a record it missed,
	// and one deploying may be absent only until it settles.
	gone := func(m *model) bool { return m.serving() && !m.deploying && m.epoch <= at && !names[m.name] }
	r.mu.Lock()
	var missing []*model
	for _, m := range r.models {
		if gone(m) {
			missing = append(missing, m)
		}
	}
	r.mu.Unlock()
	for _, m := range missing {
		// A listing may come back partial (a page lost) or empty: its
		// record's absence confirms each.
		if _, err := r.node.Versions(ctx, m.name); errdefs.KindOf(err) != errdefs.KindNotFound {
			continue
		}
		r.mu.Lock()
		now := gone(m)
		if now {
			r.unloadedLocked(m, deletedReason)
			marked = true
		}
		r.mu.Unlock()
		if now {
			r.cfg.Log.Info("model repository: its function was deleted (plover rm, or an unload on another node): unloaded until a load", "model", m.name)
		}
	}
	return &listing{names, at}, marked
}

// backElsewhere ends the unload of the models found (a scan's look at
// the folders) whose function is back in l, deployed by a model
// repository (its current version labelled: a load on another node
// sharing the store, after an unload here, there or a plover rm): the
// scan deploys them again, which adopts the versions the store has. A
// function deployed otherwise is left alone. Called with the turn.
func (r *Repository) backElsewhere(ctx context.Context, l *listing, found map[string]folder) {
	if l == nil {
		return
	}
	r.mu.Lock()
	var back []string
	for name, m := range r.models {
		if _, ok := found[name]; ok && m.unloaded && l.names[name] {
			back = append(back, name)
		}
	}
	r.mu.Unlock()
	ctx, cancel := context.WithTimeout(ctx, listWait)
	defer cancel()
	for _, name := range back {
		// Not labelledErr: a record not found (deleted since the listing:
		// an unload then a load elsewhere, Triton's reload) is not back,
		// and no function deployed otherwise to leave alone for a while.
		var ours, other bool
		rec, err := r.node.Versions(ctx, name)
		if err == nil {
			var v api.Version
			if v, err = rec.CurrentVersion(); err == nil {
				ours, other = v.Label != "", v.Label == ""
			}
		}
		failed := err != nil && errdefs.KindOf(err) != errdefs.KindNotFound
		r.mu.Lock()
		m := r.models[name]
		loaded := m != nil && m.unloaded && ours
		if m != nil && m.unloaded {
			switch {
			case other:
				m.lookAt = time.Now().Add(maxRetry)
			case failed:
				// Else every index, still listing it, would have a scan
				// read it again at once.
				m.lookWait = min(max(2*m.lookWait, r.cfg.Settle), max(maxRetry, r.cfg.Settle))
				m.lookAt = time.Now().Add(m.lookWait)
			case ours:
				m.unloaded, m.done, m.lookWait, m.changing = false, "", 0, false
				m.state, m.reason = Loading, "deployed again by a model repository (a load on another node): loading it"
			}
		}
		r.mu.Unlock()
		if loaded {
			r.cfg.Log.Info("model repository: its function was deployed again elsewhere: loaded", "model", name)
		}
	}
}

// backInListing reports whether l lists the function of an unloaded
// model, which may be back (a load on another node): a scan is to look.
// One whose record a scan found another's (a plover deploy), or could not
// read, is looked at again only at its lookAt: every index would have a
// scan read it.
func (r *Repository) backInListing(l *listing) bool {
	if l == nil {
		return false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	now := time.Now()
	for name, m := range r.models {
		if m.unloaded && l.names[name] && !now.Before(m.lookAt) {
			return true
		}
	}
	return false
}

// serving reports whether m has a version READY that the repository
// deployed; under r.mu.
func (m *model) serving() bool {
	return m.deployed && !m.unloaded && !m.removing && slices.ContainsFunc(m.versions, func(v version) bool { return v.state == Ready })
}
