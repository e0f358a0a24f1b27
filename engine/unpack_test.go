package engine_test

import (
	"bytes"
	"context"
	"errors"
	"math/rand"
	"strings"
	"syscall"
	"testing"

	"github.com/plover-run/plover/bundle"
	"github.com/plover-run/plover/engine"
	"github.com/plover-run/plover/errdefs"
	"github.com/plover-run/plover/internal/testkit"
)

// packedAs packs the bundle directory dir under name.
func packedAs(t *testing.T, dir, name string) []byte {
	t.Helper()
	b, _, _, err := bundle.PackBytesNamed(dir, name)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// A deploy whose unpack fails on this node's own disk or files (an I/O
// error, a read-only or full disk, out of descriptors) is the node's
// fault: 503, or 507 for a full disk, naming the errno, never 422
// "invalid bundle" for a bundle that is fine; and no answer names where
// the node keeps its files. A damaged bundle is still the bundle's 422.
func TestDeployUnpackFailuresOfTheNode(t *testing.T) {
	dir := testkit.BundleDir(t, testkit.Manifest("disk"), nil)
	b := packedAs(t, dir, "disk")
	c, err := bundle.NewCache(t.TempDir(), 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	spool := t.TempDir()
	var stage string
	var errno syscall.Errno
	fail := func(path string, n int) error {
		if strings.Contains(path, stage) {
			return errno
		}
		return nil
	}
	c.WriteFault = fail
	e := testkit.Engine(t, engine.Config{Cache: c, SpoolDir: spool, WriteFault: fail})
	for _, tc := range []struct {
		stage string
		errno syscall.Errno
		want  errdefs.Kind
	}{
		{"/.verify-", syscall.EIO, errdefs.KindUnavailable},
		{"/.verify-", syscall.EROFS, errdefs.KindUnavailable},
		{"/.verify-", syscall.EMFILE, errdefs.KindUnavailable},
		{"/.verify-", syscall.ENOSPC, errdefs.KindNoSpace},
		{"/.verify-", syscall.EDQUOT, errdefs.KindNoSpace},
		{"/plover-deploy-", syscall.EIO, errdefs.KindUnavailable},
		{"/plover-deploy-", syscall.ENOSPC, errdefs.KindNoSpace},
	} {
		stage, errno = tc.stage, tc.errno
		_, err := e.Control().Deploy(context.Background(), "disk", bytes.NewReader(b), false)
		var de *errdefs.Error
		if !errors.As(err, &de) {
			t.Errorf("%s at %s: %v, not a classified error", tc.errno, tc.stage, err)
			continue
		}
		msg := de.Msg // what the client reads; the cause is the log's
		switch {
		case de.Kind != tc.want:
			t.Errorf("%s at %s: %v (kind %v), want kind %v", tc.errno, tc.stage, err, errdefs.KindOf(err), tc.want)
		case strings.Contains(msg, c.Dir()) || strings.Contains(msg, spool) || strings.Contains(msg, tc.stage):
			t.Errorf("%s at %s: the answer names the node's files: %s", tc.errno, tc.stage, msg)
		case !strings.Contains(msg, "deploy disk: ") || !strings.Contains(msg, tc.errno.Error()):
			t.Errorf("%s at %s: %q does not name the function and the errno", tc.errno, tc.stage, msg)
		}
	}
	// Damaged within its constants (random bytes, which zstd keeps as
	// they are: the byte flipped is theirs, far past the stream's first
	// blocks), the stream fails as the entry is read, not as a refusal of
	// the archive's (a *bundle.Error).
	stage = "nothing fails"
	mc := testkit.Manifest("damaged")
	mc.Constants = "w.bin"
	consts := make([]byte, 1<<20)
	rand.New(rand.NewSource(1)).Read(consts)
	damaged := packedAs(t, testkit.BundleDir(t, mc, consts), "damaged")
	damaged[len(damaged)*3/4] ^= 0xff
	_, err = e.Control().Deploy(context.Background(), "damaged", bytes.NewReader(damaged), false)
	var be *bundle.Error
	if errdefs.KindOf(err) != errdefs.KindInvalid || errors.As(err, &be) || !strings.Contains(err.Error(), "unpack w.bin: reading the archive") || strings.Contains(err.Error(), c.Dir()) || strings.Contains(err.Error(), spool) {
		t.Errorf("a bundle damaged within its constants: %v (kind %v), want 422 naming the entry and no path of the node's", err, errdefs.KindOf(err))
	}
	testkit.Deploy(t, e, dir)
}
