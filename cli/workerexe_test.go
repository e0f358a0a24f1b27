package cli

import (
	"log/slog"
	"os"
	"path/filepath"
	"testing"
)

// plover-worker beside plover is used only when it is an executable file
// that nobody but its owner can write; otherwise the server runs itself.
func TestWorkerExeBeside(t *testing.T) {
	for _, tc := range []struct {
		name string
		mode os.FileMode // 0: no plover-worker
		want bool
	}{
		{"missing", 0, false},
		{"executable, owner-writable", 0o755, true},
		{"not executable", 0o644, false},
		{"group-writable", 0o775, false},
		{"world-writable", 0o757, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			self := filepath.Join(dir, "plover")
			if err := os.WriteFile(self, []byte("x"), 0o755); err != nil {
				t.Fatal(err)
			}
			lean := filepath.Join(dir, "plover-worker")
			if tc.mode != 0 {
				if err := os.WriteFile(lean, []byte("x"), 0o600); err != nil {
					t.Fatal(err)
				}
				if err := os.Chmod(lean, tc.mode); err != nil { // past the umask
					t.Fatal(err)
				}
			}
			got := workerExeBeside(self, slog.New(slog.DiscardHandler))
			if want := map[bool]string{true: lean, false: "/proc/self/exe"}[tc.want]; got != want {
				t.Fatalf("workerExeBeside = %q, want %q", got, want)
			}
		})
	}
}

// The standby pool's floor and ceiling by target: the defaults, explicit
// values, and 0 turning the pool off unless a ceiling is given.
func TestStandbySizes(t *testing.T) {
	for _, tc := range []struct {
		target              string
		floor, ceiling      int
		wantFloor, wantCeil int
	}{
		{"host", -1, 0, 8, 16},
		{"cuda", -1, 0, 1, 4},
		{"host", 0, 0, 0, 0},
		{"cuda", 0, 0, 0, 0},
		{"host", 0, 5, 0, 5},
		{"host", 2, 0, 2, 16},
		{"host", 20, 0, 20, 20},
		{"cuda", 3, 2, 3, 3},
	} {
		f, c := standbySizes(tc.target, tc.floor, tc.ceiling)
		if f != tc.wantFloor || c != tc.wantCeil {
			t.Errorf("standbySizes(%s, %d, %d) = %d, %d; want %d, %d", tc.target, tc.floor, tc.ceiling, f, c, tc.wantFloor, tc.wantCeil)
		}
	}
}
