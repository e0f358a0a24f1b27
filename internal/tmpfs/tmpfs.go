// Package tmpfs mounts small tmpfs file systems for tests: a disk that
// fills, a volume that is unmounted under a running component.
package tmpfs

import (
	"os"
	"testing"

	"golang.org/x/sys/unix"
)

// Mount mounts a tmpfs of size (mount's size=, "4m") at dir, made if
// need be, and unmounts it (lazily, as umount -l) at the test's end. The
// test is skipped where mounting is not allowed: it needs root.
func Mount(t testing.TB, dir, size string) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size="+size); err != nil {
		t.Skipf("cannot mount a tmpfs at %s (the test needs root): %v", dir, err)
	}
	t.Cleanup(func() { unix.Unmount(dir, unix.MNT_DETACH) })
}
