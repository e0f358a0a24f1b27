// Package bundle packs a function directory (plover.json, library, constants)
// into one content-addressed object, a zstd-compressed tar, and unpacks such
// objects defensively: bundles come from users and from shared storage.
package bundle

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/klauspost/compress/zstd"
	"golang.org/x/sys/unix"

	"github.com/plover-run/plover/abi"
)

// MediaType is the content type of a packed bundle.
const MediaType = "application/vnd.plover.bundle+zstd"

// DefaultMaxUnpacked bounds the unpacked size of one bundle: manifest maxima
// are 1 GiB per buffer and constants rarely exceed a few GiB.
const DefaultMaxUnpacked int64 = 4 << 30

// ErrTooLarge is a bundle whose files are more than DefaultMaxUnpacked
// bytes, refused before they are read.
var ErrTooLarge = errors.New("bundle too large")

// Error says why a bundle was refused.
type Error struct{ Reason string }

func (e *Error) Error() string { return "bundle: " + e.Reason }

func refuse(format string, a ...any) error { return &Error{Reason: fmt.Sprintf(format, a...)} }

var shaRE = regexp.MustCompile(`^[0-9a-f]{64}$`)

// ValidDigest reports whether s is a lowercase hex sha256.
func ValidDigest(s string) bool { return shaRE.MatchString(s) }

// ObjectKey is where a bundle with this sha256 lives in a store.
func ObjectKey(sha string) string { return "bundles/" + sha + ".tar.zst" }

// Digest is the hex sha256 of b.
func Digest(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// ReadManifest reads and validates dir/plover.json, a manifest being
// admitted (abi.ParseManifest).
func ReadManifest(dir string) (*abi.Manifest, error) {
	return readManifest(files{dir: dir}, abi.ParseManifest)
}

// parser is abi.ParseManifest, for a manifest being admitted, or
// abi.ParseStoredManifest, for one a server took before.
type parser func(io.Reader) (*abi.Manifest, error)

func readManifest(d files, parse parser) (*abi.Manifest, error) {
	f, err := d.open(abi.ManifestFile)
	if err != nil {
		return nil, fmt.Errorf("manifest: %w", err)
	}
	defer f.Close()
	path := filepath.Join(d.dir, abi.ManifestFile)
	m, err := parse(f)
	if err != nil {
		// Name the file once: a FieldError about the whole file says
		// "plover.json: ..." itself.
		var fe *abi.FieldError
		if errors.As(err, &fe) && fe.Field == abi.ManifestFile {
			return nil, fmt.Errorf("%s: %s", path, fe.Reason)
		}
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return m, nil
}

// files opens a bundle directory's files: following links anywhere, or,
// with root, only to files within the directory.
type files struct {
	dir  string
	root *os.Root
}

// open opens name for reading, refusing anything but a regular file (or
// a link to one). It opens without blocking and asks the open file what
// it is: a FIFO's open would wait for a writer, and a device may read
// without end, in a directory others write (a model repository).
func (d files) open(name string) (*os.File, error) {
	path := filepath.Join(d.dir, name)
	const flags = os.O_RDONLY | syscall.O_NONBLOCK
	// Looked at before it is opened: a device's open runs its driver, a
	// socket's fails as if the disk had (ENXIO). Checked again once open,
	// for a file replaced between the two.
	var fi fs.FileInfo
	var err error
	if d.root == nil {
		fi, err = os.Stat(path)
	} else {
		fi, err = d.root.Stat(name)
	}
	if err == nil && !fi.Mode().IsRegular() {
		return nil, refuse("%s is %s, not a regular file", path, fileKind(fi.Mode()))
	}
	var f *os.File
	if d.root == nil {
		f, err = os.OpenFile(path, flags, 0)
	} else if f, err = d.root.OpenFile(name, flags, 0); err != nil {
		if fi, lerr := os.Lstat(path); lerr == nil && fi.Mode()&os.ModeSymlink != 0 {
			return nil, refuse("%s is a link that resolves outside its directory (or does not resolve): only files within the bundle's directory are packed", path)
		}
	}
	if err != nil {
		return nil, err
	}
	fi, err = f.Stat()
	if err == nil && !fi.Mode().IsRegular() {
		err = refuse("%s is %s, not a regular file", path, fileKind(fi.Mode()))
	}
	if err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

// fileKind names a mode's file type for a message.
func fileKind(m fs.FileMode) string {
	switch {
	case m&fs.ModeNamedPipe != 0:
		return "a named pipe (FIFO)"
	case m&fs.ModeSocket != 0:
		return "a socket"
	case m&fs.ModeDevice != 0:
		return "a device"
	case m.IsDir():
		return "a directory"
	}
	return "a special file (" + m.Type().String() + ")"
}

// Pack writes the bundle for dir to w: plover.json first, then the library,
// then the constants, with fixed metadata so equal inputs give equal bytes
// (and so the same sha256).
func Pack(dir string, w io.Writer) (*abi.Manifest, error) { return PackNamed(dir, "", w) }

// PackNamed is Pack with the manifest's name set to name (unless "" or
// already its name): a model repository served under a name its manifest
// does not carry (plover serve --repository-name, KServe's model name). The
// manifest's other fields are kept as written.
func PackNamed(dir, name string, w io.Writer) (*abi.Manifest, error) {
	return pack(files{dir: dir}, name, w, abi.ParseManifest)
}

// PackWithin is PackNamed reading only files within dir: a file that is a
// link resolving outside dir is refused (a model repository's version
// folder, written by others than the server).
func PackWithin(dir, name string, w io.Writer) (*abi.Manifest, error) {
	return packWithin(dir, name, w, abi.ParseManifest)
}

// RepackWithin is PackWithin reading the manifest as a stored one
// (abi.ParseStoredManifest): a model repository's folder that a server may
// have taken under older rules packs to the bytes it took, so that a
// version the store holds is known as such; bytes the store lacks are
// held to today's rules by their deploy.
func RepackWithin(dir, name string, w io.Writer) (*abi.Manifest, error) {
	return packWithin(dir, name, w, abi.ParseStoredManifest)
}

func packWithin(dir, name string, w io.Writer, parse parser) (*abi.Manifest, error) {
	root, err := os.OpenRoot(dir)
	if err != nil {
		return nil, fmt.Errorf("pack: %w", err)
	}
	defer root.Close()
	return pack(files{dir: dir, root: root}, name, w, parse)
}

func pack(d files, name string, w io.Writer, parse parser) (*abi.Manifest, error) {
	m, err := readManifest(d, parse)
	if err != nil {
		return nil, err
	}
	var renamed []byte
	if name != "" && name != m.Name {
		if renamed, m, err = rename(d, name, parse); err != nil {
			return nil, err
		}
	}
	names := []string{abi.ManifestFile}
	if m.Library != "" { // a pipeline's bundle is its plover.json alone
		names = append(names, m.Library)
	}
	if m.Constants != "" {
		names = append(names, m.Constants)
	}
	// Every file opened and its size known before a byte is packed: a
	// sparse or zero-filled file of a TiB compresses to under any bound
	// on the bundle, and took hours to pack, to be refused by the node.
	srcs := make([]*os.File, len(names))
	sizes := make([]int64, len(names))
	var total int64
	for i, name := range names {
		if name == abi.ManifestFile && renamed != nil {
			total += int64(len(renamed))
			continue
		}
		f, err := d.open(name)
		if err != nil {
			return nil, fmt.Errorf("pack: %w", err)
		}
		defer f.Close()
		fi, err := f.Stat()
		if err != nil {
			return nil, fmt.Errorf("pack: %w", err)
		}
		srcs[i], sizes[i], total = f, fi.Size(), total+fi.Size()
	}
	if total > DefaultMaxUnpacked {
		return nil, fmt.Errorf("%w: %s are %d bytes, over the %d a node unpacks", ErrTooLarge, strings.Join(names, ", "), total, DefaultMaxUnpacked)
	}
	zw, err := zstd.NewWriter(w, zstd.WithEncoderLevel(zstd.SpeedDefault))
	if err != nil {
		return nil, fmt.Errorf("pack: %w", err)
	}
	tw := tar.NewWriter(zw)
	for i, name := range names {
		var err error
		if srcs[i] == nil {
			err = addBytes(tw, name, renamed)
		} else {
			err = addFile(tw, name, srcs[i], sizes[i])
		}
		if err != nil {
			zw.Close()
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		zw.Close()
		return nil, fmt.Errorf("pack: %w", err)
	}
	if err := zw.Close(); err != nil {
		return nil, fmt.Errorf("pack: %w", err)
	}
	return m, nil
}

// rename is dir's manifest with its name set to name: the bytes to pack and
// the manifest they parse to.
func rename(d files, name string, parse parser) ([]byte, *abi.Manifest, error) {
	path := filepath.Join(d.dir, abi.ManifestFile)
	f, err := d.open(abi.ManifestFile)
	if err != nil {
		return nil, nil, fmt.Errorf("manifest: %w", err)
	}
	// Bounded as a parse is: the file may have been swapped since the
	// parse that read it (a model repository others write).
	raw, err := io.ReadAll(io.LimitReader(f, abi.MaxManifestBytes+1))
	f.Close()
	if err != nil {
		return nil, nil, fmt.Errorf("manifest: %w", err)
	}
	if len(raw) > abi.MaxManifestBytes {
		return nil, nil, refuse("%s is larger than %d bytes", path, abi.MaxManifestBytes)
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(raw, &fields); err != nil {
		return nil, nil, fmt.Errorf("%s: %w", path, err)
	}
	fields["name"], _ = json.Marshal(name)
	b, err := json.MarshalIndent(fields, "", "  ")
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", path, err)
	}
	m, err := parse(bytes.NewReader(b))
	if err != nil {
		return nil, nil, fmt.Errorf("%s named %q: %w", path, name, err)
	}
	return b, m, nil
}

// fixedHeader is a packed file's header: the same metadata whatever the
// file's own, so that equal contents pack to equal bytes.
func fixedHeader(name string, size int64) *tar.Header {
	return &tar.Header{Name: name, Mode: 0o644, Size: size, ModTime: time.Unix(0, 0), Typeflag: tar.TypeReg, Format: tar.FormatPAX}
}

// addBytes adds b as the file name, with Pack's fixed metadata.
func addBytes(tw *tar.Writer, name string, b []byte) error {
	if err := tw.WriteHeader(fixedHeader(name, int64(len(b)))); err != nil {
		return fmt.Errorf("pack %s: %w", name, err)
	}
	if _, err := tw.Write(b); err != nil {
		return fmt.Errorf("pack %s: %w", name, err)
	}
	return nil
}

// addFile adds size bytes of f, opened as name, with Pack's fixed
// metadata: what it had when the bundle's size was checked, all it packs
// of a file that grows meanwhile.
func addFile(tw *tar.Writer, name string, f *os.File, size int64) error {
	if err := tw.WriteHeader(fixedHeader(name, size)); err != nil {
		return fmt.Errorf("pack %s: %w", name, err)
	}
	if _, err := io.CopyN(tw, f, size); err != nil {
		return fmt.Errorf("pack %s (changed while packed?): %w", name, err)
	}
	return nil
}

// PackBytes packs dir in memory and returns the bundle and its sha256.
func PackBytes(dir string) ([]byte, string, *abi.Manifest, error) { return PackBytesNamed(dir, "") }

// PackBytesNamed is PackBytes under name (PackNamed).
func PackBytesNamed(dir, name string) ([]byte, string, *abi.Manifest, error) {
	return packBytes(dir, name, PackNamed)
}

// PackBytesWithin is PackBytesNamed reading only files within dir
// (PackWithin).
func PackBytesWithin(dir, name string) ([]byte, string, *abi.Manifest, error) {
	return packBytes(dir, name, PackWithin)
}

func packBytes(dir, name string, packer func(string, string, io.Writer) (*abi.Manifest, error)) ([]byte, string, *abi.Manifest, error) {
	var buf bytes.Buffer
	m, err := packer(dir, name, &buf)
	if err != nil {
		return nil, "", nil, err
	}
	return buf.Bytes(), Digest(buf.Bytes()), m, nil
}

// Unpack extracts a bundle into dst, which must be an empty directory. It
// accepts only regular files with plain names: plover.json first, then the
// library and the constants the manifest names, each once. Links,
// directories, absolute or ".." paths and any other name are refused, and so
// is a bundle over maxUnpacked bytes. Its manifest is one being admitted
// (abi.ParseManifest).
func Unpack(r io.Reader, dst string, maxUnpacked int64) (*abi.Manifest, error) {
	return unpack(r, dst, maxUnpacked, nil, abi.ParseManifest, nil)
}

// unpack is Unpack with each file write first put to fault (nil: none),
// the manifest read by parse and then put to check (nil: none), whose
// error it returns as it is, before anything is written.
func unpack(r io.Reader, dst string, maxUnpacked int64, fault WriteFault, parse parser, check func(*abi.Manifest) error) (*abi.Manifest, error) {
	// The archive's own reads kept apart: one that fails is this node's
	// disk (the spool, the fetched copy), not a damaged bundle, which a
	// refusal would condemn for good.
	in := &readErr{r: r}
	zr, err := zstd.NewReader(in, zstd.WithDecoderConcurrency(1), zstd.WithDecoderMaxWindow(64<<20))
	if err != nil {
		return nil, fmt.Errorf("unpack: %w", err)
	}
	defer zr.Close()
	// Entries are bounded by their sizes below; the stream as a whole by
	// them and an allowance for tar's own metadata, which Next reads
	// (PAX records, GNU long names) without returning it: else a few KB
	// of repeated metadata decompress for hours within any limit.
	tr := tar.NewReader(&bounded{r: zr, left: satAdd(maxUnpacked, tarSlack)})
	var m *abi.Manifest
	want := map[string]bool{}
	var total int64
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if errors.Is(err, errStream) {
			return nil, refuse("unpacks to more than %d bytes, with its tar metadata", maxUnpacked)
		}
		if err != nil && in.err != nil {
			return nil, fmt.Errorf("unpack: reading the archive: %w", in.err)
		}
		// A single-segment frame's window is its whole content, refused
		// past the bound as ErrDecoderSizeExceeded.
		if errors.Is(err, zstd.ErrWindowSizeExceeded) || errors.Is(err, zstd.ErrDecoderSizeExceeded) {
			return nil, refuse("its zstd window is over 64 MiB: pack it with plover deploy, or zstd with a window of at most 64 MiB (no --long past 26, no --ultra -22)")
		}
		if err != nil {
			return nil, refuse("corrupt archive: %v", err)
		}
		if hdr.Typeflag != tar.TypeReg {
			return nil, refuse("entry %q is not a regular file (type %q)", hdr.Name, hdr.Typeflag)
		}
		if hdr.Name != filepath.Base(hdr.Name) || hdr.Name == ".." || hdr.Name == "." || filepath.IsAbs(hdr.Name) {
			return nil, refuse("entry %q is not a plain file name", hdr.Name)
		}
		// Not total+hdr.Size > maxUnpacked: a size near MaxInt64 wraps the
		// sum negative and passes, and the entry then takes whatever the
		// stream holds (a zstd bomb, gigabytes).
		if hdr.Size < 0 || hdr.Size > maxUnpacked-total {
			return nil, refuse("unpacks to more than %d bytes", maxUnpacked)
		}
		total += hdr.Size
		switch {
		case m == nil && hdr.Name != abi.ManifestFile:
			return nil, refuse("first entry is %q, want %s", hdr.Name, abi.ManifestFile)
		case m == nil:
			// Kept as sent: re-encoded, a manifest can grow (JSON escapes
			// < > & six times larger) past what ReadManifest takes, and
			// every cache hit would then refuse the bundle as damaged.
			raw, rerr := io.ReadAll(io.LimitReader(tr, min(hdr.Size, 1<<20+1)))
			if rerr != nil {
				return nil, fmt.Errorf("unpack %s: %w", abi.ManifestFile, rerr)
			}
			if m, err = parse(bytes.NewReader(raw)); err != nil {
				return nil, fmt.Errorf("bundle %s: %w", abi.ManifestFile, err)
			}
			if check != nil {
				if err := check(m); err != nil {
					return nil, err
				}
			}
			if m.Library != "" {
				want[m.Library] = true
			}
			if m.Constants != "" {
				want[m.Constants] = true
			}
			err = copyFile(filepath.Join(dst, abi.ManifestFile), bytes.NewReader(raw), int64(len(raw)), fault, nil)
		case !want[hdr.Name]:
			return nil, refuse("unexpected entry %q (library is %q, constants %q)", hdr.Name, m.Library, m.Constants)
		default:
			delete(want, hdr.Name)
			path := filepath.Join(dst, hdr.Name)
			var cl *claim
			if cl, err = room(path, hdr.Size); err == nil {
				err = copyFile(path, tr, hdr.Size, fault, cl)
				cl.done()
			}
		}
		if err != nil {
			return nil, err
		}
	}
	if m == nil {
		return nil, refuse("empty archive, no %s", abi.ManifestFile)
	}
	for name := range want {
		return nil, refuse("missing %q named by the manifest", name)
	}
	return m, nil
}

// room claims size bytes for a file at path on its disk, failing with
// ENOSPC, before any of it is written, where the disk has no room for
// them beside what other unpacks of this process have claimed and not
// yet written: a bundle of a few KB can unpack to gigabytes of zeros,
// which, written until the disk is full, would fail every other
// function's cold start and deploy on the node meanwhile; and unpacks
// started together (a poll's pre-warms, deploys) would each find the same
// free space. The claim shrinks as its bytes are written (claim.Write)
// and is given up by done. A disk that cannot say (no statfs, or no
// blocks counted, as some FUSE file systems report) is left to the writes
// to tell.
func room(path string, size int64) (*claim, error) {
	free, fsid, ok := diskFree(filepath.Dir(path))
	if !ok {
		return nil, nil
	}
	unwritten.Lock()
	defer unwritten.Unlock()
	others := uint64(unwritten.by[fsid])
	if uint64(size) > free || uint64(size) > free-min(free, others) {
		return nil, &noRoomError{path: path, size: size, free: free, others: others}
	}
	unwritten.by[fsid] += size
	return &claim{fs: fsid, left: size}, nil
}

// diskFree is what the disk under dir has free for this process; ok is
// false where the disk cannot say (room).
func diskFree(dir string) (free uint64, fsid unix.Fsid, ok bool) {
	var st unix.Statfs_t
	if unix.Statfs(dir, &st) != nil || st.Blocks == 0 {
		return 0, fsid, false
	}
	unit := uint64(st.Frsize) // f_bavail counts fragments on Linux
	if unit == 0 {
		unit = uint64(st.Bsize)
	}
	return st.Bavail * unit, st.Fsid, true
}

// noRoomError is room's refusal, ENOSPC: its size is what the cache must
// free for the file to be written (Cache.makeRoom).
type noRoomError struct {
	path         string
	size         int64
	free, others uint64
}

func (e *noRoomError) Error() string {
	return fmt.Sprintf("writing %s: %d bytes, and its disk has %d free, %d of them claimed by other writes of bundles under way: %v", e.path, e.size, e.free, e.others, syscall.ENOSPC)
}

func (e *noRoomError) Unwrap() error { return syscall.ENOSPC }

// unwritten is, by file system, the bytes this process's unpacks have
// claimed (room) and not written yet.
var unwritten = struct {
	sync.Mutex
	by map[unix.Fsid]int64
}{by: map[unix.Fsid]int64{}}

// claim is one file's room on its disk, counted down as it is written.
// A nil claim counts nothing (a disk that cannot say).
type claim struct {
	fs   unix.Fsid
	left int64
}

// wrote counts n more bytes of the file written: the disk's free space
// shows them now.
func (c *claim) wrote(n int64) {
	if c == nil || n <= 0 {
		return
	}
	n = min(n, c.left)
	c.left -= n
	unwritten.Lock()
	if unwritten.by[c.fs] -= n; unwritten.by[c.fs] <= 0 {
		delete(unwritten.by, c.fs)
	}
	unwritten.Unlock()
}

// done gives up what is left of the claim (the file ended short, or its
// write failed).
func (c *claim) done() {
	if c != nil {
		c.wrote(c.left)
	}
}

// claimWriter counts what it writes down from its claim.
type claimWriter struct {
	w  io.Writer
	cl *claim
}

func (w claimWriter) Write(p []byte) (int, error) {
	n, err := w.w.Write(p)
	w.cl.wrote(int64(n))
	return n, err
}

// tarSlack is what an archive may hold beyond its files' bytes: headers,
// PAX records, padding and the end blocks of a few entries, with room for
// archivers that pad to their record size.
const tarSlack = 1 << 20

// errStream is a bundle's decompressed stream past its bound.
var errStream = errors.New("the decompressed archive is over its bound")

// bounded reads at most left bytes of r, then fails with errStream.
type bounded struct {
	r    io.Reader
	left int64
}

func (b *bounded) Read(p []byte) (int, error) {
	if b.left <= 0 {
		return 0, errStream
	}
	if int64(len(p)) > b.left {
		p = p[:b.left]
	}
	n, err := b.r.Read(p)
	b.left -= int64(n)
	return n, err
}

// satAdd is a+b, at most math.MaxInt64 (both non-negative).
func satAdd(a, b int64) int64 {
	if a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}

func copyFile(path string, r io.Reader, size int64, fault WriteFault, cl *claim) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return fmt.Errorf("unpack: %w", err)
	}
	src := &readErr{r: io.LimitReader(r, size)}
	n, err := io.Copy(claimWriter{w: fault.Wrap(f, path), cl: cl}, src)
	switch {
	case errors.Is(err, io.ErrUnexpectedEOF):
		err = nil // the archive ends inside the entry: refused below, named
	case err != nil && src.err != nil:
		// The archive, not this disk: a damaged stream says which entry.
		// Not refused outright: a read error of the node's own disk
		// would then condemn a good bundle for good.
		err = fmt.Errorf("unpack %s: reading the archive: %w", filepath.Base(path), err)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil && n != size {
		err = refuse("entry %s is truncated (%d of %d bytes)", filepath.Base(path), n, size)
	}
	return err
}

// readErr keeps its reader's error, to tell a damaged archive from a
// failed write in io.Copy's one error.
type readErr struct {
	r   io.Reader
	err error
}

func (r *readErr) Read(p []byte) (int, error) {
	n, err := r.r.Read(p)
	if err != nil && err != io.EOF {
		r.err = err
	}
	return n, err
}
