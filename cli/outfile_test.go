package cli

import (
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// echoOut is a server that answers every invoke outAnswer, whole.
func echoOut(t *testing.T) *rawServer {
	return newRawServer(t, func(c net.Conn, _ *http.Request) {
		io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nContent-Length: 6\r\n\r\n"+outAnswer)
	})
}

// inFile is an input file for an invoke.
func inFile(t *testing.T) string {
	in := filepath.Join(t.TempDir(), "in")
	if err := os.WriteFile(in, []byte("input"), 0o644); err != nil {
		t.Fatal(err)
	}
	return in
}

// tempsIn is the temporary files beside base in dir.
func tempsIn(dir, base string) []string {
	ents, _ := os.ReadDir(dir)
	var names []string
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), "."+base+".plover-") {
			names = append(names, e.Name())
		}
	}
	return names
}

// --out's temporary file is 0600 while the output is written: made
// 0666&umask (0644), it let others read a 0600 FILE's new contents beside
// it, and kept them readable where it was left behind. A FILE made for the
// output still gets the umask's mode.
func TestInvokeOutTemporaryFileIsPrivate(t *testing.T) {
	defer syscall.Umask(syscall.Umask(0o022)) // 0644 unless made 0600
	for _, tt := range []struct {
		name      string
		old       bool // FILE there before, 0600
		wantFinal os.FileMode
	}{{"a 0600 FILE", true, 0o600}, {"a new FILE", false, 0o644}} {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			out := filepath.Join(dir, "secret.bin")
			if tt.old {
				writeOwned(t, out, "old secret", 0o600, 0)
			}
			modes := make(chan os.FileMode, 1)
			srv := newRawServer(t, func(c net.Conn, _ *http.Request) {
				io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nContent-Length: 17\r\n\r\nSECRET-")
				time.Sleep(50 * time.Millisecond) // written to the temporary file
				mode := os.FileMode(0o7777)
				if names := tempsIn(dir, "secret.bin"); len(names) == 1 {
					if fi, err := os.Stat(filepath.Join(dir, names[0])); err == nil {
						mode = fi.Mode().Perm()
					}
				}
				modes <- mode
				io.WriteString(c, "PART-DONE!")
			})
			if _, errs, code := runMain(t, nil, "invoke", "f", "--server", srv.url(), "--in", inFile(t), "--out", out); code != 0 {
				t.Fatalf("exit %d, stderr %q", code, errs)
			}
			if m := <-modes; m != 0o600 {
				t.Errorf("the temporary file was %v while the output was written; want 0600 (7777: none, or more than one)", m)
			}
			fileHolds(t, out, "SECRET-PART-DONE!")
			if fi, err := os.Stat(out); err != nil || fi.Mode().Perm() != tt.wantFinal {
				t.Errorf("%s: %v (%v); want %v", out, fi.Mode(), err, tt.wantFinal)
			}
		})
	}
}

// A new FILE named through link/.. is made where the kernel makes it, in
// the parent of link's target: the path was cleaned before its links were
// followed, and it was made in link's own directory. So is a dangling
// link's target that holds a link/..
func TestInvokeOutThroughALinksParent(t *testing.T) {
	srv := echoOut(t)
	dd := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dd, "real", "deep"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("real/deep", filepath.Join(dd, "link")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("link/../made.bin", filepath.Join(dd, "dangling")); err != nil {
		t.Fatal(err)
	}
	// Where the kernel makes them: real/, not dd/.
	if err := os.WriteFile(dd+"/link/../shell.bin", nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dd, "real", "shell.bin")); err != nil {
		t.Fatalf("the kernel made link/../shell.bin elsewhere: %v", err)
	}
	for _, tt := range []struct{ out, made string }{
		{dd + "/link/../cli.bin", "cli.bin"},
		{dd + "/dangling", "made.bin"},
	} {
		if _, errs, code := runMain(t, nil, "invoke", "f", "--server", srv.url(), "--in", inFile(t), "--out", tt.out); code != 0 {
			t.Fatalf("--out %s: exit %d, stderr %q", tt.out, code, errs)
		}
		fileHolds(t, filepath.Join(dd, "real", tt.made), outAnswer)
		if _, err := os.Lstat(filepath.Join(dd, tt.made)); err == nil {
			t.Errorf("--out %s made %s in %s; want it in real/ alone", tt.out, tt.made, dd)
		}
	}
}

// A FILE with a set-id or sticky bit, or extended attributes, is written
// in place, the same file: a rename over it would drop them (renamable).
func TestInvokeOutKeepsSetIDAndXattrFiles(t *testing.T) {
	srv := echoOut(t)
	for _, tt := range []struct {
		name string
		mode os.FileMode // as os.Chmod takes it
		attr bool
	}{
		{"setuid", 0o644 | os.ModeSetuid, false},
		{"setgid", 0o644 | os.ModeSetgid, false},
		{"sticky", 0o644 | os.ModeSticky, false},
		{"an extended attribute", 0o644, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			out := filepath.Join(t.TempDir(), "f")
			writeOwned(t, out, "the old output", 0o644, 0)
			if err := os.Chmod(out, tt.mode); err != nil {
				t.Fatal(err)
			}
			if tt.attr {
				if err := unix.Setxattr(out, "user.plover-test", []byte("kept"), 0); err != nil {
					t.Skipf("no user extended attributes here: %v", err)
				}
			}
			before, err := os.Stat(out)
			if err != nil || before.Mode() != tt.mode {
				t.Skipf("%s: mode %v (%v); cannot set %v here", out, before.Mode(), err, tt.mode)
			}
			if _, errs, code := runMain(t, nil, "invoke", "f", "--server", srv.url(), "--in", inFile(t), "--out", out); code != 0 {
				t.Fatalf("exit %d, stderr %q", code, errs)
			}
			fileHolds(t, out, outAnswer)
			if after, err := os.Stat(out); err != nil || !os.SameFile(before, after) {
				t.Errorf("%s is another file now (%v): renamed over, not written in place", out, err)
			}
		})
	}
}

// --out "" names the flag and the mistake, before any request: it said
// "open : no such file or directory", after three tries.
func TestInvokeOutEmptyPath(t *testing.T) {
	srv := echoOut(t)
	_, errs, code := runMain(t, nil, "invoke", "f", "--server", srv.url(), "--in", inFile(t), "--out", "")
	if code != 1 || errs != "plover invoke: --out: empty path\n" {
		t.Fatalf("exit %d, stderr %q", code, errs)
	}
	if got := srv.requests(); len(got) != 0 {
		t.Errorf("the server got %q; want nothing sent", got)
	}
}
