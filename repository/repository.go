// Package repository serves a model repository directory (plover serve
// --repository DIR), as Triton's --model-repository and KServe's
// /mnt/models lay models out: DIR/NAME/ is a bundle directory (one version)
// or holds numbered version folders DIR/NAME/1/, DIR/NAME/2/, each a bundle,
// the highest current; or DIR is one bundle itself. It scans DIR, waits for
// folders being copied to settle, deploys what changed through the node's
// control plane (the checks, store and cache path of every deploy),
// removes what went, and keeps each model's state (READY, UNAVAILABLE,
// LOADING, with a reason) for the repository API's index, load and unload.
// The engine does not know it: it talks to the node through Node.
package repository

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unicode/utf8"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/api"
	"github.com/plover-run/plover/errdefs"
)

// The states of the repository API's index (Triton's names).
const (
	Ready       = "READY"
	Unavailable = "UNAVAILABLE"
	Loading     = "LOADING"
)

// Node is what a repository needs of the node it serves on
// (engine.Control): deploys with a label (the version folder), current
// or aside (beside the current one), a
// function's record, making one of its versions current, and removing it
// (requests in flight finish).
type Node interface {
	DeployLabeled(ctx context.Context, name, label string, aside bool, body io.Reader) (api.FunctionInfo, error)
	Versions(ctx context.Context, name string) (*api.Record, error)
	Rollback(ctx context.Context, name, version string) (api.FunctionInfo, error)
	// DeleteCurrent removes name's function only while its current
	// version is version (409 else): what the repository decided was its
	// own is not what a deploy landed since.
	DeleteCurrent(ctx context.Context, name, version string) error
	// Unlabel takes a version folder's label off the function's versions
	// but the current one: the folder went.
	Unlabel(ctx context.Context, name, label string) error
	// Unready is why the node cannot run name's version (its id) now, as
	// a model's ready answers (its library refused at its first load,
	// its crashes' back-off), or nil; it reads and loads nothing.
	Unready(name, version string) error
	// Listed is the functions the store has, in one listing: the
	// repository's deployed functions deleted since (plover rm) are not.
	Listed(ctx context.Context) (map[string]bool, error)
}

// Config configures a Repository.
type Config struct {
	Dir string
	// Name, when DIR is one bundle directory, is the function it serves
	// as (KServe's model name); "": the manifest's.
	Name string
	// Poll is how often DIR is scanned again; 0: once at start (and again
	// only while a folder settles, a deploy or delete is tried again, or
	// an index sees an unloaded model's function back; each such scan
	// acts on every folder). A failed state file write is tried again
	// alone, without a scan.
	Poll time.Duration
	// Settle is how long a folder's files must be still before it loads
	// (0: 2 s). While polling, a folder also loads only once two scans see
	// it the same (see settled).
	Settle time.Duration
	// Deploys is how many bundles deploy at once (0: 4).
	Deploys int
	// MaxBundleBytes is the node's bound on a bundle (engine.Config's,
	// plover serve --max-body): packing a version folder stops past it,
	// the version UNAVAILABLE (413 on load). 0: none of the repository's
	// own (the node still refuses a larger bundle, once packed whole).
	MaxBundleBytes int64
	// StateFile keeps the models unloaded (by the API or plover rm) for
	// a restart (plover serve: DATA/repository-unloaded.json); "": none
	// kept, a restart loads every folder.
	StateFile string
	Log       *slog.Logger
}

// Repository is a model repository served on a node.
type Repository struct {
	cfg  Config
	node Node
	top  string // DIR's base name, which messages begin with
	// turn is held by the one scan or load or unload changing deployments
	// at a time (a load racing a poll would deploy twice); mu guards
	// models and is never held across I/O, so the index answers while a
	// scan deploys.
	turn chan struct{}
	// ended is closed when Run's context ends (the server's stop): a load
	// or unload waiting for the turn gives up then, though its own
	// context (an HTTP request's, which a drain does not end) goes on.
	ended     chan struct{}
	endedOnce sync.Once
	mu        sync.Mutex
	models    map[string]*model
	scans     int // scans that read DIR: the first one counts a folder's first look
	// epoch counts the deploys settled (settleLocked): a listing of the
	// store taken at epoch e tells nothing of a model settled after e.
	epoch uint64
	// single is the function DIR serves as while it is one bundle (""
	// while it holds model folders): the name stays while its manifest is
	// rewritten, absent or renamed, until DIR settles so.
	single string
	// topSeen is DIR's fingerprint, as a scan last saw it, while a
	// manifest at its top may make it one bundle, and topSeenAt when
	// that was first seen; topWarned: the log said the manifest is left
	// alone; topBad: DIR's fingerprint when the log said its settled
	// manifest does not parse (topRetry: as the last scan found it);
	// switching: this scan made DIR one bundle
	// (becomesSingle). All with the turn.
	topSeen   string
	topSeenAt time.Time
	topWarned bool
	topBad    string
	topRetry  bool // topBad's DIR is looked at again on the retries' back-off
	switching bool
	// started is closed once Run's scans read DIR and found nothing
	// settling: the folders found at start are deployed, or failed
	// (Started).
	started   chan struct{}
	startOnce sync.Once
	// kept is what StateFile said of the models not looked at yet (nil
	// after the first scan); saved is what it says now, and saving is
	// held while it is written; savedUnknown (with saving held): a write
	// failed after its rename, and the file may say either.
	kept         map[string]keptModel
	saved        map[string]keptModel
	savedUnknown bool
	saving       sync.Mutex
	// unsaved: the last write of the state file failed, and was said;
	// written with saving held, read by Run to write it again.
	unsaved atomic.Bool
	// kicks has Run scan again (no Poll): an index saw an unloaded
	// model's function back in the store. Scans run only in Run's loop,
	// so shutdown waits for them and settling and retries go on as after
	// any scan.
	kicks chan struct{}
	// saves wakes an idle Run (no Poll) to try a failed write of the
	// state file again after its back-off, with no scan.
	saves chan struct{}
	// writes counts the index listings whose state file write Run waits
	// for as it returns; stopped (under mu): Run waits or waited, and a
	// listing started since is not counted.
	writes  sync.WaitGroup
	stopped bool
	// idle: Run waits for a kick or a failed write alone (no Poll,
	// nothing settling or to try again), where it once returned. Only tests read it: nothing
	// else tells a Run at rest from one between two tries.
	idle atomic.Bool
	// waits counts Run's waits begun, and wake (nil but in tests: then
	// wakeSave) is a failed write's wake-up: a test has Run look at
	// unsaved just after the wake, where a write was once lost.
	waits atomic.Uint64
	wake  func()
	// flight is the store's listing on its way (noticeDeleted), nil when
	// none; under mu.
	flight *flight
	// dirty: the unloaded models may have changed since the state file
	// was written (saveKept); under mu.
	dirty bool
	// What the scans saw of DIR for heldBack, with the turn: dev, its
	// device (st_dev) at the last scan (devSeen: one did), foundDev at
	// the last scan that found a model folder (foundSeen: one did),
	// emptySince when the first of the scans since found none while
	// models are deployed, emptySaid: the log said so.
	dev, foundDev      uint64
	devSeen, foundSeen bool
	emptySince         time.Time
	emptySaid          bool
}

// Started is closed once Run's first scans have deployed the folders found
// at start, or failed them (the index says why; failures that may pass are
// tried again later): a server is ready then.
func (r *Repository) Started() <-chan struct{} { return r.started }

// model is one folder's state.
type model struct {
	name, dir string
	renamed   bool      // DIR is one bundle served under Config.Name
	seen      string    // the folder's fingerprint at the last scan
	seenAt    time.Time // when it was first seen so
	done      string    // the fingerprint last deployed (or failed): unchanged, nothing to do
	state     string    // of the folder as a whole when versions is empty
	reason    string
	kind      errdefs.Kind // the class of the failure reason says, for a load
	versions  []version    // by label, ascending
	deployed  bool         // the node has it from us: removing the folder deletes it
	retry     bool         // its last deploy failed for a reason that may pass: the next scan tries again
	removing  bool         // its folder went and deleting its function failed: the next scan tries again
	unloaded  bool         // by the API or plover rm, until a load or the folder changes
	// deploying: a load or scan decided to deploy it and has not settled
	// yet; a listing of the store says nothing of it (it may be absent
	// from the store only until this deploy puts it back).
	deploying bool
	// packs is, by label, the look of each version folder packed and
	// deployed (or found deployed) and its bytes' digest: a scan packs
	// only the folders that changed (packedAs).
	packs map[string]packed
	epoch uint64 // Repository.epoch at its last settle
	// lookAt: while unloaded, when an index seeing its function listed
	// has a scan look again (backInListing): a minute after a scan found
	// it not the repository's (a plover deploy), and, while its record
	// cannot be read, after lookWait (Settle, doubling up to a minute).
	lookAt   time.Time
	lookWait time.Duration
	// settled is state, reason and kind as the last settle left them, for
	// a folder that changed and came back as it was before it settled
	// again (a link unreadable for a scan): its entry is what it was, not
	// the LOADING the change showed.
	settled struct {
		state, reason string
		kind          errdefs.Kind
	}
	changing bool // its LOADING is settledLocked's: the folder changed since
}

// markSettled records m's state, reason and kind as what a change that
// comes back as it was restores (settledLocked). Under r.mu.
func (m *model) markSettled() {
	m.settled.state, m.settled.reason, m.settled.kind = m.state, m.reason, m.kind
}

// version is one version folder's state.
type version struct {
	// dir is read (links followed); where names it in messages as the
	// repository lays it out ("models/cnn/2"), not by where links lead.
	label, dir, where string
	state, reason     string
	kind              errdefs.Kind // the class of the failure reason says, for a load
	id                string       // the node's version id once deployed
	steps             []string     // a pipeline's step functions, as its manifest names them
}

// New returns a repository over cfg.Dir deploying to node; Run serves it.
func New(cfg Config, node Node) (*Repository, error) {
	if cfg.Settle <= 0 {
		cfg.Settle = 2 * time.Second
	}
	if cfg.Deploys <= 0 {
		cfg.Deploys = 4
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	fi, err := os.Stat(cfg.Dir)
	if err != nil {
		return nil, fmt.Errorf("--repository: %w", err)
	}
	// Absolute, as the walks name files: a relative DIR ("models") would
	// not be found in their paths, and a reason would name it twice.
	if abs, err := filepath.Abs(cfg.Dir); err == nil {
		cfg.Dir = abs
	}
	if !fi.IsDir() {
		return nil, fmt.Errorf("--repository %s: not a directory", cfg.Dir)
	}
	if cfg.Name != "" && !abi.ValidName(cfg.Name) {
		return nil, fmt.Errorf("--repository-name %q: a function name must match [a-z0-9][a-z0-9-]{0,62}", cfg.Name)
	}
	r := &Repository{cfg: cfg, node: node, top: filepath.Base(filepath.Clean(cfg.Dir)),
		turn: make(chan struct{}, 1), ended: make(chan struct{}), models: map[string]*model{}, started: make(chan struct{}),
		kicks: make(chan struct{}, 1), saves: make(chan struct{}, 1)}
	r.removeTorn()
	r.kept = r.readKept()
	r.saved = maps.Clone(r.kept)
	if r.saved == nil {
		r.saved = map[string]keptModel{}
	}
	return r, nil
}

// Scan looks at the repository once and brings the node in line: folders
// that settled and changed are deployed (functions first, then pipelines,
// whose steps must be there), removed folders' functions deleted. It
// reports whether a folder is still settling or a model's deploy is to be
// tried again.
func (r *Repository) Scan(ctx context.Context) bool {
	settling, retrying := r.scan(ctx)
	return settling || retrying
}

// scan is Scan; it reports whether a folder is still settling and whether
// a model is to be tried again.
func (r *Repository) scan(ctx context.Context) (settling, retrying bool) {
	if !r.take(ctx) {
		return false, false
	}
	defer r.give()
	if ctx.Err() != nil {
		// take's select may pick the free turn over a context that ended.
		return false, false
	}
	return r.scanHeld(ctx)
}

// scanHeld is scan, called with the turn.
func (r *Repository) scanHeld(ctx context.Context) (settling, retrying bool) {
	found, wait, err := r.list()
	settling = wait
	switching := r.switching
	r.switching = false
	if err != nil {
		// DIR itself unreadable (a volume remounting): nothing is removed
		// for it, and the next scan tries again.
		r.cfg.Log.Warn("cannot scan the model repository", "dir", r.cfg.Dir, "error", err)
		return false, true
	}
	now := time.Now()
	held := r.heldBack(found, now)
	r.mu.Lock()
	for name, f := range found {
		r.modelLocked(name, f) // an earlier run's unloads applied, for backElsewhere
	}
	r.mu.Unlock()
	r.backElsewhere(ctx, r.noticeDeleted(ctx, false), found)
	var due []*model
	r.mu.Lock()
	var gone, unsure []*model
	type warn struct {
		name, reason string
		f            folder
	}
	var warns []warn  // a model and why its folder is unreadable, logged after the unlock
	var left []string // models whose folders DIR turning into one bundle hid
	for name, m := range r.models {
		if _, ok := found[name]; !ok && !held {
			switch {
			case switching && !m.removing:
				// Not deleted: the scan that found DIR one bundle
				// cannot tell a folder removed from one it no longer
				// lists; plover rm a function no longer wanted. (A
				// delete being tried again goes on below.)
				if m.deployed && !m.unloaded {
					left = append(left, name)
				}
				delete(r.models, name)
			case m.deployed && !m.unloaded:
				gone = append(gone, m) // kept, removing, until its function is deleted
			case !m.unloaded:
				unsure = append(unsure, m) // an earlier run's, maybe (its record, below)
			default:
				delete(r.models, name)
			}
		}
	}
	for name, f := range found {
		m := r.modelLocked(name, f)
		if m.removing { // back before its function was deleted: deployed again
			m.removing, m.done = false, ""
		}
		switch r.settledLocked(m, f, now) {
		case stillChanging:
			settling = true
		case unreadable:
			warns = append(warns, warn{m.name, m.reason, f})
		case changed:
			m.deploying = true
			due = append(due, m)
		}
	}
	r.mu.Unlock()
	if len(left) > 0 {
		slices.Sort(left)
		r.cfg.Log.Warn("model repository: the directory is now one bundle; the functions of its model folders are left alone (plover rm them)", "dir", r.cfg.Dir, "function", r.single, "left", left)
	}
	for _, w := range warns {
		r.warnUnreadable(w.name, w.reason, w.f)
	}
	r.removeGone(ctx, append(gone, r.earlierRuns(ctx, unsure)...))
	// By name: a repository deploys in the same order at every start.
	slices.SortFunc(due, func(a, b *model) int { return strings.Compare(a.name, b.name) })
	r.deployAll(ctx, due)
	r.mu.Lock()
	r.scans++
	r.kept = nil // those not found: their folders went, and their unloads
	retrying = retrying || r.topRetry || held
	for _, m := range r.models {
		retrying = retrying || m.retry || m.removing
	}
	r.mu.Unlock()
	r.saveKept()
	return settling, retrying
}

// heldBack is whether this scan takes no model whose folder it did not
// find for removed. An unmounted volume leaves DIR an empty mountpoint,
// and a scan that took that for every folder removed deleted every
// model's function from the store, for every node sharing it. So DIR
// found with no model folder while models are deployed is taken as
// unreadable (logged once), until two scans a poll apart (Settle without
// Poll) found it so on the device the last scan that found a folder saw;
// and a scan that finds DIR on another device than the last one did (a
// volume mounted or unmounted over it) takes nothing for removed by that
// alone, though it deploys what it found. DIR holding a manifest at its
// top is no empty mountpoint: its folders removed go at once, as before
// it becomes one bundle (whose switch leaves them alone). Called with the
// turn.
func (r *Repository) heldBack(found map[string]folder, now time.Time) bool {
	fi, err := os.Stat(r.cfg.Dir)
	if err != nil {
		// Read a moment ago: unreadable now, as a list that failed.
		r.cfg.Log.Warn("cannot scan the model repository", "dir", r.cfg.Dir, "error", err)
		return true
	}
	var dev uint64
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		dev = uint64(st.Dev)
	}
	moved := r.devSeen && dev != r.dev
	r.dev, r.devSeen = dev, true
	if moved {
		r.cfg.Log.Warn("model repository: the directory is on another device than at the last scan (a volume mounted or unmounted over it): no model whose folder is missing is taken as removed at this scan", "dir", r.cfg.Dir)
	}
	if len(found) > 0 {
		r.foundDev, r.foundSeen, r.emptySince, r.emptySaid = dev, true, time.Time{}, false
		return moved
	}
	if _, err := os.Stat(filepath.Join(r.cfg.Dir, abi.ManifestFile)); err == nil {
		// A manifest at its top (DIR becoming one bundle): read, not
		// an empty mountpoint.
		r.emptySince, r.emptySaid = time.Time{}, false
		return moved
	}
	deployed := false
	r.mu.Lock()
	for _, m := range r.models {
		deployed = deployed || !m.unloaded
	}
	r.mu.Unlock()
	if !deployed {
		r.emptySince, r.emptySaid = time.Time{}, false
		return false
	}
	if r.emptySince.IsZero() {
		r.emptySince = now
	}
	if !moved && (!r.foundSeen || dev == r.foundDev) && now.Sub(r.emptySince) >= cmp.Or(r.cfg.Poll, r.cfg.Settle) {
		return false // emptied: its models go
	}
	if !r.emptySaid {
		r.emptySaid = true
		r.cfg.Log.Warn("model repository: no model folder found while models are deployed: taken as the directory unreadable (a volume not mounted?), nothing removed; emptied, its models are removed once a scan a poll later finds it empty too on the same device", "dir", r.cfg.Dir)
	}
	return true
}

// removeGone deletes the functions of the models whose folders went; one
// that fails stays UNAVAILABLE with the reason, tried again at the next
// scan. Called with the turn.
func (r *Repository) removeGone(ctx context.Context, gone []*model) {
	slices.SortFunc(gone, func(a, b *model) int { return strings.Compare(a.name, b.name) })
	// Again while one goes: a pipeline removed with its step goes first.
	for len(gone) > 0 {
		var left []*model
		for _, m := range gone {
			err := r.remove(ctx, m)
			r.mu.Lock()
			if err == nil {
				delete(r.models, m.name)
			} else {
				// Shown UNAVAILABLE with the reason, and tried again at
				// the next scan.
				left = append(left, m)
				m.removing, m.done, m.versions, m.retry = true, "", nil, false
				m.state, m.reason = Unavailable, brief(fmt.Sprintf("its folder was removed, but deleting its function failed (tried again at the next scan): %v", err))
			}
			r.mu.Unlock()
		}
		if len(left) == len(gone) {
			break
		}
		gone = left
	}
}

// modelLocked is the model name as found in f, made if new. A model
// follows its folder: DIR as one bundle served it, and now DIR/NAME/ does
// (or the other way round).
func (r *Repository) modelLocked(name string, f folder) *model {
	m := r.models[name]
	if m == nil {
		m = &model{name: name, state: Loading, reason: "found: waiting for its first deploy"}
		r.models[name] = m
		r.keptLocked(m)
	}
	m.dir, m.renamed = f.dir, f.renamed
	return m
}

// settledLocked decides what a scan does with m as found: a folder is
// deployed once it is still, that is when none of its files changed within
// Settle (changedAt: a copy that keeps its source's times, cp -a, still
// sets status change times) and, while polling, when two scans a poll
// apart saw the same files (names, sizes, times). Its first scan at start
// needs only the first rule, so that a repository at rest serves at once.
func (r *Repository) settledLocked(m *model, f folder, now time.Time) settleResult {
	first := m.seen == ""
	same := f.print == m.seen
	if !same {
		m.seen, m.seenAt = f.print, now
	}
	// An unloaded model's folder is compared by its contents alone: a
	// chmod, chown or hard link (a kubelet's fsGroup chown at each pod
	// start), or a print kept by a server that read no status change
	// times, does not end the unload.
	if f.print == m.done || m.unloaded && contentOf(f.print) == contentOf(m.done) {
		if m.changing {
			// It changed and is back as it was: what the change said is
			// no longer so.
			m.state, m.reason, m.kind = m.settled.state, m.settled.reason, m.settled.kind
			m.changing = false
		}
		return unchanged
	}
	// An unload ends with the deploy this change brings (settleLocked),
	// not here: a folder that changes for a scan and comes back as it was
	// (a link unreadable a moment) is still unloaded.
	still := now.Sub(f.stillSince(m.seenAt)) >= r.cfg.Settle
	if (f.err == nil || f.unreadable) && still && (same || (first && r.scans == 0)) {
		if f.unreadable {
			// Not a copy in progress: nothing to wait for (a server
			// waiting would never say ready) until the folder changes.
			r.unreadableLocked(m, f)
			return unreadable
		}
		return changed
	}
	// Its deployed versions still serve, and show, beside the folder's
	// LOADING entry.
	m.state, m.reason = Loading, "files changed within the last "+r.cfg.Settle.String()+": waiting for the copy to settle"
	m.changing = true
	if f.err != nil {
		m.reason = brief("cannot read it yet: " + f.why)
	}
	return stillChanging
}

// unreadableLocked makes m UNAVAILABLE for a folder that cannot be read
// as it is (f.unreadable), until it changes; its function, if deployed,
// serves on meanwhile.
// It is the node's failure (its volume, its permissions), not a bundle
// refused: a load answers 503, as for a file in it that cannot be read.
func (r *Repository) unreadableLocked(m *model, f folder) {
	r.settleLocked(m, f.print, nil, Unavailable, f.why+": tried again when it changes", errdefs.KindUnavailable)
}

// warnUnreadable logs why m's folder f is unavailable, with its path and
// the error as the system gave it (the index and the load's answer name
// it from DIR's name alone); not under r.mu.
func (r *Repository) warnUnreadable(name, reason string, f folder) {
	r.cfg.Log.Warn("model repository: a model is unavailable", "model", name, "reason", reason, "folder", f.dir, "error", f.err)
}

// take waits for the turn to change deployments; false if ctx ended first.
func (r *Repository) take(ctx context.Context) bool {
	if r.stopping() {
		return false
	}
	select {
	case r.turn <- struct{}{}:
	case <-ctx.Done():
		return false
	case <-r.ended:
		return false
	}
	// select picks at random among ready cases: a turn left free by a Run
	// that ended is ready beside r.ended.
	if r.stopping() {
		r.give()
		return false
	}
	return true
}

// stopping reports whether Run's context ended: no load or unload starts.
func (r *Repository) stopping() bool {
	select {
	case <-r.ended:
		return true
	default:
		return false
	}
}

func (r *Repository) give() { <-r.turn }

// unsettled settles m, whose folder changed since the look that decided
// its deploy (being copied, a manifest rewritten in place): nothing more
// deploys from that look, what served serves on, and the next scans see
// it settle.
func (r *Repository) unsettled(m *model) {
	r.mu.Lock()
	old := m.versions
	r.mu.Unlock()
	r.settle(m, "", old, Loading, fmt.Sprintf("%s: files changed while it was read: waiting for the copy to settle", r.where(m.dir)), errdefs.KindUnavailable)
}

// settle records a deploy's outcome: done is the fingerprint it answers
// ("" to try again at the next scan).
func (r *Repository) settle(m *model, done string, vers []version, state, reason string, kind errdefs.Kind) {
	r.mu.Lock()
	r.settleLocked(m, done, vers, state, reason, kind)
	state, reason = m.state, m.reason
	r.mu.Unlock()
	if state == Unavailable && reason != "" {
		r.warnUnavailable(m.name, reason)
	}
}

// warnUnavailable logs why a model is unavailable; not under r.mu (a
// blocked log sink would stall every index).
func (r *Repository) warnUnavailable(name, reason string) {
	r.cfg.Log.Warn("model repository: a model is unavailable", "model", name, "reason", reason)
}

// settleLocked is settle under r.mu; the caller logs it, after the
// unlock.
func (r *Repository) settleLocked(m *model, done string, vers []version, state, reason string, kind errdefs.Kind) {
	if state == "" && len(vers) == 0 {
		// The index shows the folder's own entry then: never without a
		// state.
		state, reason = Unavailable, cmp.Or(reason, "no version deployed")
	}
	m.done, m.versions, m.state, m.reason, m.kind = done, vers, state, brief(reason), kind
	m.markSettled()
	m.changing = false
	m.retry = done == ""
	// A deploy's outcome: the load or the change of the folder that
	// started it ended any unload, and an index that took the model for
	// deleted meanwhile judged by a listing older than this deploy.
	m.deploying, m.unloaded = false, false
	r.epoch++
	m.epoch = r.epoch
	for _, v := range vers {
		if v.state == Ready {
			m.deployed = true
		}
	}
}

// maxReason bounds a reason: a manifest's values are quoted in it, and a
// plover.json may be 1 MiB, which every index answer and log line would
// carry.
const maxReason = 1024

// brief is reason cut to maxReason bytes (at a character's start), saying
// how much was cut; its beginning names the folder, the file and the field.
func brief(reason string) string {
	if len(reason) <= maxReason {
		return reason
	}
	n := maxReason
	// Back to the start of the rune cut, at most a rune's length: past
	// that the bytes are no UTF-8, and a run of them would cut it all.
	for i := 0; i < utf8.UTFMax-1 && !utf8.RuneStart(reason[n]); i++ {
		n--
	}
	return reason[:n] + " [" + strconv.Itoa(len(reason)-n) + " more bytes cut]"
}

// quiet is err's text with the server's path to DIR as the repository's
// name: a reason an index shows tells the client nothing of the server's
// file system.
func (r *Repository) quiet(err error) string {
	return strings.ReplaceAll(err.Error(), r.cfg.Dir, r.top)
}

// where names a folder of the repository in messages, from DIR's own
// name: "models/cnn/2".
func (r *Repository) where(dir string) string {
	rel, err := filepath.Rel(r.cfg.Dir, dir)
	if err != nil || rel == "." {
		return r.top
	}
	return r.top + "/" + filepath.ToSlash(rel)
}
