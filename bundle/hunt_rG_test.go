package bundle

// Hunt rG (a hostile bundle author against a node): tests that fail on the
// code as found, each showing one defect. They are evidence, not fixes.

import (
	"archive/tar"
	"bytes"
	"io"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"

	"github.com/plover-run/plover/abi"
)

// countingReader counts the bytes read through it.
type countingReader struct {
	r io.Reader
	n int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

// paxHeaderChunk is one tar metadata entry as archive/tar writes it for a
// file with a PAX record: the 'x' header block and its 512-byte record
// block, which archive/tar's Next consumes without returning to its
// caller (the same holds for GNU long-name 'L' and 'K' entries).
func paxHeaderChunk(t *testing.T) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	h := &tar.Header{Name: "x", Typeflag: tar.TypeReg, Mode: 0o644, Format: tar.FormatPAX,
		PAXRecords: map[string]string{"comment": string(bytes.Repeat([]byte("a"), 400))}}
	if err := tw.WriteHeader(h); err != nil {
		t.Fatal(err)
	}
	tw.Close()
	chunk := buf.Bytes()[:1024]
	if chunk[156] != tar.TypeXHeader {
		t.Fatalf("the first block is type %q, want a PAX header", chunk[156])
	}
	return append([]byte(nil), chunk...)
}

// TestHuntRGUnpackBoundsDecompressedMetadata: maxUnpacked bounds the sizes
// of the regular entries Unpack returns, not what it decompresses. PAX
// ('x') and GNU long-name entries are consumed inside tar.Reader.Next and
// counted nowhere, so a bundle whose archive holds gigabytes of them (a few
// KiB compressed: they repeat) passes the limit, however small, and keeps
// the server's deploy (engine/control.go: Cache.Verify, with no context)
// decompressing and parsing for as long as the stream lasts: 1 GiB of
// upload (MaxBundleBytes) expands to terabytes. Here 256 MiB of metadata,
// in an archive of a few KiB, is accepted under a 1 MiB limit.
func TestHuntRGUnpackBoundsDecompressedMetadata(t *testing.T) {
	const metadata = 256 << 20
	chunk := paxHeaderChunk(t)
	var z bytes.Buffer
	zw, err := zstd.NewWriter(&z)
	if err != nil {
		t.Fatal(err)
	}
	for range metadata / len(chunk) {
		zw.Write(chunk)
	}
	// Then an ordinary, valid bundle: manifest and library.
	tw := tar.NewWriter(zw)
	for _, e := range []struct {
		name string
		body []byte
	}{{abi.ManifestFile, manifestJSON(t, "")}, {"lib.so", []byte("\x7fELF")}} {
		tw.WriteHeader(&tar.Header{Name: e.name, Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(e.body))})
		tw.Write(e.body)
	}
	tw.Close()
	zw.Close()

	const limit = 1 << 20
	in := &countingReader{r: bytes.NewReader(z.Bytes())}
	began := time.Now()
	_, err = Unpack(in, t.TempDir(), limit)
	took := time.Since(began)
	t.Logf("archive of %d bytes (%d read), %d MiB of tar metadata: Unpack took %v, err = %v", z.Len(), in.n, metadata>>20, took.Round(time.Millisecond), err)
	if err == nil {
		t.Errorf("Unpack accepted an archive that decompresses to %d MiB with a limit of %d MiB (%d compressed bytes): "+
			"the metadata entries tar.Reader consumes are not counted, so the limit bounds no work", metadata>>20, limit>>20, z.Len())
	}
}
