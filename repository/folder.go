package repository

// Folders as a scan finds them: listing the repository, following links,
// and the fingerprints that tell a folder still being copied from one
// that settled.

import (
	"cmp"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/bundle"
)

// folder is a model folder as a scan found it.
type folder struct {
	dir     string
	renamed bool
	// print: a hash of its files' names, sizes and modification times,
	// ":", one of their status change times (contentOf).
	print  string
	stamps hash.Hash // status change times, while look walks
	newest time.Time // the latest change in it (changedAt)
	err    error     // could not be read
	// unreadable: err is not a file going while it was read (a copy or a
	// removal in progress) but stays until the folder changes (a folder
	// the server may not read, a volume's I/O error).
	unreadable bool
	// standIn: DIR as one bundle whose manifest is being rewritten or
	// names another function (listSingle); err says so until a scan
	// finds DIR settled. Not a copy a load waits for.
	standIn bool
	// why is err as the index shows it, found with the listing (it may
	// follow links: never under r.mu): an unreadable folder's reason
	// (unreadableAt), else err's text with no path of the server's.
	why string
	// versions: the folder holds version folders (no manifest at its
	// top), and only they, and a manifest appearing there, are what it is
	// (walk).
	versions bool
}

// list finds the repository's model folders: DIR itself when it is one
// bundle, else its subdirectories (not hidden ones). Called with the turn.
// wait: a manifest at DIR's top may make DIR one bundle once DIR
// settles (becomesSingle): the scans go on meanwhile.
func (r *Repository) list() (found map[string]folder, wait bool, err error) {
	out, whole, wait := r.listSingle(true)
	if whole {
		return out, false, nil
	}
	ents, err := os.ReadDir(r.cfg.Dir)
	if err != nil {
		return nil, false, err
	}
	for _, e := range ents {
		if f, ok := r.entry(e); ok {
			out[e.Name()] = f
		}
	}
	return out, wait, nil
}

// listOne is list for the model folder name alone (a load's): the other
// folders are not looked at, so that a load's cost does not grow with the
// repository, nor wait on a folder a volume stalls. ok is false when name
// is no model folder of the repository. Called with the turn.
func (r *Repository) listOne(name string) (f folder, ok bool, err error) {
	if out, whole, _ := r.listSingle(false); whole {
		f, ok = out[name]
		return f, ok, nil
	}
	// What ReadDir could list in DIR: one name, no path (a name with a
	// slash, or .., would reach past DIR). A name too long for a file,
	// or holding a NUL, is in no folder: Lstat's EINVAL or ENAMETOOLONG
	// would be taken for DIR unreadable.
	if name == "" || name == "." || name == ".." || len(name) > 255 || strings.ContainsAny(name, "/\x00") {
		return folder{}, false, nil
	}
	fi, err := os.Lstat(filepath.Join(r.cfg.Dir, name))
	if errors.Is(err, fs.ErrNotExist) {
		// No such model, unless DIR itself is gone (a volume unmounted, a
		// link being swapped): the node's failure, as the index says, not
		// a 404 a client takes for final.
		if _, derr := os.Stat(r.cfg.Dir); derr != nil {
			return folder{}, false, derr
		}
		return folder{}, false, nil
	}
	if err != nil {
		return folder{}, false, err
	}
	f, ok = r.entry(fs.FileInfoToDirEntry(fi))
	return f, ok, nil
}

// listSingle is list while DIR is one bundle: its one model folder, and
// whole true; else an empty map to fill from DIR's entries. Only a scan
// (switch) turns model folders into one bundle (becomesSingle); wait
// says it may once DIR settles.
func (r *Repository) listSingle(switch_ bool) (out map[string]folder, whole, wait bool) {
	out = map[string]folder{}
	if switch_ {
		r.topRetry = false // becomesSingle says again
	}
	_, absent := os.Stat(filepath.Join(r.cfg.Dir, abi.ManifestFile))
	if r.single == "" && absent == nil {
		if !switch_ {
			return out, false, false
		}
		if ok, wait := r.becomesSingle(); !ok {
			return out, false, wait
		}
	}
	if r.single == "" && absent != nil {
		r.topSeen, r.topWarned = "", false
	}
	if absent == nil || r.single != "" {
		f := r.reasoned(look(r.cfg.Dir, r.cfg.Name != ""))
		// --repository-name, else the manifest's name; while it does
		// not parse (being copied), the name served so far, or at first
		// the directory's, under which its reason shows.
		name, why := r.cfg.Name, ""
		if absent != nil {
			why = abi.ManifestFile + " is absent"
		} else if man, err := bundle.ReadManifest(r.cfg.Dir); err != nil {
			why = r.quiet(err) // the index's readers see no server path
			if name == "" {
				name = cmp.Or(r.single, r.top)
			}
		} else if name == "" {
			name = man.Name
		}
		if r.single != "" && (name != r.single || why != "") && !r.still(f) {
			// A manifest rewritten in place, absent a moment or naming
			// another function: the function keeps its name, LOADING,
			// until DIR settles so (a rename, then, deletes it).
			if why == "" {
				why = fmt.Sprintf("%s now names %q", abi.ManifestFile, name)
			}
			if f.err == nil {
				f.err = fmt.Errorf("%s: waiting for it to settle", why)
				f.why, f.standIn = f.err.Error(), true
			}
			out[r.single] = f
			return out, true, false
		}
		if absent == nil {
			r.single = name
			out[name] = f
			return out, true, false
		}
		r.single = "" // the manifest went for good: DIR holds model folders
	}
	return out, false, false
}

// becomesSingle reports whether DIR, served as model folders, is now one
// bundle (a manifest at its top, found by a scan): only while no folder
// in it is a model's, and, once the scans have found models in it (a
// copy's first folders, build/), only when that manifest parses and DIR
// has not changed for the settle time. A plover.json dropped at the top
// of a repository of models (a stray cp) is left alone, said in the log:
// taken for one bundle, every model's function would go. wait: DIR may
// yet become one (still settling). Called with the turn.
func (r *Repository) becomesSingle() (ok, wait bool) {
	if models := r.modelFolders(); len(models) > 0 {
		if !r.topWarned {
			r.topWarned = true
			r.cfg.Log.Warn("model repository: a "+abi.ManifestFile+" at its top is left alone: it holds model folders, and is served as such (remove the file, or the folders, to serve it as one bundle)",
				"dir", r.cfg.Dir, "model_folders", models)
		}
		r.topSeen = ""
		return false, false
	}
	r.topWarned = false
	r.mu.Lock()
	known := len(r.models)
	r.mu.Unlock()
	if known == 0 && r.scans == 0 {
		// The first scan (a start: a volume being filled):
		// DIR's function shows LOADING while its manifest is written.
		return true, false
	}
	f := look(r.cfg.Dir, false)
	now := time.Now()
	if f.print != r.topSeen {
		r.topSeen, r.topSeenAt = f.print, now
		return false, true
	}
	if f.err != nil || now.Sub(f.stillSince(r.topSeenAt)) < r.cfg.Settle {
		return false, true
	}
	if _, err := bundle.ReadManifest(r.cfg.Dir); err != nil {
		// Settled and still no manifest: a stray, broken file, or a
		// copy that paused longer than Settle. Scanned again on the
		// retries' back-off (up to a minute), not every Settle for
		// good, and said once for DIR as it is.
		if r.topBad != f.print {
			r.topBad = f.print
			r.cfg.Log.Warn("model repository: the "+abi.ManifestFile+" at its top does not parse: it is served as model folders until it does (looked at again up to a minute apart)",
				"dir", r.cfg.Dir, "error", err)
		}
		r.topRetry = true
		return false, false
	}
	r.topSeen = ""
	r.switching = true
	return true, false
}

// modelFolders names DIR's folders that are models' (a manifest at their
// top or in a version folder) or may be (one that cannot be read now).
func (r *Repository) modelFolders() []string {
	ents, err := os.ReadDir(r.cfg.Dir)
	if err != nil {
		return []string{"(" + r.quiet(err) + ")"}
	}
	var out []string
	for _, e := range ents {
		// Not entry: each folder would be walked whole, only to be
		// walked again by the listing after it.
		if ok, _ := candidate(r.cfg.Dir, e); !ok {
			continue
		}
		if isModel(filepath.Join(r.cfg.Dir, e.Name())) {
			out = append(out, e.Name())
		}
	}
	return out
}

// isModel reports whether dir holds a bundle at its top or in a version
// folder, or cannot be read (it may).
func isModel(dir string) bool {
	has := func(d string) bool {
		_, err := os.Stat(filepath.Join(d, abi.ManifestFile))
		return err == nil || !leadsNowhere(err)
	}
	if has(dir) {
		return true
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return !leadsNowhere(err)
	}
	return slices.ContainsFunc(ents, func(e fs.DirEntry) bool { return isVersion(e.Name()) && has(filepath.Join(dir, e.Name())) })
}

// entry is the model folder e of DIR, looked at, or ok false for an entry
// that is none.
func (r *Repository) entry(e fs.DirEntry) (f folder, ok bool) {
	ok, err := candidate(r.cfg.Dir, e)
	if !ok {
		return folder{}, false
	}
	p := filepath.Join(r.cfg.Dir, e.Name())
	if err != nil {
		return r.reasoned(lookLink(p, err)), true
	}
	return r.reasoned(look(p, false)), true
}

// candidate reports whether e, in parent, may be a model folder, without
// looking into it: a directory, or a link to one, or a link with a
// function's name whose target cannot be stat'd now (err).
func candidate(parent string, e fs.DirEntry) (ok bool, err error) {
	if e.Name()[0] == '.' || e.Name() == "lost+found" {
		// Hidden scratch space, and the file system's own folder at a
		// volume's root (ext4's, root's and unreadable to the server;
		// never a function's name).
		return false, nil
	}
	switch dir, err := isDir(parent, e); {
	case err != nil && !abi.ValidName(e.Name()):
		// A link that may lead to a file beside the models (notes.txt)
		// and could name no function: left alone, as such a file is.
	case err != nil:
		return true, err
	case dir: // not files beside models (a README)
		return true, nil
	}
	return false, nil
}

// reasoned is f with why set.
func (r *Repository) reasoned(f folder) folder {
	switch {
	case f.unreadable:
		f.why = unreadableAt(r.where(f.dir), f.dir, f.err)
	case f.err != nil:
		// Walked where its links lead (cnn -> /srv/releases/cnn-v7).
		f.why = r.quiet(errors.New(strings.ReplaceAll(f.err.Error(), resolved(f.dir), r.where(f.dir))))
	}
	return f
}

// still reports whether DIR, as one bundle, is as the last scan saw it
// and none of its files changed within Settle.
func (r *Repository) still(f folder) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	m := r.models[r.single]
	return f.err == nil && m != nil && m.seen == f.print && time.Since(f.stillSince(m.seenAt)) >= r.cfg.Settle
}

// stillSince is when f's files last changed: its newest change, or, for one later than seenAt, when the scans first saw f as it
// is (a time ahead of the clock, an archive unpacked with the times of a
// machine whose clock ran ahead, says nothing of when the copy ended, and
// would keep the folder LOADING until the clock got there).
func (f folder) stillSince(seenAt time.Time) time.Time {
	if f.newest.After(seenAt) {
		return seenAt
	}
	return f.newest
}

// stat is os.Stat, where a link is followed to its folder; tests have a
// target fail as a volume's may (EACCES, EIO, ESTALE).
var stat = os.Stat

// isDir reports whether e, in parent, is a directory or a link to one (a
// folder swapped by its link, a Kubernetes volume's entries); err is a
// link whose target cannot be stat'd now but may be there (EACCES, EIO,
// ESTALE): taken for gone, its folder's function would be deleted.
func isDir(parent string, e fs.DirEntry) (bool, error) {
	if e.Type()&fs.ModeSymlink == 0 {
		return e.IsDir(), nil
	}
	fi, err := stat(filepath.Join(parent, e.Name()))
	if err != nil && !leadsNowhere(err) {
		return false, err
	}
	return err == nil && fi.IsDir(), nil
}

// leadsNowhere reports whether a link's stat error says its target is not
// there (dangling, through a file, a loop of links: an operator's link
// to nothing, as a removed folder is), not that it cannot be read now.
func leadsNowhere(err error) bool {
	return errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR) || errors.Is(err, syscall.ELOOP)
}

// lookLink is a model folder that is a link whose target cannot be
// stat'd (err): unreadable, fingerprinted by where it points and the
// error, so that it is UNAVAILABLE once it looked so for the settle time.
func lookLink(dir string, err error) folder {
	f := folder{dir: dir, err: err, unreadable: true}
	h := sha256.New()
	target, _ := os.Readlink(dir)
	io.WriteString(h, target+"\x00"+err.Error())
	if fi, lerr := os.Lstat(dir); lerr == nil {
		f.newest = changedAt(fi)
	}
	f.print = fmt.Sprintf("%x", h.Sum(nil))
	return f
}

// changedAt is when fi's file last changed: the later of its modification
// time and its status change time. A copy that keeps its source's times
// (cp -a, rsync -a, tar x) writes old modification times, but writing
// them sets the status change time, which no call sets back: such a copy
// looks as recent as it is, to a load or the first scan at start as to
// the scans after it.
func changedAt(fi fs.FileInfo) time.Time {
	t := fi.ModTime()
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && statusTimes {
		if c := time.Unix(st.Ctim.Unix()); c.After(t) {
			return c
		}
	}
	return t
}

// statusTimes is whether changedAt reads status change times. This
// package's tests age folders with os.Chtimes, which sets them to now,
// and turn it off; TestACopyKeepingItsTimesIsNotSettled turns it on.
var statusTimes = true

// resolved is dir with its links followed (dir when they cannot be): a
// walk does not enter a link it starts at.
func resolved(dir string) string {
	if r, err := filepath.EvalSymlinks(dir); err == nil {
		return r
	}
	return dir
}

// look fingerprints a folder: every file's and directory's name, size and
// modification time, and apart (stamps) their status change times, and
// the newest of those times. A linked version folder (cnn/2 ->
// releases/v2) is looked into: a file rewritten in place in it changes
// neither the link nor its directory.
func look(dir string, renamed bool) folder {
	f := folder{dir: dir, renamed: renamed}
	h := sha256.New()
	f.stamps = sha256.New()
	// A folder may be a link swapped to a new copy at once (cnn ->
	// cnn-v7): what it points at is part of what it is.
	root := resolved(dir)
	io.WriteString(h, root)
	_, err := os.Stat(filepath.Join(root, abi.ManifestFile))
	f.versions = errors.Is(err, fs.ErrNotExist)
	f.err = f.walk(h, root, "", true)
	f.print = fmt.Sprintf("%x:%x", h.Sum(nil), f.stamps.Sum(nil))
	f.stamps = nil
	f.unreadable = f.err != nil && !errors.Is(f.err, fs.ErrNotExist) && !errors.Is(f.err, syscall.ENOTDIR)
	return f
}

// contentOf is the part of a folder's print that its files' names, sizes
// and modification times make (a print written before status change
// times were read is that alone): an unload ends when it changes, not
// with a chmod, a chown or a hard link (a kubelet's fsGroup chown at each
// pod start), nor with an upgrade that began reading those times.
func contentOf(print string) string {
	content, _, _ := strings.Cut(print, ":")
	return content
}

// walk hashes root's tree into h, each name as prefix/rel, and its
// entries' status change times into f.stamps; with follow, a version
// folder (a number just under root) that is a link to a directory is
// walked too. Other links are only stat'd: a link deeper in (data -> /)
// is no version folder and walks nothing, and no loop of links walks
// forever.
func (f *folder) walk(h io.Writer, root, prefix string, follow bool) error {
	var b [16]byte
	return filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		if d.IsDir() && volumesOwn(rel, f.versions && follow) {
			return fs.SkipDir
		}
		if f.versions && follow && rel != "." && !strings.ContainsRune(rel, filepath.Separator) && !isVersion(rel) && rel != abi.ManifestFile {
			// Beside the version folders, no bundle's (a log, .git,
			// Triton's config.pbtxt): left alone, as README says, and a
			// write there neither repacks the versions nor ends an unload.
			if d.IsDir() {
				return fs.SkipDir
			}
			return nil
		}
		io.WriteString(h, filepath.Join(prefix, rel))
		if f.versions && follow && rel == "." {
			// Its own size and time change with any entry beside the
			// versions; theirs are their folders'.
			return nil
		}
		if d.Type()&fs.ModeSymlink != 0 {
			// A linked version folder or file: where it points, and
			// what it points at (a linked file rewritten is a change).
			target, _ := os.Readlink(p)
			io.WriteString(h, target)
			st, err := stat(p)
			if err == nil {
				fi = st
				if follow && st.IsDir() && isVersion(rel) {
					if err := f.walk(h, resolved(p), filepath.Join(prefix, rel), false); err != nil {
						return err
					}
				}
			} else if follow && isVersion(rel) && !leadsNowhere(err) {
				// A version folder that cannot be read now: the model's
				// folder is unreadable, not short of a version.
				return err
			}
		}
		binary.LittleEndian.PutUint64(b[:8], uint64(fi.Size()))
		binary.LittleEndian.PutUint64(b[8:], uint64(fi.ModTime().UnixNano()))
		h.Write(b[:])
		if st, ok := fi.Sys().(*syscall.Stat_t); ok && statusTimes && f.stamps != nil {
			// A file rewritten in place with its size and its old time
			// (tar with SOURCE_DATE_EPOCH, cp -p of a reproducible
			// build's tree) moves its status change time alone: without
			// it the running server kept the old bytes, a restart
			// packed the new. (Not the inode: FUSE and overlayfs
			// renumber some as their caches evict them.)
			binary.LittleEndian.PutUint64(b[:8], uint64(time.Unix(st.Ctim.Unix()).UnixNano()))
			f.stamps.Write(b[:8])
		}
		if c := changedAt(fi); c.After(f.newest) {
			f.newest = c
		}
		return nil
	})
}

// volumesOwn reports whether rel, a directory under a walk's root, is a
// file system's own lost+found at a volume's root (ext4's, root's and
// unreadable to the server: the folder walked into it was UNAVAILABLE for
// good): the walk's root, or with versions a version folder, may be a
// volume's (KServe's /mnt/models, a claim; cnn/1 mounted or linked).
func volumesOwn(rel string, versions bool) bool {
	dir, base := filepath.Split(rel)
	if base != "lost+found" {
		return false
	}
	dir = strings.TrimSuffix(dir, string(filepath.Separator))
	return dir == "" || versions && isVersion(dir)
}

// isVersion reports whether name is a version folder's: a number, as
// versionsOf lists them.
func isVersion(name string) bool {
	n, err := strconv.ParseUint(name, 10, 63)
	return err == nil && strconv.FormatUint(n, 10) == name
}

type settleResult int

const (
	unchanged     settleResult = iota // as last deployed, or unloaded and untouched
	stillChanging                     // LOADING until it is still
	unreadable                        // made UNAVAILABLE, unreadable, now: to be logged
	changed                           // settled and different: deploy it
)

// unreadableAt is why the folder dir, named where in messages
// ("models/cnn"), or an entry in it cannot be read, as an index shows it
// and a load answers it (503: the node's volume or permissions, not the
// client's request): the entry within the folder that failed and the
// errno, "models/cnn/1/b.bin: unreadable (permission denied)". The
// server's paths (DIR, where a link leads) are the log's alone.
func unreadableAt(where, dir string, err error) string {
	// Where a link leads first: it may begin with dir's path.
	why := strings.ReplaceAll(err.Error(), resolved(dir), where)
	why = strings.ReplaceAll(why, dir, where)
	var pe *fs.PathError
	var errno syscall.Errno
	switch {
	case errors.As(err, &pe):
		why = pe.Err.Error()
		if rel, ok := inside(dir, pe.Path); ok {
			where += "/" + rel
		}
	case errors.As(err, &errno):
		why = errno.Error()
	}
	return where + ": unreadable (" + why + ")"
}

// inside is p relative to the folder dir (or to where its links lead),
// when it is within it and not dir itself: a file packed through an
// os.Root is named relative to its version folder already.
func inside(dir, p string) (string, bool) {
	if !filepath.IsAbs(p) {
		return filepath.ToSlash(p), filepath.IsLocal(p)
	}
	for _, root := range []string{dir, resolved(dir)} {
		if rel, err := filepath.Rel(root, p); err == nil && rel != "." && filepath.IsLocal(rel) {
			return filepath.ToSlash(rel), true
		}
	}
	return "", false
}
