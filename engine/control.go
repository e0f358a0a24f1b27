package engine

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"time"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/api"
	"github.com/plover-run/plover/bundle"
	"github.com/plover-run/plover/device"
	"github.com/plover-run/plover/errdefs"
	"github.com/plover-run/plover/fileutil"
	"github.com/plover-run/plover/loader"
	"github.com/plover-run/plover/pipedef"
	"github.com/plover-run/plover/registry"
)

// Control is the engine's control plane: deploys, rollbacks, deletes,
// garbage collection and the views of functions and versions. It sits
// beside the request path (Engine.Invoke) and shares the engine's state;
// the HTTP front end reaches the two through separate interfaces, so that
// each can be served, authorised or moved on its own.
type Control struct{ e *Engine }

// Control returns the engine's control plane.
func (e *Engine) Control() *Control { return &Control{e} }

// Deploy verifies a bundle, stores it, and makes it the current version of
// name. Nothing in the bundle runs here: the library is checked statically.
// A bundle equal to the current version changes nothing (the info says
// Unchanged) unless force is set.
func (c *Control) Deploy(ctx context.Context, name string, body io.Reader, force bool) (api.FunctionInfo, error) {
	return c.DeployAs(ctx, name, "", body, force)
}

// DeployAs is Deploy by tenant, recorded with the version it makes
// (api.Version.Tenant): the deploying token's name, "" without an auth
// file. With tenant workers (plover serve --worker-scope tenant) the
// version's programs share the tenant's worker processes.
func (c *Control) DeployAs(ctx context.Context, name, tenant string, body io.Reader, force bool) (api.FunctionInfo, error) {
	return c.deploy(ctx, name, body, registry.PublishOptions{Force: force, Tenant: tenant})
}

// DeployLabeled is Deploy recording label with the version it makes (a
// model repository's version folder: registry.PublishOptions); the same
// checks, store and cache path. With aside, the version is added beside
// the current one, which stays current (unless there is none): a lower
// version folder deployed after a higher one.
func (c *Control) DeployLabeled(ctx context.Context, name, label string, aside bool, body io.Reader) (api.FunctionInfo, error) {
	return c.deploy(ctx, name, body, registry.PublishOptions{Label: label, Aside: aside})
}

func (c *Control) deploy(ctx context.Context, name string, body io.Reader, o registry.PublishOptions) (fi api.FunctionInfo, err error) {
	e := c.e
	// A deploy forced past the pipelines it breaks, or past their check
	// when the store could not list them, says so in its answer and the
	// log: --force also deploys equal bytes again, and that one need not
	// know of the pipelines.
	var warning string
	defer func() {
		if err == nil && warning != "" {
			fi.Warnings = append(fi.Warnings, warning)
			e.cfg.Log.Warn("deployed with force, unchecked or failing the pipelines that run it", "function", name, "version", fi.Version, "warning", warning)
		}
	}()
	if !abi.ValidName(name) {
		return api.FunctionInfo{}, errorf(errdefs.KindBadRequest, nil, "function name %s must match [a-z0-9][a-z0-9-]{0,62}", errdefs.QuoteName(name))
	}
	p, err := c.publish(ctx, name, body, o)
	if err != nil {
		return api.FunctionInfo{}, err
	}
	warning = p.warning
	if p.capped != "" {
		defer func() {
			if err == nil {
				fi.Warnings = append(fi.Warnings, p.capped)
				e.cfg.Log.Warn("deployed with max_instances over a worker's bound", "function", name, "version", fi.Version, "warning", p.capped)
			}
		}()
	}
	pub, sha, n := p.pub, p.sha, p.n
	rv, created, current := pub.Version, pub.Created, pub.Current
	if created && o.Label != "" {
		e.tab.labelled(name, o.Label, rv.ID, pub.Record)
		e.tab.unlabel(name, o.Label, rv.ID)
	}
	if !created {
		// Its own read, not one in flight (lookup): that one may have
		// begun before this deploy's record was read, and a deploy must
		// leave this node on the version it answers.
		f, err := e.tab.read(ctx, name)
		if err != nil {
			return api.FunctionInfo{}, err
		}
		fi := c.info(f, rv, versionCount(pub.Record))
		fi.Unchanged = true
		return fi, nil
	}
	if !current {
		// Beside the current version: nothing on this node changes until
		// a request names it (PinVersion reads the record then).
		e.cfg.Log.Info("deployed beside the current version", "function", name, "version", rv.ID, "label", o.Label, "sha256", sha[:12], "bytes", n)
		return api.FunctionInfo{Name: name, Version: rv.ID, SHA256: rv.SHA256, Size: rv.Size, Created: rv.Created, Versions: versionCount(pub.Record)}, nil
	}
	f, err := e.tab.land(ctx, name, &rv, pub.Record, p.at)
	if err != nil {
		return api.FunctionInfo{}, errorf(errdefs.KindOf(err), err, "deployed %s version %s, but this node did not take it on: %v", name, rv.ID, err)
	}
	e.cfg.Log.Info("deployed", "function", name, "version", rv.ID, "sha256", sha[:12], "bytes", n)
	return c.landed(ctx, f, name, rv, pub.Record), nil
}

// published is a deploy's bundle as the store took it (publish): its
// publication, sha256 and size, the table's epoch before the store changed
// (land), and a forced deploy's warning.
type published struct {
	pub     registry.Published
	sha     string
	n       int64
	at      uint64
	warning string
	capped  string // max_instances served lower (instancesCapped)
}

// publish spools a deploy's body, checks and unpacks it and publishes it
// to the store. Its spool file and its part of --max-spool are given back
// as it returns: the deploy then lands and warms the version, which for a
// function with min_instances runs its constructors and hooks, up to the
// request's timeout, while other uploads could wait for that room.
func (c *Control) publish(ctx context.Context, name string, body io.Reader, o registry.PublishOptions) (p published, err error) {
	e := c.e
	room := &spoolRoom{e: e, ctx: ctx, tenant: o.Tenant, own: e.spools.of(o.Tenant)}
	defer room.release() // last: once the file is removed
	tmp, err := e.spoolFile(name)
	if err != nil {
		return published{}, err
	}
	defer os.Remove(tmp.Name())
	defer tmp.Close()
	sha, n, err := e.spool(name, body, tmp, room)
	if err != nil {
		return published{}, err
	}
	m, unpacked, err := e.unpackChecked(ctx, name, tmp, sha)
	if err != nil {
		return published{}, err
	}
	o.Unpacked = unpacked
	p.capped = e.instancesCapped(m)
	if m.IsPipeline() {
		sctx, cancel := storeCtx(ctx)
		defer cancel()
		if err := c.checkPipeline(sctx, name, m.Steps); err != nil {
			return published{}, err
		}
		if !o.Aside || o.Label != "" {
			if err := c.checkUsers(sctx, "deploy", name, m.Steps, o.Label, o.Aside); err != nil {
				if !o.Force {
					return published{}, err
				}
				p.warning = landedPast(err, "deployed with force")
			}
		}
	}
	if _, err := tmp.Seek(0, io.SeekStart); err != nil {
		return published{}, errorf(errdefs.KindInternal, err, "deploy")
	}
	p.at = e.tab.at() // before the store changes: see land
	// Each store step ends at a bound of its own, the upload's its size's:
	// a store that stalled mid-upload held the deploy, its spool file and
	// its part of --max-spool, for as long as the server ran.
	o.Bound = uploadBound
	pub, err := e.tab.reg.PublishWith(ctx, m, tmp, sha, n, o)
	if errors.Is(err, registry.ErrConflict) {
		return published{}, errorf(errdefs.KindConflict, err, "deploy %s: %s", name, err.Error())
	}
	if errors.Is(err, registry.ErrPastBound) {
		return published{}, errorf(errdefs.KindUnavailable, err, "deploy %s: %v (a store step's bound is 10 minutes, an upload's a second more a MiB of the bundle)", name, err)
	}
	if err != nil {
		return published{}, storageError(err, "deploy %s: cannot write to the store", name)
	}
	p.pub, p.sha, p.n = pub, sha, n
	return p, nil
}

// spool copies a deploy's body into tmp, hashing it on the way (the
// bundle is read once), and returns its sha256 and size: 413 past the
// node's bound, the transport's class for a failed read (a client gone,
// a stall's 408), the node's disk error for a failed write, 503 (504 at
// its deadline) for an upload that found no room in the node's spool
// budget (room: spool.go).
func (e *Engine) spool(name string, body io.Reader, tmp *os.File, room *spoolRoom) (string, int64, error) {
	h := sha256.New()
	sink := &fileutil.Writer{W: io.MultiWriter(e.cfg.WriteFault.Wrap(tmp, tmp.Name()), h)}
	limit, over := e.bundleLimit(name)
	var dst io.Writer = sink
	if e.spools.all != nil {
		room.w, room.limit, dst = sink, limit, room
	}
	n, err := io.Copy(dst, io.LimitReader(body, limit+1))
	if err != nil && sink.Err != nil { // our disk, not the client
		return "", 0, e.diskError(name, "spooling", sink.Err)
	}
	if errors.Is(err, errSpoolFull) {
		return "", 0, e.spoolFull(room, name, n)
	}
	if err != nil {
		// The transport's class where it gave one (a client gone); its own
		// refusals (a stall's 408, a body cut short) are read through the
		// wrap, and say why.
		k, why := errdefs.KindBadRequest, err.Error()
		var ee *errdefs.Error
		if errors.As(err, &ee) {
			k, why = ee.Kind, ee.Msg
		}
		return "", 0, errorf(k, err, "deploy %s: reading the bundle: %s", name, why)
	}
	if n > limit {
		return "", 0, over
	}
	if _, err := tmp.Seek(0, io.SeekStart); err != nil {
		return "", 0, errorf(errdefs.KindInternal, err, "deploy")
	}
	return hex.EncodeToString(h.Sum(nil)), n, nil
}

// unpackChecked unpacks the spooled bundle in a turn of the node's
// (unpackTurn), checks it (manifest, library, room on the devices) and
// hands it to the cache, then gives the turn back, before any store read
// or write: a slow bucket held both of the node's turns through its
// writes, and every other deploy waited. A bundle the later checks or the
// store refuse stays in the cache, evicted in its turn: it is the bytes
// of its sha256 whatever becomes of the deploy.
func (e *Engine) unpackChecked(ctx context.Context, name string, tmp io.ReadSeeker, sha string) (*abi.Manifest, int64, error) {
	release, err := e.unpackTurn(ctx, name)
	if err != nil {
		return nil, 0, err
	}
	defer release() // after the RemoveAll below: the turn bounds the scratch directory's disk too
	dir, m, err := e.verify(tmp, func(m *abi.Manifest) error {
		if err := checkManifest(m, name, e.targets); err != nil {
			return err
		}
		return e.checkInstances(m)
	})
	if err != nil {
		return nil, 0, e.unpackError(name, err)
	}
	defer os.RemoveAll(dir)
	if err := e.checkBundle(name, dir, m); err != nil {
		return nil, 0, err
	}
	if err := e.checkRoom(dir, m); err != nil {
		return nil, 0, err
	}
	// Recorded with the version: what a node's cache will hold of it,
	// which a pre-warm reserves (warmCurrent).
	unpacked, err := bundle.UnpackedBytes(dir)
	if err != nil {
		return nil, 0, e.diskError(name, "measuring the unpacked bundle", err)
	}
	e.cfg.Cache.Adopt(dir, sha)
	return m, unpacked, nil
}

// bundleLimit is the most bytes a deploy of name may store, and the 413
// of a bundle over it: this node's --max-body, or, where that is higher,
// the bundle cache's limit on what it fetches (bundle.Cache.MaxObject),
// which a bundle this node took would pass here, adopted, and fail on
// every other node's cold start.
func (e *Engine) bundleLimit(name string) (int64, error) {
	if lim := e.cfg.Cache.MaxObject(); lim < e.cfg.MaxBundleBytes {
		return lim, errorf(errdefs.KindTooLarge, nil, "deploy %s: bundle is larger than %d bytes, the most any node's bundle cache fetches from the store (a fixed limit: a higher --max-body does not raise it)", name, lim)
	}
	return e.cfg.MaxBundleBytes, errorf(errdefs.KindTooLarge, nil, "deploy %s: bundle is larger than %d bytes (plover serve --max-body)", name, e.cfg.MaxBundleBytes)
}

// landed is the answer of a deploy or rollback that made rv current and
// left this node running f, pre-warmed as its policy asks; f is nil when
// a delete that came after it dropped the function meanwhile.
func (c *Control) landed(ctx context.Context, f *function, name string, rv api.Version, rec *api.Record) api.FunctionInfo {
	if f == nil {
		f = &function{name: name}
	}
	c.e.warmIfWanted(ctx, f)
	return c.info(f, rv, versionCount(rec))
}

// checkBundle checks an unpacked bundle, whose manifest checkManifest
// passed, as every bundle is checked (loader.CheckBundle). The library
// read failing on this node's disk (EIO, EMFILE) is the node's failure,
// not a refusal naming where the node keeps the bundle.
func (e *Engine) checkBundle(name, dir string, m *abi.Manifest) error {
	if m.IsPipeline() {
		return nil // no library: its steps are checked against the store (checkPipeline)
	}
	info, err := loader.CheckBundle(dir, m, m.Target)
	if err == nil {
		err = info.CheckHooks(filepath.Join(dir, m.Library)) // deploy's alone: see CheckHooks
	}
	if err != nil {
		if isNodeFault(err) {
			return e.diskError(name, "checking", err)
		}
		err = inBundle(err, dir, m.Library)
		return errorf(errdefs.KindInvalid, err, "%s", err.Error())
	}
	return nil
}

// checkRoom refuses a function that no device of its target on this node
// has the memory for, its constants and one instance together: its every
// invoke here would fail.
func (e *Engine) checkRoom(dir string, m *abi.Manifest) error {
	if m.IsPipeline() {
		return nil
	}
	var constSize int64
	if m.Constants != "" {
		fi, err := os.Stat(filepath.Join(dir, m.Constants))
		if err != nil {
			return e.diskError(m.Name, "checking", err)
		}
		constSize = fi.Size()
	}
	var largest device.Device
	var total int64
	for _, d := range e.cfg.Devices {
		if t := d.MemInfo().Total; d.Target() == m.Target && (largest == nil || t > total) {
			largest, total = d, t
		}
	}
	if largest == nil {
		return nil // no such device: checkManifest refused it
	}
	if fe := fitsDevice(m, constSize, largest, total); fe != nil {
		return errorf(errdefs.KindInvalid, fe, "%s", fe.Error())
	}
	if hb, ok := largest.(device.HostMemoryBound); ok {
		if err := hb.FitsHostMemory(m, constSize); err != nil {
			return errorf(errdefs.KindInvalid, err, "%s", err.Error())
		}
	}
	return nil
}

// storageError is a failed write of ours: 507 when a disk is full (this
// node's or, for a file store, the store's), else 503 with the cause.
func storageError(err error, format string, args ...any) error {
	if errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT) {
		return errorf(errdefs.KindNoSpace, err, format+": out of disk space (%v)", append(args, errnoOf(err))...)
	}
	return unavailable(err, format, args...)
}

// checkPipeline checks a pipeline's steps against the store's records
// (pipedef.Check): 422 naming the step for a function that is not there, a
// pinned version it lacks or a cycle; 403 for a function the deployer may
// not invoke (the check ctx carries).
func (c *Control) checkPipeline(ctx context.Context, name string, steps []abi.Step) error {
	e := c.e
	err := pipedef.Check(ctx, name, steps, e.tab.reg.Get, func(err error) bool { return errors.Is(err, registry.ErrNoFunction) })
	var fe *pipedef.ForbiddenError
	var se *pipedef.StepError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &fe):
		return errorf(errdefs.KindForbidden, err, "pipeline %s: %s", name, err.Error())
	case errors.As(err, &se):
		return errorf(errdefs.KindInvalid, err, "pipeline %s: %s", name, err.Error())
	}
	return unavailable(err, "pipeline %s: checking its steps: store unavailable", name)
}

// checkUsers refuses (409) a pipeline version that would make the
// pipelines running name pass a limit or form a cycle
// (pipedef.CheckUsers): their requests would fail (500) from the moment
// it lands. A deploy with force goes on, as plover rm --force does, and
// a rollback (op) always does, so that nothing blocks one: each says so
// in a warning (landedPast).
func (c *Control) checkUsers(ctx context.Context, op, name string, steps []abi.Step, label string, aside bool) error {
	recs, err := c.e.tab.reg.List(ctx)
	if err != nil {
		return unavailable(err, "%s %s: the pipelines that may run it were not checked: store unavailable", op, name)
	}
	var ue *pipedef.UsersError
	if err := pipedef.CheckUsers(ctx, recs, name, steps, label, aside); errors.As(err, &ue) {
		them := plural(len(ue.Users)+ue.Hidden, "it", "them")
		if len(ue.Users) == 1 && ue.Hidden == 0 {
			them = ue.Users[0]
		}
		return errorf(errdefs.KindConflict, err, "deploy %s: %s: redeploy %s first, or deploy with force (plover deploy --force) and let %s requests fail", name, err.Error(), them, plural(len(ue.Users)+ue.Hidden, "its", "their"))
	}
	return nil
}

// landedPast is the warning of a deploy forced, or a rollback made
// (how), past checkUsers's err: the pipelines it breaks in the
// UsersError's own words (not the 409's, whose advice is to use the force
// just used), or the refusal a client would have had when the store could
// not list them.
func landedPast(err error, how string) string {
	var ue *pipedef.UsersError
	if errors.As(err, &ue) {
		return ue.Landed(how)
	}
	var ee *errdefs.Error
	if errors.As(err, &ee) {
		return ee.Msg
	}
	return err.Error()
}

// Delete removes a function; its current version retires after in-flight
// requests finish. A function that pipelines run is refused (409 naming
// them) unless force is set: their requests would fail at its step.
func (c *Control) Delete(ctx context.Context, name string, force bool) error {
	return c.deleteIf(ctx, name, force, nil)
}

// DeleteCurrent is Delete, without force, of a function whose current
// version is still version as the delete reads its record: one that a
// deploy or rollback made another current since is left alone (409). A
// caller that decided from an earlier read that the function is its own
// to delete (the model repository) so never deletes what another deploy
// landed meanwhile, but for one store call's window.
func (c *Control) DeleteCurrent(ctx context.Context, name, version string) error {
	return c.deleteIf(ctx, name, false, func(r *api.Record) error {
		switch {
		case r == nil:
			return errorf(errdefs.KindConflict, nil, "function %s is left alone: its record does not decode now, so whether %s is still its current version is unknown", name, version)
		case r.Current != version:
			return errorf(errdefs.KindConflict, nil, "function %s is left alone: its current version is %s now, not %s, which the delete was for (deployed or rolled back since)", name, r.Current, version)
		}
		return nil
	})
}

func (c *Control) deleteIf(ctx context.Context, name string, force bool, cond func(*api.Record) error) error {
	e := c.e
	sctx, cancel := storeCtx(ctx)
	defer cancel()
	if !force {
		recs, err := e.tab.reg.List(sctx)
		if err != nil {
			return unavailable(err, "delete %s: listing the pipelines that may use it: store unavailable", name)
		}
		if users, hidden := pipedef.UsersSeen(ctx, recs, name); len(users)+hidden > 0 {
			said := pipedef.Say(users)
			switch {
			case len(users) == 0:
				said = pipedef.Unseen(hidden)
			case hidden > 0:
				said = plural(len(users), "pipeline", "pipelines") + " " + said + " and " + pipedef.Unseen(hidden)
			default:
				said = plural(len(users), "pipeline", "pipelines") + " " + said
			}
			return errorf(errdefs.KindConflict, nil, "function %s is a step of %s: delete or redeploy %s first, or delete with force (plover rm --force) and let their requests fail at that step", name, said, plural(len(users)+hidden, "it", "them"))
		}
	}
	at := e.tab.at() // before the store changes: see land
	switch _, err := e.tab.reg.DeleteIf(sctx, name, cond); {
	case errdefs.KindOf(err) == errdefs.KindConflict:
		return err
	case errors.Is(err, registry.ErrBundlesKept):
		// The record is gone, so the function is: the bundles left are
		// gc's, not the caller's to retry (a retry answers 404).
		e.cfg.Log.Warn("deleted, with bundles kept for gc", "function", name, "err", err)
	case errors.Is(err, registry.ErrNoFunction):
		return notFound(name, err, "")
	case err != nil:
		return unavailable(err, "delete %s: cannot update the store", name)
	}
	e.tab.land(ctx, name, nil, nil, at) // a delete lands even while shutting down
	e.cfg.Log.Info("deleted", "function", name)
	return nil
}

// versionCount is how many versions rec, as written or read by the call
// answered, lists (0 for none): a read of its own, later, could say
// another write's count, or 0 where it failed.
func versionCount(rec *api.Record) int {
	if rec == nil {
		return 0
	}
	return len(rec.Versions)
}

// Versions returns a function's record: every version and the current one.
func (c *Control) Versions(ctx context.Context, name string) (*api.Record, error) {
	return c.e.tab.record(ctx, name)
}

// Listed is the names of the functions the store has, in one listing of
// its records (no record read): a model repository asks it to see that
// what it deployed was not deleted since (plover rm, here or on another
// node sharing the store).
func (c *Control) Listed(ctx context.Context) (map[string]bool, error) {
	ctx, cancel := storeCtx(ctx)
	defer cancel()
	tags, err := c.e.tab.reg.Tags(ctx)
	if err != nil {
		return nil, unavailable(err, "listing the functions: store unavailable")
	}
	out := make(map[string]bool, len(tags))
	for name := range tags {
		out[name] = true
	}
	return out, nil
}

// Rollback makes an earlier (or later) version of name current. In-flight
// requests finish on the version they started on.
func (c *Control) Rollback(ctx context.Context, name, version string) (api.FunctionInfo, error) {
	e := c.e
	sctx, cancel := storeCtx(ctx)
	defer cancel()
	id, warning, err := c.checkRollback(sctx, name, version)
	if err != nil {
		return api.FunctionInfo{}, err
	}
	if id == "" {
		id = version // SetCurrent's to refuse
	}
	at := e.tab.at() // before the store changes: see land
	rv, rec, err := e.tab.reg.SetCurrent(sctx, name, id)
	switch {
	case errors.Is(err, registry.ErrNoFunction):
		return api.FunctionInfo{}, notFound(name, err, "")
	case errors.Is(err, registry.ErrNoVersion) && len(version) < 8:
		return api.FunctionInfo{}, errorf(errdefs.KindNotFound, err, "function %s has no version %q: give a version id or a unique prefix of at least 8 characters (plover versions %s)", name, version, name)
	case errors.Is(err, registry.ErrNoVersion):
		return api.FunctionInfo{}, errorf(errdefs.KindNotFound, err, "function %s has no version %q", name, version)
	case errors.Is(err, registry.ErrConflict):
		return api.FunctionInfo{}, errorf(errdefs.KindConflict, err, "rollback %s: %s", name, err.Error())
	case err != nil:
		return api.FunctionInfo{}, unavailable(err, "rollback %s: cannot update the store", name)
	}
	f, err := e.tab.land(ctx, name, &rv, rec, at)
	if err != nil {
		return api.FunctionInfo{}, errorf(errdefs.KindOf(err), err, "rolled %s back to %s, but this node did not follow: %v", name, rv.ID, err)
	}
	e.cfg.Log.Info("current version set", "function", name, "version", rv.ID)
	fi := c.landed(ctx, f, name, rv, rec)
	if warning != "" {
		fi.Warnings = append(fi.Warnings, warning)
		e.cfg.Log.Warn("rolled back, unchecked or failing the pipelines that run it", "function", name, "version", rv.ID, "warning", warning)
	}
	return fi, nil
}

// Unlabel takes label off name's versions but the current one
// (registry.Registry.Unlabel), and unloads this node's pinned versions
// that carried it: a model repository's version folder that went stops
// answering by its number. Other nodes keep a loaded one until its
// idle_ttl unloads it.
//
// This node's pinned versions are unloaded whatever the store said: when
// it found the label already off (another node's call, or this one's
// earlier call whose write landed but whose answer was lost), and when
// the write failed, which may have landed too, while the caller (the
// repository's scan) reads the record next time without the label and
// does not call again. Unloading a pinned version the record still
// labels costs its next pin a load, no more.
func (c *Control) Unlabel(ctx context.Context, name, label string) error {
	e := c.e
	sctx, cancel := storeCtx(ctx)
	defer cancel()
	current, n, err := e.tab.reg.Unlabel(sctx, name, label)
	if !errors.Is(err, registry.ErrNoFunction) {
		e.tab.unlabel(name, label, current) // current "": this node's
	}
	switch {
	case errors.Is(err, registry.ErrNoFunction):
		return notFound(name, err, "")
	case errors.Is(err, registry.ErrConflict):
		return errorf(errdefs.KindConflict, err, "unlabel %s: %s", name, err.Error())
	case err != nil:
		return unavailable(err, "unlabel %s: cannot update the store", name)
	}
	if n > 0 {
		e.cfg.Log.Info("version label retired", "function", name, "label", label, "versions", n)
	}
	return nil
}

// Unready is what a pin of name's version (its id) would answer on this
// node (pipeline.Pin.Unready: its library refused, its crashes' back-off,
// or, for a pipeline, one of its steps'), from what the node holds: nil
// for a version it has not loaded or tried. It reads and loads nothing: a
// model repository's index asks it of every version it lists.
func (c *Control) Unready(name, version string) error {
	return c.unready(name, version, time.Now(), 1, map[[2]string]int{})
}

// unready is Unready for a step depth pipelines deep (a step with no
// version runs its function's current one). seen holds the steps looked
// at, by name and version, with the shallowest depth each was expanded
// at: each is looked at once, as a request pins each once, since
// pipelines redeployed under others can make the tree of steps grow as
// 32 to the power of its depth while its distinct steps stay a few.
func (c *Control) unready(name, ref string, now time.Time, depth int, seen map[[2]string]int) error {
	key := [2]string{name, ref}
	if d, ok := seen[key]; ok && d <= depth {
		return nil
	}
	seen[key] = depth
	f, v := c.e.tab.match(name, ref)
	if ref == "" && f != nil {
		c.e.tab.mu.Lock()
		v = f.cur
		c.e.tab.mu.Unlock()
	}
	if v == nil {
		return nil
	}
	if err := v.unready(now); err != nil || v.rec.Kind != abi.KindPipeline || depth > pipedef.MaxDepth {
		return err
	}
	steps := slices.Clone(v.rec.Steps) // a queue: the record's stays as it is
	for len(steps) > 0 {
		s := steps[0]
		steps = append(steps[1:], s.Parallel...)
		if s.Function == "" {
			continue
		}
		if err := c.unready(s.Function, s.Version, now, depth+1, seen); err != nil {
			return err
		}
	}
	return nil
}

// checkRollback checks a pipeline version's steps before it becomes
// current again: the functions it named may have gone since. It returns
// the id version resolves to, which the rollback makes current: resolved
// again, a label or prefix could name a version deployed since, never
// checked. Anything else (no such function or version: id "") is
// SetCurrent's to report. The pipelines running name are checked too,
// and what would break them is a warning, not a refusal: nothing blocks
// a rollback (an older version may nest deeper than the one current).
func (c *Control) checkRollback(ctx context.Context, name, version string) (id, warning string, err error) {
	e := c.e
	rec, err := e.tab.reg.Get(ctx, name)
	if errors.Is(err, registry.ErrNoFunction) {
		return "", "", nil // SetCurrent's 404
	}
	if err != nil {
		// Fail closed: an unchecked rollback could run what its caller may not.
		return "", "", unavailable(err, "rollback %s: reading its record: store unavailable", name)
	}
	v, err := pipedef.Pick(rec, version)
	if err != nil {
		return "", "", nil // no such version, or an ambiguous prefix: SetCurrent's to refuse
	}
	if !v.IsPipeline() {
		return v.ID, "", nil
	}
	if err := c.checkPipeline(ctx, name, v.Steps); err != nil {
		return v.ID, "", err
	}
	if err := c.checkUsers(ctx, "rollback", name, v.Steps, "", false); err != nil {
		warning = landedPast(err, "rolled back")
	}
	return v.ID, warning, nil
}

// GC deletes bundles no function record references, older than grace.
func (c *Control) GC(ctx context.Context, grace time.Duration) ([]string, error) {
	e := c.e
	ctx, cancel := storeCtx(ctx)
	defer cancel()
	removed, err := e.tab.reg.GC(ctx, grace)
	if errors.Is(err, registry.ErrBundlesKept) {
		// Not the store's failure: a later gc may delete them.
		return removed, errorf(errdefs.KindUnavailable, err, "%s", err.Error())
	}
	if err != nil {
		return removed, unavailable(err, "gc: store unavailable")
	}
	return removed, nil
}
