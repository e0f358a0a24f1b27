package repository

// Packing a version folder that others than the server write (the bundle
// package opens only regular files, without blocking on a FIFO), and
// deploying it.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"slices"
	"strings"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/api"
	"github.com/plover-run/plover/bundle"
	"github.com/plover-run/plover/errdefs"
	"github.com/plover-run/plover/pipedef"
)

// isPipeline reports whether dir's manifest is a pipeline's.
func isPipeline(dir string) bool {
	m, err := bundle.ReadManifest(dir)
	return err == nil && m.IsPipeline()
}

// pack packs the version folder dir (as name, unless "") in memory,
// reading only regular files within it (bundle.PackWithin); it stops, KindTooLarge, as
// soon as the bundle passes MaxBundleBytes (a model of some GiB is not
// packed whole to be refused then), and before it reads a byte where its
// files are more than a node unpacks (bundle.ErrTooLarge).
func (r *Repository) pack(dir, name string) ([]byte, string, *abi.Manifest, error) {
	buf := &capped{max: r.cfg.MaxBundleBytes}
	m, err := repackWithin(dir, name, buf) // today's rules at the deploy, for bytes the store lacks
	if errors.Is(err, errTooLarge) {
		return nil, "", nil, errdefs.New(errdefs.KindTooLarge, nil, "bundle is larger than %d bytes", buf.max)
	}
	if errors.Is(err, bundle.ErrTooLarge) {
		// Its files' sizes, before any was read (a sparse file packs
		// small, after hours).
		return nil, "", nil, errdefs.New(errdefs.KindTooLarge, nil, "%s", strings.ReplaceAll(err.Error(), dir+string(filepath.Separator), ""))
	}
	if err != nil {
		return nil, "", nil, err
	}
	b := buf.b.Bytes()
	return b, bundle.Digest(b), m, nil
}

// packFailure is why packing the version folder dir (named where in
// messages) failed: over the node's bound (413), a file that cannot be
// read now (EIO, EACCES, ESTALE: tried again, 503), or a bundle refused
// as it is (waiting for the folder to change).
func packFailure(where, dir string, err error) error {
	if errdefs.KindOf(err) == errdefs.KindTooLarge {
		return fmt.Errorf("%s: %w", where, err)
	}
	// Its files named from the folder (where names it): the server's
	// own paths are not the index's readers' to see.
	msg := errors.New(strings.ReplaceAll(err.Error(), dir+string(filepath.Separator), ""))
	var pe *fs.PathError
	var be *bundle.Error
	if errors.As(err, &pe) && !errors.Is(err, fs.ErrNotExist) && !errors.As(err, &be) {
		// The node's failure (503), as a folder that cannot be read is;
		// no cause quoted, which would carry the server's path.
		return errdefs.New(errdefs.KindUnavailable, nil, "%s: tried again at the next scan", unreadableAt(where, dir, err))
	}
	return refused(where, msg)
}

var errTooLarge = errors.New("bundle over the limit")

// repackWithin is bundle.RepackWithin; tests have a file fail to open as
// a volume's may (EACCES, EIO), which root, running them, never sees.
var repackWithin = bundle.RepackWithin

// capped is a buffer that refuses to grow past max bytes (0: no bound).
type capped struct {
	b   bytes.Buffer
	max int64
}

func (c *capped) Write(p []byte) (int, error) {
	if c.max > 0 && int64(c.b.Len())+int64(len(p)) > c.max {
		return 0, errTooLarge
	}
	return c.b.Write(p)
}

// deployVersion deploys one version folder unless rec has it already
// (the same label and bytes: a restart), and returns its version id; on
// a failure, other says whether the folder holds other bytes than its
// label names (its label is to go). The model's folder must still be as
// print, the look that decided the deploy, once the version is packed
// (errChanged).
func (r *Repository) deployVersion(ctx context.Context, m *model, v *version, rec *api.Record, aside bool, print string) (id string, other bool, err error) {
	label, where := v.label, v.where
	name := ""
	if m.renamed {
		name = m.name
	}
	// A version folder still as it was when packed, whose bytes are what
	// its label names, is not packed again: a change to one version of a
	// model (another copied in) packed every version, each followed by a
	// look at the whole model's folder.
	vlook := look(v.dir, false)
	if c, ok := r.packedAs(m, label, vlook); ok {
		if lv, ok := latestLabeled(rec, label); ok && lv.SHA256 == c.sha {
			v.steps = c.steps
			return lv.ID, false, nil
		}
	}
	// Only files within the version folder: a file linked out of it
	// (to the server's own secrets) is refused, and the folder with it.
	b, sha, man, err := r.pack(v.dir, name)
	if !stillAs(m, print) {
		return "", false, errChanged
	}
	if err != nil {
		// Over this node's bound, refused by its rules, or not read: the
		// bytes may still be what the label names (another node sharing
		// the store deployed and serves them by it).
		failed := packFailure(where, v.dir, err)
		if errdefs.KindOf(failed) == errdefs.KindUnavailable {
			// The system's error, its path with it: the reason has
			// neither.
			r.cfg.Log.Warn("model repository: a version folder cannot be read now", "model", m.name, "version", label, "folder", v.dir, "error", err)
		}
		return "", false, failed
	}
	if !m.renamed && man.Name != m.name {
		return "", true, errdefs.New(errdefs.KindInvalid, nil, "%s: %s names %q", where, abi.ManifestFile, man.Name)
	}
	v.steps = abi.Functions(man.Steps)
	r.remember(m, label, packed{print: vlook.print, sha: sha, steps: v.steps})
	// The latest version with the label (what the label names, as
	// Record.Find has it) must be these bytes: a folder changed and then
	// changed back is deployed again.
	if v, ok := latestLabeled(rec, label); ok && v.SHA256 == sha {
		return v.ID, false, nil
	}
	fi, err := r.node.DeployLabeled(ctx, m.name, label, aside, bytes.NewReader(b))
	var ue *pipedef.UsersError
	if errors.As(err, &ue) {
		// The engine's advice (deploy with force) is not the repository's
		// to follow: the pipelines named change first, then a load (or the
		// folder changing) deploys it. Not tried at every scan meanwhile:
		// each try packs and uploads the version again to be refused.
		return "", true, errdefs.New(errdefs.KindConflict, ue, "%s: %v: redeploy or remove the pipelines named first, then load %s again", where, ue, m.name)
	}
	if err != nil {
		// Not the bytes the label names: those returned above.
		return "", true, fmt.Errorf("%s: %w", where, err)
	}
	r.cfg.Log.Info("model repository: deployed", "model", m.name, "version", label, "id", fi.Version)
	return fi.Version, false, nil
}

// packed is a version folder's look when it was packed, and what it
// packed to.
type packed struct {
	print, sha string
	steps      []string
}

// packedAs is what m's version folder label packed to when it looked as
// now does (an unreadable look matches nothing).
func (r *Repository) packedAs(m *model, label string, now folder) (packed, bool) {
	if now.err != nil {
		return packed{}, false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	c, ok := m.packs[label]
	return c, ok && c.print == now.print
}

// remember keeps what m's version folder label packed to, for the next
// deploy (packedAs).
func (r *Repository) remember(m *model, label string, c packed) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if m.packs == nil {
		m.packs = map[string]packed{}
	}
	m.packs[label] = c
}

// forgetPacks drops what m's version folders not among vers packed to.
func (r *Repository) forgetPacks(m *model, vers []version) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for label := range m.packs {
		if !slices.ContainsFunc(vers, func(v version) bool { return v.label == label }) {
			delete(m.packs, label)
		}
	}
}

// latestLabeled is rec's latest version labeled label.
func latestLabeled(rec *api.Record, label string) (api.Version, bool) {
	if rec == nil {
		return api.Version{}, false
	}
	for i := len(rec.Versions) - 1; i >= 0; i-- {
		if rec.Versions[i].Label == label {
			return rec.Versions[i], true
		}
	}
	return api.Version{}, false
}
