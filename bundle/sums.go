package bundle

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/plover-run/plover/abi"
)

// sumsFile, in an unpacked bundle directory, lists the SHA-256 of each of
// its files as unpacking wrote them, so that a load from the cache can tell
// a file damaged on disk (or by hand) from the bundle in the store.
const sumsFile = ".plover-sha256"

// writeSums records the digest of every regular file in dir and makes the
// files, the list and the directory durable. It returns the stamps of the
// list and the files, as hashed, and keeps them in dir's stampsFile: an
// entry this process has just unpacked and hashed needs no hash at its
// first load from the cache, in this process or after a restart. Each
// file's mtime is set unpackedAge back before it is hashed, and its stamp
// taken then, before the read, so that a write at any time after it (one
// during the hash included) leaves another mtime, whatever the file
// system's clock tick: the stamps are not racy. Where they cannot be set
// or kept, the entry is left without them (nil), and hashed at its first
// load as one from before they were kept.
func writeSums(dir string) (stamps, error) {
	des, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	type listed struct {
		line string
		st   stamp
	}
	var files []listed
	stamped, past := true, time.Now().Add(-unpackedAge)
	for _, de := range des {
		if !de.Type().IsRegular() || de.Name() == sumsFile || de.Name() == stampsFile {
			continue
		}
		p := filepath.Join(dir, de.Name())
		stamped = stamped && os.Chtimes(p, time.Time{}, past) == nil
		sum, st, err := fileSum(p, true)
		if err != nil {
			return nil, err
		}
		files = append(files, listed{sum + "  " + de.Name(), st})
	}
	sort.Slice(files, func(i, j int) bool { return files[i].line < files[j].line })
	lines := make([]string, len(files))
	for i, f := range files {
		lines[i] = f.line
	}
	p := filepath.Join(dir, sumsFile)
	f, err := os.OpenFile(p, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
	if err != nil {
		return nil, err
	}
	_, err = io.WriteString(f, strings.Join(lines, "\n")+"\n")
	if err == nil {
		err = f.Sync()
	}
	var list stamp
	if err == nil {
		stamped = stamped && os.Chtimes(p, time.Time{}, past) == nil
		list, err = stampOf(f, sumsFile)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = syncDir(dir)
	}
	if err != nil || !stamped {
		return nil, err
	}
	ss := stamps{list}
	for _, f := range files {
		ss = append(ss, f.st)
	}
	if ss.write(dir) != nil {
		os.Remove(filepath.Join(dir, stampsFile+".tmp"))
		return nil, nil
	}
	return ss, nil
}

// unpackedAge is how far in the past writeSums sets the mtime of what it
// hashes: settled at once, and a time no later write gives a file, however
// coarse its file system's clock, unless the clock is stepped back by as
// much. Not one fixed time: an entry's files keep an mtime of their own
// unpack, so that a file of another entry copied in with its times (cp -p)
// onto a reused inode number is not taken for the one it replaced.
const unpackedAge = 30 * 24 * time.Hour

// checkSums re-hashes every file writeSums listed; an error says which file
// differs (or that the list is missing: a cache entry from before the lists,
// which is simply fetched again). It returns what it found on disk: each
// file's identity as it was before it was read (stamps.unchanged).
//
// The list must name exactly what the bundle holds: plover.json, and the
// library and constants its manifest names. A list that lost lines would
// otherwise leave a file unchecked, then stamped as checked and loaded:
// with the stamps file gone too, damaged constants passed.
func checkSums(dir string) (stamps, error) {
	f, err := os.Open(filepath.Join(dir, sumsFile))
	if err != nil {
		return nil, fmt.Errorf("no digest list: %w", err)
	}
	defer f.Close()
	list, err := stampOf(f, sumsFile)
	if err != nil {
		return nil, err
	}
	st := stamps{list}
	listed := map[string]bool{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		want, name, ok := sumsLine(sc.Text())
		if !ok || listed[name] {
			return nil, fmt.Errorf("digest list line %q is malformed", sc.Text())
		}
		listed[name] = true
		got, s, err := fileSum(filepath.Join(dir, name), false)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		if got != want {
			return nil, fmt.Errorf("%s hashes to %s, unpacked as %s", name, got, want)
		}
		st = append(st, s)
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(st) == 1 {
		return nil, fmt.Errorf("empty digest list")
	}
	if err := listsBundle(dir, listed); err != nil {
		return nil, err
	}
	return st, nil
}

// listsBundle checks that listed names exactly the files of the bundle
// unpacked in dir: its plover.json (hashed by now, so its names can be
// trusted), the library and the constants.
func listsBundle(dir string, listed map[string]bool) error {
	if !listed[abi.ManifestFile] {
		return fmt.Errorf("digest list does not name %s", abi.ManifestFile)
	}
	m, err := readManifest(files{dir: dir}, abi.ParseStoredManifest)
	if err != nil {
		return err
	}
	want := map[string]string{abi.ManifestFile: "manifest"}
	if m.Library != "" {
		want[m.Library] = "library"
	}
	if m.Constants != "" {
		want[m.Constants] = "constants"
	}
	for name, what := range want {
		if !listed[name] {
			return fmt.Errorf("digest list does not name %s, the bundle's %s", name, what)
		}
	}
	for name := range listed {
		if want[name] == "" {
			return fmt.Errorf("digest list names %s, which the bundle's manifest does not", name)
		}
	}
	return nil
}

// sumsLine reads a digest list's line: a digest, two spaces, a file name
// in the entry itself (writeSums's format).
func sumsLine(line string) (sum, name string, ok bool) {
	sum, name, ok = strings.Cut(line, "  ")
	return sum, name, ok && !strings.ContainsRune(name, '/')
}

// fileSum is a file's SHA-256 and its stamp, taken before it was read;
// sync also makes the file durable.
func fileSum(p string, sync bool) (string, stamp, error) {
	f, err := os.Open(p)
	if err != nil {
		return "", stamp{}, err
	}
	defer f.Close()
	s, err := stampOf(f, filepath.Base(p))
	if err != nil {
		return "", stamp{}, err
	}
	h := sha256.New()
	buf := sumBufs.Get().(*[]byte)
	_, err = io.CopyBuffer(h, struct{ io.Reader }{f}, *buf) // the struct: not File.WriteTo, which brings a buffer of its own
	sumBufs.Put(buf)
	if err != nil {
		return "", stamp{}, err
	}
	if sync {
		if err := f.Sync(); err != nil {
			return "", stamp{}, err
		}
	}
	return hex.EncodeToString(h.Sum(nil)), s, nil
}

// sumBufs: a large bundle is hashed in 1 MiB reads, with no buffer made
// per file.
var sumBufs = sync.Pool{New: func() any { b := make([]byte, 1<<20); return &b }}

// A stamp is what the file system says of a file without reading it: a
// file whose stamp is as it was when its bytes were hashed still holds
// those bytes, unless something rewrote it within the clock's tick of
// the hash and kept its size (see stamps.settled; what writeSums stamps
// has its mtime set in the past first), or wrote it and set its mtime
// back.
//
// Not ctime, though only ctime cannot be set back: every load links the
// cache's library and constants into a worker's stage, and the link and
// its removal move the cached file's ctime (its link count changes), so
// a stamp with ctime would never hold from one load to the next. A write
// moves mtime; setting it back is a deliberate act, which the digest
// list, in the same directory, does not withstand either: the check is
// against damage, not against whoever may write the cache. A file put in
// its place (a restore, a hand with mv) is another inode. Bit rot under
// an unchanged stamp is not seen, as it is not by a read served from the
// page cache either; an entry is hashed again only where its stamps are
// missing or no longer hold.
type stamp struct {
	name     string
	dev, ino uint64
	size     int64
	mtime    int64 // ns
}

func stampOf(f *os.File, name string) (stamp, error) {
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return stamp{}, err
	}
	return stampFrom(name, &st), nil
}

func stampFrom(name string, st *unix.Stat_t) stamp {
	return stamp{name: name, dev: st.Dev, ino: st.Ino, size: st.Size, mtime: st.Mtim.Nano()}
}

// stamps are a verified entry's files (the digest list first).
type stamps []stamp

// unchanged reports whether every file in dir still has its stamp.
func (ss stamps) unchanged(dir string) bool {
	if len(ss) == 0 {
		return false
	}
	var st unix.Stat_t
	for _, s := range ss {
		if unix.Lstat(filepath.Join(dir, s.name), &st) != nil || stampFrom(s.name, &st) != s {
			return false
		}
	}
	return true
}

// settled reports whether every file was last written at least racyWindow
// before now. A file changed within the file system's clock tick of its
// stamp could change again, keeping its size, with no stamp to show it
// (timestamps come from a clock that ticks every few ms): such stamps are
// not trusted, and the entry is hashed again next time, as git treats a
// file as racy when it is as new as its index.
func (ss stamps) settled(now time.Time) bool {
	for _, s := range ss {
		if now.UnixNano()-s.mtime < int64(racyWindow) {
			return false
		}
	}
	return true
}

// stampsFile, in a cache entry, keeps the stamps of its files as a
// process unpacked them (writeSums), or last hashed them and found them
// right, once they had settled:
// a restarted server trusts them as the process that wrote them did, so
// a restart is not a re-read of every model's weights. Missing, torn or
// not matching the files: the entry is hashed at its next load, as
// before there was a file. Not synced: losing it costs a hash.
const stampsFile = ".plover-stamps"

// write keeps ss in dir's stampsFile (replaced whole, by a rename).
func (ss stamps) write(dir string) error {
	var b strings.Builder
	for _, s := range ss {
		fmt.Fprintf(&b, "%d %d %d %d %s\n", s.dev, s.ino, s.size, s.mtime, s.name)
	}
	tmp := filepath.Join(dir, stampsFile+".tmp")
	if err := os.WriteFile(tmp, []byte(b.String()), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, filepath.Join(dir, stampsFile))
}

// readStamps reads the stamps dir's stampsFile keeps (nil if it has
// none it can read: the entry is then hashed). The digest list comes
// first, as in the stamps checkSums returns.
func readStamps(dir string) stamps {
	b, err := os.ReadFile(filepath.Join(dir, stampsFile))
	if err != nil || len(b) > 64<<10 {
		return nil
	}
	var ss stamps
	for _, line := range strings.Split(strings.TrimSuffix(string(b), "\n"), "\n") {
		f := strings.SplitN(line, " ", 5)
		if len(f) != 5 || f[4] == "" || strings.ContainsRune(f[4], '/') {
			return nil
		}
		s := stamp{name: f[4]}
		var err [4]error
		s.dev, err[0] = strconv.ParseUint(f[0], 10, 64)
		s.ino, err[1] = strconv.ParseUint(f[1], 10, 64)
		s.size, err[2] = strconv.ParseInt(f[2], 10, 64)
		s.mtime, err[3] = strconv.ParseInt(f[3], 10, 64)
		if err != [4]error{} {
			return nil
		}
		ss = append(ss, s)
	}
	if len(ss) < 2 || ss[0].name != sumsFile {
		return nil
	}
	return ss
}

// coverSums reports whether ss stamp exactly the digest list of dir and
// the files it lists: a stamps file that lost lines (torn at a line's
// end), or kept from other files, must not leave a file unchecked.
func (ss stamps) coverSums(dir string) bool {
	if len(ss) == 0 {
		return false
	}
	b, err := os.ReadFile(filepath.Join(dir, sumsFile))
	if err != nil {
		return false
	}
	listed := strings.Split(strings.TrimSuffix(string(b), "\n"), "\n")
	if len(listed) != len(ss)-1 {
		return false
	}
	for i, line := range listed {
		if _, name, ok := sumsLine(line); !ok || name != ss[i+1].name {
			return false
		}
	}
	return true
}

// racyWindow is far beyond any file system's timestamp granularity (ext4
// and tmpfs: a jiffy; FAT: 2 s).
const racyWindow = 3 * time.Second

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
