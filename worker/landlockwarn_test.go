package worker

import (
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/plover-run/plover/device"
	"github.com/plover-run/plover/internal/testkit"
	"github.com/plover-run/plover/worker/contain"
)

// On a kernel whose Landlock does not scope signals (ABI below 6), workers
// of one uid can signal one another, another tenant's included: the
// server says so once, at the first worker's start, and says nothing on a
// kernel that scopes them.
func TestLandlockWithoutSignalScopingIsTold(t *testing.T) {
	if contain.LandlockABI() < 1 {
		t.Skip("no Landlock on this kernel")
	}
	t.Cleanup(func() { landlockABI = contain.LandlockABI })
	for _, c := range []struct {
		abi  int
		told int
	}{{4, 1}, {landlockScopesSignals, 0}} {
		landlockABI = func() int { return c.abi }
		var logged testkit.LogBuffer
		d := NewDevice(Options{Exe: os.Args[0], Base: device.NewHost(0), Landlock: true, StageDir: t.TempDir(), Spawner: spawner,
			Log: slog.New(slog.NewTextHandler(&logged, nil))})
		for range 2 {
			p, m := loadOutput(t, d, "say", 1, 1)
			if err := runOnce(t, p, m, []byte("hi"), 10*time.Second); err != nil {
				t.Fatal(err)
			}
			p.Close()
		}
		d.Close()
		if n := strings.Count(logged.String(), "does not scope signals"); n != c.told {
			t.Errorf("Landlock ABI %d: told %d times, want %d:\n%s", c.abi, n, c.told, logged.String())
		}
	}
}
