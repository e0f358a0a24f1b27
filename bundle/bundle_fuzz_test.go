package bundle

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/klauspost/compress/zstd"

	"github.com/plover-run/plover/abi"
)

// fuzzLimit is the unpacked size Unpack is held to: small, so that inputs
// the fuzzer can make reach past it.
const fuzzLimit = 2 << 10

// Ways FuzzUnpack reads its input: as the bundle itself, or as the tar
// inside it, compressed here (so that changes reach the tar reader rather
// than fail zstd's checks), with its header checksums set right first (so
// that changed names, types and sizes reach Unpack's own checks).
const (
	asBundle = iota
	asTar
	asTarSummed
	fuzzModes
)

var zenc, _ = zstd.NewWriter(nil, zstd.WithEncoderConcurrency(1))

// fixChecksums sets the checksum of each tar header in b, in place, as far
// as its sizes can be followed.
func fixChecksums(b []byte) {
	for off := 0; off+512 <= len(b); {
		h := b[off : off+512]
		if bytes.Count(h, []byte{0}) == len(h) {
			return // the end of the archive
		}
		copy(h[148:156], "        ")
		sum := 0
		for _, c := range h {
			sum += int(c)
		}
		copy(h[148:156], fmt.Sprintf("%06o\x00 ", sum))
		size, ok := tarSize(h[124:136])
		if !ok || size > int64(len(b)) {
			return
		}
		off += 512 + int((size+511)/512*512)
	}
}

// tarSize reads a header's size field: octal, or base-256 when its top bit
// is set.
func tarSize(f []byte) (int64, bool) {
	if f[0]&0x80 != 0 {
		var n uint64
		for _, c := range f[len(f)-8:] {
			n = n<<8 | uint64(c)
		}
		return int64(n), n <= math.MaxInt64 && bytes.Count(f[1:len(f)-8], []byte{0}) == len(f)-9 && f[0] == 0x80
	}
	n, err := strconv.ParseInt(strings.Trim(string(f), " \x00"), 8, 64)
	return n, err == nil && n >= 0
}

type tarEntry struct {
	hdr  tar.Header
	body string
}

// tarball writes entries as a tar; one whose size is over its body's
// length ends it, truncated.
func tarball(tb testing.TB, entries ...tarEntry) []byte {
	tb.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		h := e.hdr
		if h.Typeflag == 0 {
			h.Typeflag = tar.TypeReg
		}
		if h.Mode == 0 {
			h.Mode = 0o644
		}
		if h.Typeflag == tar.TypeReg && h.Size == 0 {
			h.Size = int64(len(e.body))
		}
		if err := tw.WriteHeader(&h); err != nil {
			tb.Fatal(err)
		}
		if _, err := tw.Write([]byte(e.body)); err != nil {
			tb.Fatal(err)
		}
		if h.Size > int64(len(e.body)) {
			tw.Flush() // the entry is short: it errs, and the archive ends here
			return buf.Bytes()
		}
	}
	if err := tw.Close(); err != nil {
		tb.Fatal(err)
	}
	return buf.Bytes()
}

// packed packs a directory of files with the package's own Pack.
func packed(tb testing.TB, files map[string]string) []byte {
	tb.Helper()
	dir := tb.TempDir()
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			tb.Fatal(err)
		}
	}
	b, _, _, err := PackBytes(dir)
	if err != nil {
		tb.Fatal(err)
	}
	return b
}

func unzstd(tb testing.TB, b []byte) []byte {
	tb.Helper()
	zr, err := zstd.NewReader(bytes.NewReader(b))
	if err != nil {
		tb.Fatal(err)
	}
	defer zr.Close()
	out, err := io.ReadAll(zr)
	if err != nil {
		tb.Fatal(err)
	}
	return out
}

// FuzzUnpack fuzzes Unpack: whatever the bytes, nothing lands outside the
// destination, nothing but the manifest's regular files lands in it, no
// more than the limit is written, and what is taken unpacks, reads and
// packs again as it was.
func FuzzUnpack(f *testing.F) {
	samples := map[string]string{}
	for _, s := range []string{"cnn", "digits-pipeline"} {
		b, err := os.ReadFile(filepath.Join("..", "samples", s, abi.ManifestFile))
		if err != nil {
			f.Fatal(err)
		}
		samples[s] = string(b)
	}
	man := `{"name":"fn","abi":1,"target":"host","library":"lib.so","constants":"w.bin","max_input_bytes":16,"tmp_bytes":0,"out_bytes":16,"zero_tmp":false,"chain":[{"kernel":"k","grid":1,"block":1}]}`
	bundles := [][]byte{
		packed(f, map[string]string{abi.ManifestFile: samples["cnn"], "cnn.so": "\x7fELF\x02\x01\x01", "weights.bin": "\x00\x00\x80\x3f"}),
		packed(f, map[string]string{abi.ManifestFile: samples["digits-pipeline"]}),
		packed(f, map[string]string{abi.ManifestFile: man, "lib.so": "\x7fELF", "w.bin": ""}),
	}
	for _, b := range bundles {
		f.Add(b, uint8(asBundle))
		f.Add(unzstd(f, b), uint8(asTarSummed))
	}
	f.Add(unzstd(f, bundles[0]), uint8(asTar))
	// Tricky: ways out of the directory, links, entries the manifest does
	// not name or names twice, the manifest not first, sizes over the
	// limit (one so large that adding it to the manifest's wraps an
	// int64), a truncated entry, a manifest that does not validate.
	mf := tarEntry{hdr: tar.Header{Name: abi.ManifestFile}, body: man}
	lib := tarEntry{hdr: tar.Header{Name: "lib.so"}, body: "\x7fELF"}
	w := tarEntry{hdr: tar.Header{Name: "w.bin"}, body: "\x01\x02"}
	big := strings.Repeat("\xee", fuzzLimit+512)
	for _, es := range [][]tarEntry{
		{mf, {hdr: tar.Header{Name: "../lib.so"}, body: lib.body}, w},
		{mf, {hdr: tar.Header{Name: "../../../../lib.so"}, body: lib.body}, w},
		{mf, {hdr: tar.Header{Name: "/tmp/lib.so"}, body: lib.body}, w},
		{mf, {hdr: tar.Header{Name: "lib.so", Typeflag: tar.TypeSymlink, Linkname: "../../lib.so"}}, w},
		{mf, {hdr: tar.Header{Name: "lib.so", Typeflag: tar.TypeLink, Linkname: abi.ManifestFile}}, w},
		{mf, {hdr: tar.Header{Name: "d", Typeflag: tar.TypeDir}}, lib, w},
		{mf, lib, lib, w},
		{mf, lib, w, {hdr: tar.Header{Name: "evil.sh"}, body: "x"}},
		{lib, mf, w},
		{mf, {hdr: tar.Header{Name: "lib.so"}, body: big}, w},
		{mf, {hdr: tar.Header{Name: "lib.so", Size: math.MaxInt64 - int64(len(man)) + 1}, body: big}},
		{mf, lib, {hdr: tar.Header{Name: "w.bin", Size: 1000}, body: "\x01\x02"}},
		{{hdr: tar.Header{Name: abi.ManifestFile}, body: strings.Replace(man, `"lib.so"`, `"../lib.so"`, 1)}, lib, w},
		{{hdr: tar.Header{Name: abi.ManifestFile}, body: strings.Replace(man, `"w.bin"`, `"plover.json"`, 1)}, lib, mf},
	} {
		f.Add(tarball(f, es...), uint8(asTarSummed))
	}
	f.Add([]byte("not a bundle"), uint8(asBundle))

	f.Fuzz(func(t *testing.T, data []byte, mode uint8) {
		bundle := data
		switch mode % fuzzModes {
		case asTarSummed:
			data = bytes.Clone(data)
			fixChecksums(data)
			fallthrough
		case asTar:
			bundle = zenc.EncodeAll(data, nil)
		}
		// dst three levels down: an entry that climbs out of it up to
		// three levels still lands in root, where it shows.
		root := t.TempDir()
		dst := filepath.Join(root, "1", "2", "dst")
		if err := os.MkdirAll(dst, 0o755); err != nil {
			t.Fatal(err)
		}
		m, err := Unpack(bytes.NewReader(bundle), dst, fuzzLimit)
		files := checkTree(t, root, dst)

		if err != nil {
			// Errors say it is the bundle at fault (and which entry).
			msg := err.Error()
			var be *Error
			if !errors.As(err, &be) && !strings.HasPrefix(msg, "bundle "+abi.ManifestFile+": ") && !strings.HasPrefix(msg, "unpack") {
				t.Fatalf("error does not say it is the bundle's: %q", msg)
			}
			return
		}

		// Taken: the manifest's files, each once, and nothing else.
		if err := m.Validate(); err != nil {
			t.Fatalf("taken manifest does not validate: %v", err)
		}
		want := map[string]bool{abi.ManifestFile: true}
		for _, n := range []string{m.Library, m.Constants} {
			if n != "" {
				want[n] = true
			}
		}
		if len(files) != len(want) {
			t.Fatalf("unpacked %v, the manifest names %v", files, want)
		}
		for n := range want {
			if _, ok := files[n]; !ok {
				t.Fatalf("unpacked %v, without %s", files, n)
			}
		}
		// As a cache hit reads it back.
		m2, err := ReadManifest(dst)
		if err != nil {
			t.Fatalf("unpacked manifest does not read back: %v", err)
		}
		if a, b := mustJSON(t, m), mustJSON(t, m2); a != b {
			t.Fatalf("manifest read back differs:\n%s\n%s", a, b)
		}
		// The files hold the archive's bytes.
		// (Streamed: what follows the tar in the zstd stream, which Unpack
		// never reads, may be a bomb.)
		zr, err := zstd.NewReader(bytes.NewReader(bundle), zstd.WithDecoderConcurrency(1))
		if err != nil {
			t.Fatal(err)
		}
		defer zr.Close()
		tr := tar.NewReader(zr)
		for {
			h, err := tr.Next()
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatalf("taken, but the archive does not read: %v", err)
			}
			body, err := io.ReadAll(io.LimitReader(tr, fuzzLimit+1))
			if err != nil {
				t.Fatal(err)
			}
			if h.Name != abi.ManifestFile && !bytes.Equal(body, files[h.Name]) {
				t.Fatalf("%s holds %q, the archive %q", h.Name, files[h.Name], body)
			}
		}
		// And it packs again into a bundle that unpacks to the same.
		again, _, _, err := PackBytes(dst)
		if err != nil {
			t.Fatalf("unpacked bundle does not pack: %v", err)
		}
		dst2 := t.TempDir()
		if _, err := Unpack(bytes.NewReader(again), dst2, fuzzLimit+1<<20); err != nil {
			t.Fatalf("repacked bundle refused: %v", err)
		}
		if files2 := checkTree(t, dst2, dst2); fmt.Sprint(files2) != fmt.Sprint(files) {
			t.Fatalf("repacked bundle unpacks to %q, first %q", files2, files)
		}
	})
}

// checkTree checks that under root there is nothing but dst's directories
// and, in dst, regular files with plain names, at most fuzzLimit bytes of
// them besides plover.json, and returns them.
func checkTree(t *testing.T, root, dst string) map[string][]byte {
	t.Helper()
	files := map[string][]byte{}
	total := 0
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dst, p)
		switch {
		case d.IsDir() && (p == dst || strings.HasPrefix(dst, p+string(filepath.Separator))):
			return nil
		case filepath.Dir(p) != dst || !d.Type().IsRegular():
			return fmt.Errorf("%s (%v) is outside the destination or no regular file", p, d.Type())
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		files[rel] = b
		if rel != abi.ManifestFile {
			total += len(b)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if total > fuzzLimit {
		t.Fatalf("%d bytes unpacked, over the limit of %d", total, fuzzLimit)
	}
	if b, ok := files[abi.ManifestFile]; ok && len(b) > 1<<20 {
		t.Fatalf("plover.json unpacked to %d bytes, over what ParseManifest reads", len(b))
	}
	return files
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
