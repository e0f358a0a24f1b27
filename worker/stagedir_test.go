package worker

import (
	"context"
	"errors"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/plover-run/plover/device"
	"github.com/plover-run/plover/internal/testkit"
)

// The stages' directory removed under a running server (a tmp cleaner, an
// operator's rm -rf DATA/workers) is made again, once, and loads go on:
// standby workers whose stages went with it are not handed out. Before, no
// worker started ("stat failed") and every standby one failed its load
// ("stage ...: no such file or directory") until a restart. Where it cannot
// be made again (its parent gone too), the load's error says which
// directory and why.
func TestStagesRemovedUnderTheServer(t *testing.T) {
	for _, tc := range []struct {
		name    string
		standby int
		remove  func(stages string) string // what it removes
		wantErr string                     // "": the load works
	}{
		{"no standby workers", 0, func(s string) string { return s }, ""},
		{"standby workers", 2, func(s string) string { return s }, ""},
		{"its parent removed too", 0, filepath.Dir, "the workers' stage directory was removed under the server and could not be made again"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			stages := filepath.Join(t.TempDir(), "data", "workers")
			if err := os.MkdirAll(stages, 0o700); err != nil {
				t.Fatal(err)
			}
			var log testkit.LogBuffer
			d := NewDevice(Options{Exe: os.Args[0], Base: device.NewHost(0), Standby: tc.standby, Landlock: true, StageDir: stages,
				Spawner: spawner, Log: slog.New(slog.NewTextHandler(&log, nil))})
			t.Cleanup(func() { d.Close() })
			m := testkit.Manifest("staged")
			load(t, d, m)
			waitFor(t, "the standby pool", func() bool { return len(d.standby) == tc.standby })
			if err := os.RemoveAll(tc.remove(stages)); err != nil {
				t.Fatal(err)
			}
			p, err := d.Load(context.Background(), device.ProgramSpec{Dir: testkit.BundleDir(t, m, nil), Manifest: m})
			if err == nil {
				t.Cleanup(func() { p.Close() })
			}
			made := strings.Count(log.String(), "removed under it: made again")
			switch {
			case tc.wantErr == "" && err != nil:
				t.Fatalf("a load after the stages' directory was removed: %v", err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr) || !errors.Is(err, syscall.ENOENT)):
				t.Fatalf("a load after the data directory was removed: %v, want %q with its errno", err, tc.wantErr)
			case tc.wantErr == "" && made != 1:
				t.Errorf("the log says %d times that the directory was made again, want once:\n%s", made, log.String())
			case tc.wantErr != "" && made != 0:
				t.Errorf("the log says the directory was made again, which it was not:\n%s", log.String())
			}
			if tc.wantErr != "" {
				if _, err := os.Lstat(tc.remove(stages)); !errors.Is(err, fs.ErrNotExist) {
					t.Errorf("the removed parent was made again: %v", err)
				}
				return
			}
			if fi, err := os.Lstat(stages); err != nil || !fi.IsDir() || fi.Mode().Perm() != 0o700 {
				t.Errorf("the stages' directory made again: %v, %v; want a directory of mode 0700", fi, err)
			}
		})
	}
}
