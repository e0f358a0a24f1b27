package fileutil

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// MakeAgain makes a server's directory again where a call's failure is
// the directory being gone, and only then: never where what is gone is in
// it, nor through a link planted in its place, nor its parent; the call
// that made it logs so, once.
func TestMakeAgain(t *testing.T) {
	gone := &fs.PathError{Op: "open", Err: syscall.ENOENT}
	for _, tc := range []struct {
		name      string
		setup     func(t *testing.T, dir string) // dir is there before it
		err       error
		again     bool
		goneErrno syscall.Errno // 0: no GoneError
	}{
		{"removed", func(t *testing.T, dir string) { os.Remove(dir) }, gone, true, 0},
		{"there, a file in it gone", func(*testing.T, string) {}, gone, false, 0},
		{"removed, another failure", func(t *testing.T, dir string) { os.Remove(dir) }, syscall.EROFS, false, 0},
		{"removed, no failure", func(t *testing.T, dir string) { os.Remove(dir) }, nil, false, 0},
		{"its parent removed", func(t *testing.T, dir string) { os.RemoveAll(filepath.Dir(dir)) }, gone, false, syscall.ENOENT},
		{"a dangling link in its place", func(t *testing.T, dir string) {
			os.Remove(dir)
			if err := os.Symlink(dir+".target", dir); err != nil {
				t.Fatal(err)
			}
		}, gone, false, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "data", "cache")
			if err := os.MkdirAll(dir, 0o700); err != nil {
				t.Fatal(err)
			}
			tc.setup(t, dir)
			var log strings.Builder
			again, gerr := MakeAgain(dir, fmt.Errorf("bundle cache: %w", tc.err), slog.New(slog.NewTextHandler(&log, nil)), "bundle cache")
			var ge *GoneError
			switch {
			case again != tc.again:
				t.Errorf("again %v, want %v (error %v)", again, tc.again, gerr)
			case tc.goneErrno == 0 && gerr != nil:
				t.Errorf("an error: %v", gerr)
			case tc.goneErrno != 0 && (!errors.As(gerr, &ge) || ge.What != "bundle cache" || !errors.Is(gerr, tc.goneErrno)):
				t.Errorf("error %v, want a GoneError of the bundle cache with %v", gerr, tc.goneErrno)
			}
			if made := strings.Count(log.String(), "removed under it: made again"); made != map[bool]int{true: 1}[tc.again] {
				t.Errorf("the log says %d times that it was made again:\n%s", made, log.String())
			}
			if tc.again {
				if fi, err := os.Lstat(dir); err != nil || !fi.IsDir() || fi.Mode().Perm() != 0o700 {
					t.Errorf("made again: %v, %v; want a directory of mode 0700", fi, err)
				}
			}
			if _, err := os.Lstat(dir + ".target"); !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("a directory was made through the link: %v", err)
			}
		})
	}
}

// ownDir takes a directory of this process's user, and nothing else in
// its place: what MakeAgain finds there where another call made it first.
func TestOwnDir(t *testing.T) {
	for _, tc := range []struct {
		name  string
		setup func(t *testing.T, dir string)
		errno syscall.Errno // 0: taken
	}{
		{"our directory", func(*testing.T, string) {}, 0},
		{"a link to our directory", func(t *testing.T, dir string) {
			os.Remove(dir)
			if err := os.Symlink(t.TempDir(), dir); err != nil {
				t.Fatal(err)
			}
		}, syscall.ENOTDIR},
		{"a file", func(t *testing.T, dir string) {
			os.Remove(dir)
			if err := os.WriteFile(dir, nil, 0o600); err != nil {
				t.Fatal(err)
			}
		}, syscall.ENOTDIR},
		{"another user's directory", func(t *testing.T, dir string) {
			if os.Geteuid() != 0 {
				t.Skip("needs root to give a directory to another user")
			}
			if err := os.Chown(dir, 65534, 65534); err != nil {
				t.Fatal(err)
			}
		}, syscall.EPERM},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "cache")
			if err := os.Mkdir(dir, 0o700); err != nil {
				t.Fatal(err)
			}
			tc.setup(t, dir)
			err := ownDir(dir)
			if tc.errno == 0 && err != nil || tc.errno != 0 && !errors.Is(err, tc.errno) {
				t.Errorf("ownDir: %v, want %v", err, tc.errno)
			}
		})
	}
}
