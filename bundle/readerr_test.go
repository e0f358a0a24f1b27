package bundle

import (
	"archive/tar"
	"bytes"
	"errors"
	"io"
	"strings"
	"syscall"
	"testing"

	"github.com/klauspost/compress/zstd"

	"github.com/plover-run/plover/abi"
)

// failAfter serves b, then fails with err: a disk that fails mid-read.
type failAfter struct {
	b   []byte
	err error
}

func (f *failAfter) Read(p []byte) (int, error) {
	if len(f.b) == 0 {
		return 0, f.err
	}
	n := copy(p, f.b)
	f.b = f.b[n:]
	return n, nil
}

// What unpack tells of an archive it cannot read: this node's disk failing
// under the spool or the fetched copy is an error of the node (a 503 that
// names no path, and nothing condemned), not a refusal of the bundle; a
// zstd window past the bound says so and how to pack it. Before, both were
// refused as a "corrupt archive", the first with the node's path in it
// (a 422 to the deployer; a cold start's refusal kept for good).
func TestUnpackTellsTheNodesDiskFromADamagedArchive(t *testing.T) {
	var tarball bytes.Buffer
	tw := tar.NewWriter(&tarball)
	tw.WriteHeader(&tar.Header{Name: "plover.json", Mode: 0o644, Size: 2, Typeflag: tar.TypeReg})
	tw.Write([]byte("{}"))
	tw.Close()
	compress := func(opts ...zstd.EOption) []byte {
		var b bytes.Buffer
		zw, err := zstd.NewWriter(&b, opts...)
		if err != nil {
			t.Fatal(err)
		}
		zw.Write(tarball.Bytes())
		zw.Close()
		return b.Bytes()
	}
	plain := compress(zstd.WithEncoderConcurrency(1))
	eio := &failAfter{b: plain[:8], err: &fsError{syscall.EIO}}
	// A frame written by hand: its header asks for a 128 MiB window
	// (descriptor 17<<3: 2^(10+17)), one raw last block holds the tar.
	wide := []byte{0x28, 0xb5, 0x2f, 0xfd, 0x00, 17 << 3}
	bh := 1 | len(tarball.Bytes())<<3
	wide = append(append(wide, byte(bh), byte(bh>>8), byte(bh>>16)), tarball.Bytes()...)
	for _, tc := range []struct {
		name    string
		r       io.Reader
		refused bool
		says    string
	}{
		{"the node's disk fails", eio, false, "reading the archive"},
		{"a window past 64 MiB", bytes.NewReader(wide), true, "zstd window is over 64 MiB"},
		{"damaged", bytes.NewReader(append(plain[:len(plain)/2:len(plain)/2], 0xff, 0xff)), true, "corrupt archive"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := unpack(tc.r, t.TempDir(), 1<<20, nil, abi.ParseStoredManifest, nil)
			var be *Error
			if err == nil || errors.As(err, &be) != tc.refused || !strings.Contains(err.Error(), tc.says) {
				t.Errorf("%v (refused %v); want refused %v saying %q", err, errors.As(err, &be), tc.refused, tc.says)
			}
			if !tc.refused && !errors.Is(err, syscall.EIO) {
				t.Errorf("%v does not carry the disk's EIO", err)
			}
		})
	}
}

// fsError is a read error of a file on this node.
type fsError struct{ errno syscall.Errno }

func (e *fsError) Error() string { return "read /var/lib/plover/spool/x: " + e.errno.Error() }
func (e *fsError) Unwrap() error { return e.errno }
