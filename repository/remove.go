package repository

import (
	"context"
	"errors"
	"fmt"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/errdefs"
)

// What goes when a folder does: its function, if the repository deployed
// it (in this run, or in an earlier one: its record's labels say).

// remove deletes a removed folder's function; requests in flight finish.
// A function a pipeline runs is not deleted (409, as plover rm without
// --force): it stays, UNAVAILABLE with the reason, until the pipeline goes;
// nor is one the folder took over from a plover deploy (deleteOurs). One
// whose current version a plover deploy replaced since (no folder's
// label) is left alone: it is no longer the repository's.
func (r *Repository) remove(ctx context.Context, m *model) error {
	ours, err := r.stillOurs(ctx, m.name)
	if err != nil {
		r.cfg.Log.Warn("model repository: a removed folder's function could not be read to delete it", "model", m.name, "error", err)
		return err
	}
	if !ours {
		return nil
	}
	deleted, err := r.deleteOurs(ctx, m.name)
	if err != nil {
		r.cfg.Log.Warn("model repository: a removed folder's function could not be deleted", "model", m.name, "error", err)
		return err
	}
	if deleted {
		r.cfg.Log.Info("model repository: removed", "model", m.name)
	}
	return nil
}

// deleteOurs deletes name's function, whose current version is a
// folder's, unless a folder's version was made current over one made
// otherwise (a plover deploy; the store marks the version that was,
// api.Version.Over): its other versions may not be the repository's, and
// perhaps another tenant's, so it is refused (409, as a function a
// pipeline runs), the function serving on, until its owner rolls it back
// or deletes it. A function made by the repository alone, whose versions
// it unlabels itself as their folders go, has no mark.
func (r *Repository) deleteOurs(ctx context.Context, name string) (deleted bool, err error) {
	// Tried again while a deploy or rollback lands between its read and
	// the delete's (the engine's DeleteCurrent refuses a version no longer
	// current): the function is then decided anew, from what is current.
	for try := 1; ; try++ {
		rec, err := r.node.Versions(ctx, name)
		if errdefs.KindOf(err) == errdefs.KindNotFound {
			return false, nil
		}
		if err != nil {
			return false, err
		}
		var over string
		for _, v := range rec.Versions { // the last take-over
			if v.Over != "" {
				over = v.Over
			}
		}
		if over != "" {
			return false, errdefs.New(errdefs.KindConflict, nil, "function %s had a version deployed otherwise (plover deploy) current when its folder took it over (%s, the last time), so it is not the repository's to delete; it serves on: plover rollback %s VERSION gives it back one of its versions (plover versions %s lists them; then unload it again if its folder is still there), plover rm %s deletes it", name, over, name, name, name)
		}
		// Its owner decided from an earlier read (labelledErr, stillOurs):
		// a plover deploy that landed since made an unlabelled version
		// current, and is left alone, as it would have been a read earlier.
		if v, err := rec.CurrentVersion(); err != nil || v.Label == "" {
			r.cfg.Log.Info("model repository: its function was deployed otherwise since (plover deploy): left alone", "model", name)
			return false, nil
		}
		err = r.node.DeleteCurrent(ctx, name, rec.Current)
		switch errdefs.KindOf(err) {
		case errdefs.KindNotFound:
			return false, nil
		case errdefs.KindConflict:
			// A pipeline's 409 leaves the current version as it was; a
			// landing changed it, and is decided anew (a rollback to one
			// of the folders' versions is still the repository's).
			again, rerr := r.node.Versions(ctx, name)
			if try < 3 && (rerr == nil && again.Current != rec.Current || errdefs.KindOf(rerr) == errdefs.KindNotFound) {
				continue
			}
		}
		return err == nil, err
	}
}

// errNoBundle is a model folder with no bundle: no manifest at its top
// and no version folder.
var errNoBundle = errors.New("no " + abi.ManifestFile + " and no version folders (1/, 2/, ...)")

// noBundle settles m, whose folder stays but holds no bundle now (its
// version folders all removed, or its manifest), as a removed folder's
// model: its function goes if the repository deployed it (in this run or
// an earlier one), unless a pipeline runs it; then it stays, UNAVAILABLE
// with why and the reason, and the next scans try again. It answered
// requests before, while the index said it had no bundle.
func (r *Repository) noBundle(ctx context.Context, m *model, print string, why error) {
	// Its versions were listed after the look that decided the deploy:
	// a plover.json rewritten in place is absent a moment, and deleting
	// takes the function's record with it.
	if !stillAs(m, print) {
		r.unsettled(m)
		return
	}
	r.mu.Lock()
	ours := m.deployed
	r.mu.Unlock()
	if !ours {
		var err error
		if ours, err = r.labelledErr(ctx, m.name); err != nil {
			// As earlierRuns: taken for not ours, an earlier run's
			// function would serve on for good with no bundle.
			r.settle(m, "", nil, Unavailable, fmt.Sprintf("%v; whether its function is the repository's could not be read (tried again at the next scan): %v", why, err), errdefs.KindOf(err))
			return
		}
	}
	if ours {
		if err := r.remove(ctx, m); err != nil {
			r.mu.Lock()
			m.deployed = true // the next scan's try deletes it
			r.mu.Unlock()
			r.settle(m, "", nil, Unavailable, fmt.Sprintf("%v; deleting its function failed (tried again at the next scan): %v", why, err), errdefs.KindOf(err))
			return
		}
	}
	r.mu.Lock()
	// Not unloaded either, should an index have seen its function go
	// meanwhile: a folder with no bundle is what it is.
	m.deployed, m.unloaded = false, false
	r.mu.Unlock()
	r.settle(m, print, nil, Unavailable, why.Error(), errdefs.KindInvalid)
}

// labelledErr reports whether name's current version carries a version
// folder's label, which only the repository gives, and the error when
// name's record could not be read (not found is no error: nothing to
// delete).
func (r *Repository) labelledErr(ctx context.Context, name string) (bool, error) {
	rec, err := r.node.Versions(ctx, name)
	if errdefs.KindOf(err) == errdefs.KindNotFound {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	v, err := rec.CurrentVersion()
	return err == nil && v.Label != "", nil
}

// stillOurs reports whether name's function, which the repository
// deployed, is still the repository's to delete: false when it is gone,
// or when a plover deploy replaced its current version since (said in
// the log).
func (r *Repository) stillOurs(ctx context.Context, name string) (bool, error) {
	rec, err := r.node.Versions(ctx, name)
	if errdefs.KindOf(err) == errdefs.KindNotFound {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	if v, err := rec.CurrentVersion(); err == nil && v.Label == "" {
		r.cfg.Log.Info("model repository: its function was deployed otherwise since (plover deploy): left alone", "model", name)
		return false, nil
	}
	return true, nil
}

// earlierRuns sorts the models whose folders were removed before this run
// deployed them (their first deploy failed: the store down, a broken
// bundle) into those an earlier run deployed, returned to be deleted as
// any removed folder's function is, and the others, forgotten. One whose
// record cannot be read now stays, removing, for the next scan: dropped,
// an earlier run's function would serve on for good with no folder.
func (r *Repository) earlierRuns(ctx context.Context, ms []*model) []*model {
	var gone []*model
	for _, m := range ms {
		ours, err := r.labelledErr(ctx, m.name)
		r.mu.Lock()
		switch {
		case r.models[m.name] != m:
		case err != nil:
			m.removing, m.done, m.versions, m.retry = true, "", nil, false
			m.state, m.reason = Unavailable, brief(fmt.Sprintf("its folder was removed, but whether its function is the repository's could not be read (tried again at the next scan): %v", err))
		case ours:
			m.deployed = true
			gone = append(gone, m)
		default:
			delete(r.models, m.name)
		}
		r.mu.Unlock()
	}
	return gone
}
