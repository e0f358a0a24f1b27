package engine

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"syscall"
	"testing"

	"github.com/plover-run/plover/apierr"
	"github.com/plover-run/plover/errdefs"
	"github.com/plover-run/plover/fileutil"
	"github.com/plover-run/plover/objectstore"
)

// A failure of this node's files (the file store, the bundle cache, a
// worker's stage) tells a client the operation and errno, never the
// node's paths; a disk that filled up is a 507 the same way. Before, the
// 503's message carried the path error whole ("mkdir /srv/plover/store/
// bundles: not a directory").
func TestNodeFileFailuresNameNoPath(t *testing.T) {
	const secret = "/srv/node-only/store"
	for _, tc := range []struct {
		name string
		err  error
		kind errdefs.Kind
		says string
	}{
		{"store write", unavailable(&os.PathError{Op: "mkdir", Path: secret + "/bundles", Err: syscall.ENOTDIR}, "deploy f: cannot write to the store"),
			errdefs.KindUnavailable, "deploy f: cannot write to the store: mkdir failed on this node (not a directory; the server's log names the file)"},
		{"stage link", unavailable(&os.LinkError{Op: "link", Old: secret + "/a.so", New: "/tmp/stage/a.so", Err: syscall.EXDEV}, "function f: cannot load on host"),
			errdefs.KindUnavailable, "function f: cannot load on host: link failed on this node (invalid cross-device link;"},
		{"wrapped", unavailable(errors.Join(errors.New("stage kernels.so"), &os.PathError{Op: "open", Path: secret, Err: syscall.EACCES}), "function f: cannot load on host"),
			errdefs.KindUnavailable, "open failed on this node (permission denied;"},
		{"a directory that could not be made again", unavailable(fmt.Errorf("start worker: stage: %w", &fileutil.GoneError{What: "workers' stage", Err: &os.PathError{Op: "mkdir", Path: secret + "/workers", Err: syscall.ENOENT}}), "function f: cannot load on host"),
			errdefs.KindUnavailable, "function f: cannot load on host: the node's workers' stage directory was removed and could not be made again (no such file or directory; see the server log)"},
		{"disk full", storageError(&os.PathError{Op: "write", Path: secret + "/x", Err: syscall.ENOSPC}, "deploy %s: cannot write to the store", "f"),
			errdefs.KindNoSpace, "deploy f: cannot write to the store: out of disk space (no space left on device)"},
		{"not a file's", unavailable(io.ErrUnexpectedEOF, "function f: reading its record"),
			errdefs.KindUnavailable, "function f: reading its record: unexpected EOF"},
		{"the store's own class", unavailable(&objectstore.Fault{Class: "endpoint unreachable", Err: &os.PathError{Op: "dial", Path: secret, Err: syscall.ECONNREFUSED}}, "function f"),
			errdefs.KindUnavailable, "function f: endpoint unreachable"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, k, msg, _ := apierr.Classify(tc.err)
			if k != tc.kind || !strings.Contains(msg, tc.says) || strings.Contains(msg, "node-only") || strings.Contains(msg, "/tmp/stage") {
				t.Errorf("kind %v, message %q; want kind %v saying %q, no path", k, msg, tc.kind, tc.says)
			}
		})
	}
}
