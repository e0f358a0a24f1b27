package repository

// What a repository keeps across restarts (Config.StateFile): the models
// unloaded, by the API or plover rm, so that a restart over the same
// folders does not deploy them again behind the operator's back.

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"strings"

	"github.com/plover-run/plover/fileutil"
)

// keptModel is an unloaded model as kept.
type keptModel struct {
	// Print is its folder's fingerprint when it was unloaded: a folder
	// changed since (while the server was down too) ends the unload.
	Print  string `json:"print"`
	Reason string `json:"reason"`
}

// keptFile is Config.StateFile's content.
type keptFile struct {
	// Dir is the repository's directory: another's unloads are not this
	// one's (a server restarted with another --repository).
	Dir      string               `json:"dir"`
	Unloaded map[string]keptModel `json:"unloaded"`
}

// maxKeptBytes bounds the state file read at start: it is the server's
// own, but a file grown wrong would be read whole into memory.
const maxKeptBytes = 16 << 20

// keptDir is DIR as a state file names it.
func keptDir(dir string) string {
	if abs, err := filepath.Abs(dir); err == nil {
		return abs
	}
	return dir
}

// readKept is the models an earlier run left unloaded. A file missing,
// unreadable, torn or another repository's keeps none: every folder
// loads, as at a first start (said in the log), rather than the server
// refusing to start over a file of its own.
func (r *Repository) readKept() map[string]keptModel {
	if r.cfg.StateFile == "" {
		return nil
	}
	b, err := readBounded(r.cfg.StateFile, maxKeptBytes)
	if errors.Is(err, fs.ErrNotExist) {
		return nil // a first start: nothing to say
	}
	var k keptFile
	if err == nil {
		err = json.Unmarshal(b, &k)
	}
	if err != nil {
		r.cfg.Log.Warn("model repository: cannot read the models unloaded before the restart: every folder loads", "file", r.cfg.StateFile, "error", err)
		return nil
	}
	if k.Dir != keptDir(r.cfg.Dir) {
		r.cfg.Log.Info("model repository: the models unloaded before the restart were another repository's: every folder loads", "file", r.cfg.StateFile, "was", k.Dir)
		return nil
	}
	return k.Unloaded
}

// writeAtomic is fileutil.WriteAtomic; tests have it fail after its
// rename landed (the directory's fsync).
var writeAtomic = fileutil.WriteAtomic

// readBounded is path's content, refused past max bytes.
func readBounded(path string, max int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, max+1))
	if err == nil && int64(len(b)) > max {
		err = fmt.Errorf("larger than %d bytes", max)
	}
	return b, err
}

// removeTorn removes the temporary files a write of the state file left
// beside it, cut by a crash (fileutil.WriteAtomic's names).
func (r *Repository) removeTorn() {
	if r.cfg.StateFile == "" {
		return
	}
	dir, base := filepath.Split(r.cfg.StateFile)
	// Not filepath.Glob: a --data path holding [, * or ? is no pattern.
	ents, _ := os.ReadDir(filepath.Clean(dir + "."))
	for _, e := range ents {
		if !strings.HasPrefix(e.Name(), "."+base+".tmp-") {
			continue
		}
		p := filepath.Join(dir, e.Name())
		if err := os.Remove(p); err != nil {
			r.cfg.Log.Debug("model repository: cannot remove a torn write of the state file", "file", p, "error", err)
		}
	}
}

// keptLocked applies what an earlier run kept of m, new in this run: an
// unload stays until a load or a change of the folder. Under r.mu.
func (r *Repository) keptLocked(m *model) {
	k, ok := r.kept[m.name]
	if !ok {
		return
	}
	delete(r.kept, m.name)
	m.unloaded, m.done, m.state, m.reason, m.changing = true, k.Print, Unavailable, brief(k.Reason), false
	m.markSettled()
}

// saveKept writes the unloaded models to Config.StateFile if they changed
// since it was last written; a write that fails is tried again at the
// next call (every scan calls it, and Run, without Poll, calls it alone on
// its back-off while one failed). One writes at a time: a call while
// another writes (its fsyncs on a slow disk) does not wait, the writer
// writing again once done.
func (r *Repository) saveKept() {
	if r.cfg.StateFile == "" {
		return
	}
	r.mu.Lock()
	r.dirty = true
	r.mu.Unlock()
	for r.saving.TryLock() {
		r.writeKept()
		r.saving.Unlock()
		r.mu.Lock()
		again := r.dirty // asked for after the write's last look
		r.mu.Unlock()
		if !again {
			return
		}
	}
}

// writeKept writes the state file while the unloaded models changed
// since its last look; with r.saving held.
func (r *Repository) writeKept() {
	for {
		r.mu.Lock()
		if !r.dirty {
			r.mu.Unlock()
			return
		}
		r.dirty = false
		now := maps.Clone(r.kept) // not looked at yet: before the first scan
		if now == nil {
			now = map[string]keptModel{}
		}
		for name, m := range r.models {
			if m.unloaded {
				now[name] = keptModel{Print: m.done, Reason: m.reason}
			}
		}
		r.mu.Unlock()
		if !r.savedUnknown && maps.Equal(now, r.saved) {
			// The change a failed write missed was undone (an unload,
			// then a load): the file says what is, nothing to try again.
			r.unsaved.Store(false)
			continue
		}
		b, err := json.Marshal(keptFile{Dir: keptDir(r.cfg.Dir), Unloaded: now})
		if err == nil {
			err = writeAtomic(r.cfg.StateFile, b, 0o600)
		}
		if err != nil {
			// A write failed after its rename (the directory's fsync):
			// the file says now, not saved, until a crash: the next
			// write is not skipped for a change undone.
			r.savedUnknown = r.savedUnknown || errors.Is(err, fileutil.ErrNotDurable)
			// Said once until a write succeeds: Run's scans try again,
			// without Poll Run alone after a back-off. Set before the
			// wake: a Run woken that read it unset would go idle, and no
			// later failure would wake it again.
			if !r.unsaved.Swap(true) {
				r.cfg.Log.Warn("model repository: cannot keep the unloaded models for a restart (tried again at the next scans; said again once written)", "file", r.cfg.StateFile, "error", err)
				// An idle Run (no Poll) starts its back-off.
				if r.wake != nil {
					r.wake()
				} else {
					r.wakeSave()
				}
			}
			return
		}
		r.saved, r.savedUnknown = now, false
		r.unsaved.Store(false)
	}
}
