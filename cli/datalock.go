package cli

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// lockData takes the lock of the --data directory dir for this server,
// held until the returned file is closed (or the process ends), before
// anything under dir is touched: a second server on the same directory
// removed the first's half-done work and spool as a crash's leftovers,
// emptied its workers' stages, and evicted bundles its workers were
// starting from (a review's finding). Refused, naming the lock, where
// another process holds it.
func lockData(dir string) (*os.File, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("--data %s: %w", dir, err)
	}
	path := filepath.Join(dir, "lock")
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("--data %s: its lock file: %w", dir, err)
	}
	for {
		err = unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if !errors.Is(err, unix.EINTR) {
			break
		}
	}
	switch {
	case errors.Is(err, unix.EWOULDBLOCK):
		f.Close()
		return nil, fmt.Errorf("--data %s: another plover serve uses it (it holds %s): give each server a --data of its own", dir, path)
	case err != nil:
		f.Close()
		return nil, fmt.Errorf("--data %s: locking %s: %w", dir, path, err)
	}
	return f, nil
}
