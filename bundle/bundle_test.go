package bundle

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"
	"golang.org/x/sys/unix"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/objectstore"
)

func manifestJSON(t testing.TB, consts string) []byte {
	t.Helper()
	m := abi.Manifest{Name: "fn", ABI: 1, Target: "host", Library: "lib.so", Constants: consts,
		MaxInputBytes: 16, OutBytes: 16, Chain: []abi.Launch{{Kernel: "k", Grid: 1, Block: 1}}}
	b, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

type entry struct {
	name     string
	typ      byte
	body     []byte
	linkname string
}

func archive(t *testing.T, entries ...entry) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw, _ := zstd.NewWriter(&buf)
	tw := tar.NewWriter(zw)
	for _, e := range entries {
		typ := e.typ
		if typ == 0 {
			typ = tar.TypeReg
		}
		h := &tar.Header{Name: e.name, Typeflag: typ, Mode: 0o644, Size: int64(len(e.body)), Linkname: e.linkname}
		if typ != tar.TypeReg {
			h.Size = 0
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if typ == tar.TypeReg {
			tw.Write(e.body)
		}
	}
	tw.Close()
	zw.Close()
	return buf.Bytes()
}

func TestUnpackRefusesHostileArchives(t *testing.T) {
	man := entry{name: abi.ManifestFile, body: manifestJSON(t, "w.bin")}
	lib := entry{name: "lib.so", body: []byte("\x7fELF...")}
	w := entry{name: "w.bin", body: []byte{1, 2, 3}}
	tests := []struct {
		name string
		data []byte
		want string
	}{
		{"ok", archive(t, man, lib, w), ""},
		{"path traversal", archive(t, man, entry{name: "../lib.so", body: lib.body}, w), "not a plain file name"},
		{"nested traversal", archive(t, man, entry{name: "x/../../lib.so", body: lib.body}, w), "not a plain file name"},
		{"absolute path", archive(t, man, entry{name: "/etc/lib.so", body: lib.body}, w), "not a plain file name"},
		{"symlink", archive(t, man, entry{name: "lib.so", typ: tar.TypeSymlink, linkname: "/etc/passwd"}, w), "not a regular file"},
		{"hard link", archive(t, man, entry{name: "lib.so", typ: tar.TypeLink, linkname: "plover.json"}, w), "not a regular file"},
		{"directory", archive(t, man, entry{name: "d", typ: tar.TypeDir}, lib, w), "not a regular file"},
		{"unexpected name", archive(t, man, lib, w, entry{name: "evil.sh", body: []byte("x")}), "unexpected entry"},
		{"duplicate library", archive(t, man, lib, lib, w), "unexpected entry"},
		{"manifest not first", archive(t, lib, man, w), "first entry"},
		{"missing constants", archive(t, man, lib), `missing "w.bin"`},
		{"empty", archive(t), "empty archive"},
		{"invalid manifest", archive(t, entry{name: abi.ManifestFile, body: []byte(`{"name":"BAD"}`)}), "plover.json"},
		{"not zstd", []byte("this is not a bundle"), "corrupt archive"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// Two levels deep, so that an entry two levels up (x/../../)
			// would land in the tree checkTree walks.
			root := t.TempDir()
			dst := filepath.Join(root, "a", "b")
			if err := os.MkdirAll(dst, 0o755); err != nil {
				t.Fatal(err)
			}
			m, err := Unpack(bytes.NewReader(tt.data), dst, 1<<20)
			if tt.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				got, _ := os.ReadFile(filepath.Join(dst, "w.bin"))
				if m.Constants != "w.bin" || !bytes.Equal(got, w.body) {
					t.Fatalf("unpacked %+v / %v", m, got)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Unpack error = %v, want %q", err, tt.want)
			}
			// Nothing may be written outside dst, nor anything but plain files in it.
			checkTree(t, root, dst)
		})
	}
}

func TestUnpackSizeLimit(t *testing.T) {
	big := entry{name: "lib.so", body: make([]byte, 2<<20)}
	data := archive(t, entry{name: abi.ManifestFile, body: manifestJSON(t, "")}, big)
	if _, err := Unpack(bytes.NewReader(data), t.TempDir(), 1<<20); err == nil || !strings.Contains(err.Error(), "more than") {
		t.Fatalf("Unpack of a 2 MiB entry with a 1 MiB limit: %v", err)
	}
}

func bundleDir(t *testing.T) string {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, abi.ManifestFile), manifestJSON(t, "w.bin"), 0o644)
	os.WriteFile(filepath.Join(dir, "lib.so"), []byte("\x7fELF"), 0o644)
	os.WriteFile(filepath.Join(dir, "w.bin"), []byte{9, 9}, 0o644)
	return dir
}

func TestPackIsDeterministicAndRoundTrips(t *testing.T) {
	dir := bundleDir(t)
	b1, sha1, _, err := PackBytes(dir)
	if err != nil {
		t.Fatal(err)
	}
	os.Chtimes(filepath.Join(dir, "lib.so"), timeZero, timeZero)
	b2, sha2, _, _ := PackBytes(dir)
	if sha1 != sha2 || !bytes.Equal(b1, b2) {
		t.Fatal("packing the same directory twice gave different bytes")
	}
	m, err := Unpack(bytes.NewReader(b1), t.TempDir(), DefaultMaxUnpacked)
	if err != nil || m.Name != "fn" {
		t.Fatalf("round trip: %v %+v", err, m)
	}
}

func TestCacheVerifiesSHA256(t *testing.T) {
	ctx := context.Background()
	store, err := objectstore.NewFS(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	b, sha, _, err := PackBytes(bundleDir(t))
	if err != nil {
		t.Fatal(err)
	}
	cache, err := NewCache(t.TempDir(), 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	// Missing object: a fetch error (an outage or a dangling record).
	_, _, _, err = cache.Get(ctx, store, sha)
	var fe *FetchError
	if !errors.As(err, &fe) || !errors.Is(err, objectstore.ErrNotFound) {
		t.Fatalf("missing object: %v", err)
	}
	// Tampered object under the right key: refused, nothing cached.
	tampered := append([]byte(nil), b...)
	tampered[len(tampered)/2] ^= 0xff
	store.Put(ctx, ObjectKey(sha), bytes.NewReader(tampered), int64(len(tampered)))
	_, _, _, err = cache.Get(ctx, store, sha)
	var be *Error
	if !errors.As(err, &be) || !strings.Contains(err.Error(), "sha256 mismatch") {
		t.Fatalf("tampered object: %v", err)
	}
	if _, err := os.Stat(filepath.Join(cache.dir, sha)); err == nil {
		t.Fatal("a tampered bundle was cached")
	}
	// The real object: fetched once, then served from the node cache.
	store.Put(ctx, ObjectKey(sha), bytes.NewReader(b), int64(len(b)))
	dir, m, fetched, err := cache.Get(ctx, store, sha)
	if err != nil || !fetched || m.Name != "fn" {
		t.Fatalf("first Get: %v fetched=%v", err, fetched)
	}
	store.Delete(ctx, ObjectKey(sha))
	dir2, _, fetched, err := cache.Get(ctx, store, sha)
	if err != nil || fetched || dir2 != dir {
		t.Fatalf("second Get should come from the node cache: %v fetched=%v", err, fetched)
	}
	if _, _, _, err := cache.Get(ctx, store, "../../etc"); err == nil {
		t.Fatal("invalid digest accepted")
	}
}

// A changed mtime must not change the bundle's bytes.
var timeZero = time.Unix(1_700_000_000, 0)

// The manifest a cache hit reads is the one the bundle carries, byte for
// byte: re-encoded, a manifest of 200 KB with characters JSON escapes grew
// past the 1 MiB ReadManifest takes, and every cache hit refused the bundle
// as damaged.
func TestUnpackKeepsTheManifestAsSent(t *testing.T) {
	m := abi.Manifest{Name: "fn", ABI: 1, Target: "host", Library: "lib.so", MaxInputBytes: 16, OutBytes: 16,
		Chain: []abi.Launch{{Kernel: "k", Grid: 1, Block: 1}}, Build: &abi.Build{Sources: []string{"k.cu"}, CXXFlags: []string{strings.Repeat("<", 200<<10)}}}
	var raw bytes.Buffer
	enc := json.NewEncoder(&raw)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(m); err != nil {
		t.Fatal(err)
	}
	dst := t.TempDir()
	if _, err := Unpack(bytes.NewReader(archive(t, entry{name: abi.ManifestFile, body: raw.Bytes()}, entry{name: "lib.so", body: []byte("\x7fELF")})), dst, DefaultMaxUnpacked); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(filepath.Join(dst, abi.ManifestFile))
	if err != nil || !bytes.Equal(got, raw.Bytes()) {
		t.Fatalf("plover.json unpacked: %d bytes (%v), sent %d", len(got), err, raw.Len())
	}
	if _, err := ReadManifest(dst); err != nil {
		t.Fatalf("what a cache hit reads: %v", err)
	}
}

// PackNamed packs a bundle under another name (a model repository served
// as --repository-name): the manifest's name changes, its other fields and
// the files stay, the same inputs give the same bytes, and its own name
// packs as Pack does.
func TestPackNamed(t *testing.T) {
	dir := bundleDir(t)
	plain, sha, m, err := PackBytes(dir)
	if err != nil {
		t.Fatal(err)
	}
	if same, sha2, _, _ := PackBytesNamed(dir, m.Name); sha2 != sha || !bytes.Equal(same, plain) {
		t.Fatal("PackNamed under the manifest's own name differs from Pack")
	}
	b1, sha1, m1, err := PackBytesNamed(dir, "renamed")
	if err != nil {
		t.Fatal(err)
	}
	if _, sha2, _, _ := PackBytesNamed(dir, "renamed"); sha2 != sha1 || sha1 == sha {
		t.Fatalf("renamed packs: %s, %s (plain %s)", sha1, sha2, sha)
	}
	out := t.TempDir()
	got, err := Unpack(bytes.NewReader(b1), out, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	if m1.Name != "renamed" || got.Name != "renamed" || got.Library != m.Library || got.Constants != m.Constants || got.OutBytes != m.OutBytes {
		t.Fatalf("unpacked manifest %+v, packed from %+v", got, m)
	}
	if w, _ := os.ReadFile(filepath.Join(out, "w.bin")); !bytes.Equal(w, []byte{9, 9}) {
		t.Fatalf("constants %v", w)
	}
}

// PackWithin packs files linked within the directory and refuses, naming
// it, a file (the manifest too) linked out of it; Pack follows both.
func TestPackWithinLinks(t *testing.T) {
	secret := filepath.Join(t.TempDir(), "tokens")
	os.WriteFile(secret, []byte("SERVER-SECRET"), 0o600)
	for _, c := range []struct {
		what, file, target string // target "": the secret
		ok                 bool
	}{
		{"constants linked within", "w.bin", "data/w.bin", true},
		{"constants linked out", "w.bin", "", false},
		{"library linked out", "lib.so", "", false},
		{"manifest linked out", abi.ManifestFile, "", false},
		{"constants linked out through ..", "w.bin", "../outside/w.bin", false},
	} {
		t.Run(c.what, func(t *testing.T) {
			dir := bundleDir(t)
			os.MkdirAll(filepath.Join(dir, "data"), 0o755)
			os.WriteFile(filepath.Join(dir, "data", "w.bin"), []byte{9, 9}, 0o644)
			target := c.target
			if target == "" {
				target = secret
			}
			if c.target == "../outside/w.bin" {
				os.MkdirAll(filepath.Join(dir, "..", "outside"), 0o755)
				os.WriteFile(filepath.Join(dir, "..", "outside", "w.bin"), []byte{9, 9}, 0o644)
			}
			p := filepath.Join(dir, c.file)
			os.Remove(p)
			if err := os.Symlink(target, p); err != nil {
				t.Fatal(err)
			}
			_, _, _, err := PackBytesWithin(dir, "")
			if c.ok != (err == nil) {
				t.Fatalf("PackBytesWithin: %v, want ok %v", err, c.ok)
			}
			if err != nil && !strings.Contains(err.Error(), p+" is a link that resolves outside") {
				t.Errorf("the refusal does not name the file: %v", err)
			}
			if _, _, _, err := PackBytes(dir); err != nil && c.file == "w.bin" {
				t.Errorf("PackBytes (following links) refused it: %v", err)
			}
		})
	}
}

// A bundle directory's file that is not a regular file is refused, naming
// it and its kind, unopened: a FIFO's open would wait for a writer (a
// model repository's folders are written by others), a socket's fails
// (ENXIO, which a repository took for a passing read error and tried again
// at every scan), a device's runs its driver. Pack and PackWithin, the
// manifest and the other files alike.
func TestPackRefusesSpecialFilesWithoutBlocking(t *testing.T) {
	for _, special := range []struct {
		mode uint32
		kind string
	}{{syscall.S_IFIFO, "a named pipe (FIFO)"}, {syscall.S_IFSOCK, "a socket"}} {
		for _, name := range []string{abi.ManifestFile, "lib.so", "w.bin"} {
			for _, within := range []bool{false, true} {
				dir := bundleDir(t)
				os.Remove(filepath.Join(dir, name))
				if err := syscall.Mknod(filepath.Join(dir, name), special.mode|0o644, 0); err != nil {
					t.Fatal(err)
				}
				done := make(chan error, 1)
				go func() {
					var err error
					if within {
						_, err = PackWithin(dir, "", io.Discard)
					} else {
						_, err = Pack(dir, io.Discard)
					}
					done <- err
				}()
				select {
				case err := <-done:
					if err == nil || !strings.Contains(err.Error(), name+" is "+special.kind+", not a regular file") {
						t.Errorf("%s %s (within %v): %v, want it refused naming it", name, special.kind, within, err)
					}
				case <-time.After(5 * time.Second):
					t.Fatalf("%s %s (within %v): packing still blocked 5 s on", name, special.kind, within)
				}
			}
		}
	}
}

// An entry larger than its disk's free space is refused with ENOSPC (the
// node's disk, not the bundle: 507 from a deploy or a cold start) before
// any of it is written: a few KB of zstd can unpack to gigabytes of
// zeros, and written until the disk filled, they failed every other
// function's writes on the node meanwhile.
func TestUnpackRefusesAnEntryItsDiskHasNoRoomFor(t *testing.T) {
	dst := t.TempDir()
	var st unix.Statfs_t
	if err := unix.Statfs(dst, &st); err != nil {
		t.Skip("statfs:", err)
	}
	size := int64(st.Bavail)*st.Frsize + 1<<40
	// The header alone: what unpacking writes for it, if anything, is
	// what the stream holds (nothing), before it finds the entry cut.
	var buf bytes.Buffer
	zw, _ := zstd.NewWriter(&buf)
	tw := tar.NewWriter(zw)
	for _, e := range []entry{{name: abi.ManifestFile, body: manifestJSON(t, "w.bin")}, {name: "lib.so", body: []byte("\x7fELF")}} {
		tw.WriteHeader(&tar.Header{Name: e.name, Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(e.body))})
		tw.Write(e.body)
	}
	if err := tw.WriteHeader(&tar.Header{Name: "w.bin", Typeflag: tar.TypeReg, Mode: 0o644, Size: size}); err != nil {
		t.Fatal(err)
	}
	zw.Close()
	_, err := Unpack(bytes.NewReader(buf.Bytes()), dst, math.MaxInt64)
	var be *Error
	if !errors.Is(err, syscall.ENOSPC) || errors.As(err, &be) {
		t.Fatalf("Unpack of a %d-byte entry, more than its disk has free: %v, want ENOSPC", size, err)
	}
	if _, err := os.Stat(filepath.Join(dst, "w.bin")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("w.bin was created (%v)", err)
	}
}

// A frame that declares its whole content as its window (zstd marks one
// single-segment whenever its window is at least the input: --long=27, or
// --ultra -20 and past, on a tar over 64 MiB) is refused for its window,
// as one that names a window past 64 MiB is, not as a corrupt archive (a
// review's probe): the archive is valid, the decoder's memory bound
// refuses it.
func TestUnpackNamesAWholeContentWindow(t *testing.T) {
	var tb bytes.Buffer
	tw := tar.NewWriter(&tb)
	for _, e := range []entry{{name: abi.ManifestFile, body: manifestJSON(t, "w.bin")}, {name: "lib.so", body: []byte("\x7fELF...")}, {name: "w.bin", body: make([]byte, 65<<20)}} {
		if err := tw.WriteHeader(&tar.Header{Name: e.name, Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(e.body))}); err != nil {
			t.Fatal(err)
		}
		tw.Write(e.body)
	}
	tw.Close()
	zw, err := zstd.NewWriter(nil, zstd.WithSingleSegment(true))
	if err != nil {
		t.Fatal(err)
	}
	data := zw.EncodeAll(tb.Bytes(), nil)
	_, err = Unpack(bytes.NewReader(data), t.TempDir(), 1<<30)
	if err == nil || !strings.Contains(err.Error(), "zstd window") || strings.Contains(err.Error(), "corrupt") {
		t.Fatalf("Unpack of a 65 MiB single-segment frame: %v, want its window refused", err)
	}
}
