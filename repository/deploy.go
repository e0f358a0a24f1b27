package repository

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime/debug"
	"slices"
	"strconv"
	"sync"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/api"
	"github.com/plover-run/plover/errdefs"
	"github.com/plover-run/plover/pipedef"
)

// One model's deploy cycle: its version folders read, each version the
// node's record lacks deployed, the current one chosen, the ones gone retired.

// deployAll deploys the models, Deploys at a time, those whose current
// version is a function first and then pipelines (a pipeline's deploy
// checks that its steps are there).
func (r *Repository) deployAll(ctx context.Context, due []*model) {
	type job struct {
		m    *model
		vers []version
		err  error
	}
	jobs := make([]job, len(due))
	pipe := make([]bool, len(due))
	// Reading the folders is part of each model's work, Deploys at a
	// time: one slow folder (a volume stalling) holds up no other's look.
	r.parallel(len(due), func(i int) {
		vers, p, err := r.versionsOf(due[i])
		jobs[i], pipe[i] = job{due[i], vers, err}, p
	})
	var pipes, funcs []int
	for i := range due {
		if pipe[i] {
			pipes = append(pipes, i)
		} else {
			funcs = append(funcs, i)
		}
	}
	for _, group := range [][]int{funcs, pipes} {
		r.parallel(len(group), func(k int) {
			j := &jobs[group[k]]
			r.guard(j.m, func() { r.deploy(ctx, j.m, j.vers, j.err, false) })
		})
	}
}

// guard runs step, m's deploy, so that a panic in it makes m UNAVAILABLE
// until its folder changes, logged with its stack, rather than end the
// server: a scan deploys on a goroutine of its own, which no transport
// recovers, from files that whoever writes the volume chose (a tampered
// library once panicked debug/elf). A load (the API) is recovered by its
// transport.
func (r *Repository) guard(m *model, step func()) {
	defer func() {
		p := recover()
		if p == nil {
			return
		}
		r.cfg.Log.Error("model repository: a model's deploy panicked", "model", m.name, "panic", fmt.Sprint(p), "stack", string(debug.Stack()))
		r.mu.Lock()
		print, old := m.seen, m.versions
		r.mu.Unlock()
		r.settle(m, print, old, Unavailable, fmt.Sprintf("%s: the server failed while deploying it (an internal error, in its log): tried again when the folder changes", r.where(m.dir)), errdefs.KindInternal)
	}()
	step()
}

// parallel runs f(0) to f(n-1), Deploys at a time, and waits for them.
func (r *Repository) parallel(n int, f func(int)) {
	sem := make(chan struct{}, r.cfg.Deploys)
	var wg sync.WaitGroup
	for i := range n {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			f(i)
		}()
	}
	wg.Wait()
}

// versionsOf lists m's version folders (its folder alone when it is a
// bundle, as version 1) and whether its highest is a pipeline.
func (r *Repository) versionsOf(m *model) ([]version, bool, error) {
	_, err := os.Stat(filepath.Join(m.dir, abi.ManifestFile))
	if err == nil {
		return []version{{label: "1", dir: resolved(m.dir), where: r.where(m.dir)}}, isPipeline(m.dir), nil
	}
	if !errors.Is(err, fs.ErrNotExist) {
		// EACCES, EIO, ESTALE a moment: taken for absent, the model
		// would have no bundle and its function would be deleted.
		return nil, false, fmt.Errorf("%s: %w", r.where(m.dir), err)
	}
	ents, err := os.ReadDir(m.dir)
	if err != nil {
		// Read a moment ago by the look that decided the deploy: this is
		// no refusal (deploy tries again).
		return nil, false, fmt.Errorf("%s: %w", r.where(m.dir), err)
	}
	var vs []version
	for _, e := range ents {
		if !isVersion(e.Name()) {
			continue
		}
		if ok, err := isDir(m.dir, e); err != nil {
			// A linked version folder that cannot be read now: skipped,
			// the model might have no bundle and lose its function.
			return nil, false, fmt.Errorf("%s: %w", r.where(filepath.Join(m.dir, e.Name())), err)
		} else if ok {
			dir := filepath.Join(m.dir, e.Name())
			vs = append(vs, version{label: e.Name(), dir: resolved(dir), where: r.where(dir)})
		}
	}
	if len(vs) == 0 {
		return nil, false, refused(r.where(m.dir), errNoBundle)
	}
	slices.SortFunc(vs, func(a, b version) int { return byNumber(a.label, b.label) })
	return vs, isPipeline(vs[len(vs)-1].dir), nil
}

// byNumber orders version labels as numbers ("" first).
func byNumber(a, b string) int {
	x, _ := strconv.ParseUint(a, 10, 63)
	y, _ := strconv.ParseUint(b, 10, 63)
	return cmp.Compare(x, y)
}

// deploy brings the node in line with m's versions: each one the node's
// record lacks (by label and sha256) is deployed, the highest as current
// and the others beside it; a broken one is UNAVAILABLE with its reason
// and the others still deploy (the highest that did is made current,
// unless the highest failed for a reason that may pass or that is this
// node's alone: then the record's current version stays). Unless apply
// (a load), a version deployed otherwise after the highest folder's, which
// the record already had, stays current (deployedSince).
func (r *Repository) deploy(ctx context.Context, m *model, vers []version, err error, apply bool) {
	r.mu.Lock()
	print := m.seen
	r.mu.Unlock()
	if errors.Is(err, errNoBundle) {
		r.noBundle(ctx, m, print, err)
		return
	}
	if errdefs.KindOf(err) == errdefs.KindInvalid {
		r.settle(m, print, nil, Unavailable, err.Error(), errdefs.KindInvalid)
		return
	}
	if err != nil {
		// A folder read a moment ago that cannot be now (it went, a
		// volume's hiccup): what served serves on, and the next scan
		// looks again.
		r.mu.Lock()
		old := m.versions
		r.mu.Unlock()
		reason := unreadableAt(r.where(m.dir), m.dir, err) + ": tried again at the next scan"
		r.cfg.Log.Warn("model repository: a model's folder cannot be read now", "model", m.name, "reason", reason, "folder", m.dir, "error", err)
		r.settle(m, "", old, Loading, reason, errdefs.KindUnavailable)
		return
	}
	rec, err := r.node.Versions(ctx, m.name)
	before := rec // as the folder's deploys found it
	if err != nil && errdefs.KindOf(err) != errdefs.KindNotFound {
		// The store, not the folder: the next scan tries again ("") and
		// what served serves on, and shows so.
		r.mu.Lock()
		old := m.versions
		r.mu.Unlock()
		r.settle(m, "", old, Unavailable, fmt.Sprintf("%s: reading its record: %v", r.where(m.dir), err), errdefs.KindOf(err))
		return
	}
	current, label := "", ""
	retry := false
	// keep: the highest version failed for a reason that may pass, or
	// this node's own (its bytes still what its label names, which another
	// node sharing the store may serve): the record's current version
	// stays, rather than a lower one made current for every node.
	keep := false
	// The folders whose number still names a deployed version: not one
	// whose content is now other than its number names (a manifest naming
	// another function, bytes the node refuses), whose earlier bytes
	// would answer by its number while the index says UNAVAILABLE.
	var named []version
	r.forgetPacks(m, vers)
	for i := range vers {
		v := &vers[i]
		// Only the highest becomes current: a lower folder added later
		// goes beside it.
		var other bool
		v.id, other, err = r.deployVersion(ctx, m, v, rec, i < len(vers)-1, print)
		if errors.Is(err, errChanged) {
			r.unsettled(m)
			return
		}
		if err != nil {
			// The store down, a conflict, a pipeline's step not there
			// yet: the next scan tries again. A bundle the node refuses
			// waits for its folder to change.
			retry = retry || passing(err)
			if passing(err) || !other || breaksUsers(err) {
				named = append(named, *v)
				keep = keep || i == len(vers)-1
			}
			v.state, v.reason, v.kind = Unavailable, brief(err.Error()), errdefs.KindOf(err)
			r.cfg.Log.Warn("model repository: a version is unavailable", "model", m.name, "version", v.label, "reason", v.reason)
			continue
		}
		v.state, current, label = Ready, v.id, v.label
		named = append(named, *v)
	}
	if current != "" {
		ok, again := r.makeCurrent(ctx, m, vers, named, before, current, label, keep, apply)
		if !ok {
			return
		}
		retry = retry || again
	}
	if retry {
		print = ""
	}
	r.settle(m, print, vers, "", "", 0)
}

// makeCurrent makes current, the version id of the folder's highest (its
// label label), the record's current one, unless keep or a hot-fix deployed
// since (before: the record as the folder's deploys found it) keeps another, and
// retires the versions whose folders went (named are those that stay). ok
// is false where it settled m unavailable; retry, where the next scan must
// look again.
func (r *Repository) makeCurrent(ctx context.Context, m *model, vers, named []version, before *api.Record, current, label string, keep, apply bool) (ok, retry bool) {
	rec, err := r.node.Versions(ctx, m.name)
	if err == nil && rec.Current != current && !keep && !apply && deployedSince(before, rec, current) {
		// The folder's highest version is one the record had: nothing
		// in the folder is newer than what an operator deployed since
		// (a hot-fix), which a restart rolled back while the running
		// server, seeing the folder unchanged, had kept it.
		keep = true
		r.cfg.Log.Warn("model repository: the folder's version is not made current: a version deployed since (plover deploy) is, and stays so until the folder changes or a load applies it",
			"model", m.name, "version", label, "current", rec.Current)
	}
	if err == nil && rec.Current != current && !keep {
		_, err = r.node.Rollback(ctx, m.name, current)
	}
	if err != nil {
		r.settle(m, "", vers, Unavailable, fmt.Sprintf("%s: making version %s current: %v", r.where(m.dir), label, err), errdefs.KindOf(err))
		return false, false
	}
	if !keep {
		rec.Current = current // as the rollback just set it
	}
	if err := r.retire(ctx, m.name, rec, named); err != nil {
		retry = true // the store again: the next scan tries again
		r.cfg.Log.Warn("model repository: a removed version folder still answers", "model", m.name, "error", err)
	}
	return true, retry
}

// deployedSince reports whether rec's current version was deployed by
// other means than a model repository (no label: plover deploy) after
// current, the folder's highest version, which before (the record as the
// folder's deploys found it) already had: the folder brings nothing newer
// than it. The record's order is its deploys': one listed before current
// was current before the folder's (a function plover deploy made, which
// the folder replaced, or which it did not replace yet for a rollback
// that failed), and the folder's is made current.
func deployedSince(before, rec *api.Record, current string) bool {
	if before == nil || !slices.ContainsFunc(before.Versions, func(v api.Version) bool { return v.ID == current }) {
		return false // deployed now: the folder changed
	}
	at := slices.IndexFunc(rec.Versions, func(v api.Version) bool { return v.ID == current })
	now := slices.IndexFunc(rec.Versions, func(v api.Version) bool { return v.ID == rec.Current })
	return at >= 0 && now > at && rec.Versions[now].Label == ""
}

// retire takes off rec's versions the labels of version folders that
// went or are refused (none of vers): /v2/models/NAME/versions/N stops
// answering for a folder N removed. rec was read after the current
// version was set.
func (r *Repository) retire(ctx context.Context, name string, rec *api.Record, vers []version) error {
	if rec == nil {
		return nil
	}
	seen := map[string]bool{}
	for _, v := range rec.Versions {
		if v.Label == "" || v.ID == rec.Current || seen[v.Label] || slices.ContainsFunc(vers, func(f version) bool { return f.label == v.Label }) {
			continue
		}
		seen[v.Label] = true
		if err := r.node.Unlabel(ctx, name, v.Label); err != nil {
			return fmt.Errorf("version %s: %w", v.Label, err)
		}
	}
	return nil
}

// passing reports whether a version's deploy failed for a reason that may
// pass without its folder changing: anything but a bundle the node refuses
// as it is (invalid, malformed, too large, a step the deployer may not
// run, a pipeline that would break the pipelines running it), or a
// pipeline whose step is not deployed yet.
func passing(err error) bool {
	var nf *errdefs.NoFunction
	if errors.As(err, &nf) {
		return true
	}
	if breaksUsers(err) {
		return false
	}
	switch errdefs.KindOf(err) {
	case errdefs.KindInvalid, errdefs.KindBadRequest, errdefs.KindTooLarge, errdefs.KindForbidden:
		return false
	}
	return true
}

// breaksUsers reports whether a version was refused for the pipelines
// running its function (pipedef.UsersError): it waits for its folder to
// change or a load, as a refused bundle does, but what its label named
// before serves on and stays current, since those pipelines run it.
func breaksUsers(err error) bool {
	var ue *pipedef.UsersError
	return errors.As(err, &ue)
}

// refused is a version folder the repository refuses as it is (its
// manifest, its files): it waits for the folder to change.
func refused(where string, err error) error {
	return errdefs.New(errdefs.KindInvalid, err, "%s: %v", where, err)
}

// errChanged is a model folder that changed between the scan that decided
// to deploy it and the packing of a version.
var errChanged = errors.New("the folder changed while it was packed")

// stillAs reports whether m's folder is still as print, the look that
// decided its deploy.
func stillAs(m *model, print string) bool {
	now := look(m.dir, m.renamed)
	return now.print == print && now.err == nil
}
