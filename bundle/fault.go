package bundle

import (
	"io"
	"os"
)

// WriteFault is a test seam over the writes of this node's files: asked
// before each write of n bytes to the file at path, it fails the write with
// the error it returns (syscall.ENOSPC: the disk is full), as the kernel
// would. Tests fill a disk this way where they cannot mount a small file
// system of their own; nil, the production value, writes straight to the
// file.
type WriteFault func(path string, n int) error

// Wrap returns w, or w behind the fault when there is one.
func (f WriteFault) Wrap(w io.Writer, path string) io.Writer {
	if f == nil {
		return w // the file itself: io.Copy keeps its fast paths
	}
	return &faultWriter{w: w, path: path, fault: f}
}

type faultWriter struct {
	w     io.Writer
	path  string
	fault WriteFault
}

// Write fails as a write to a full disk does, the path and the errno in an
// *os.PathError, so that callers classify and report it as the real one.
func (w *faultWriter) Write(p []byte) (int, error) {
	if err := w.fault(w.path, len(p)); err != nil {
		return 0, &os.PathError{Op: "write", Path: w.path, Err: err}
	}
	return w.w.Write(p)
}
