package cli

import (
	"log/slog"
	"math"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// --max-body-memory is refused, naming the flag, when it is negative or
// more MiB than a byte count holds: 2^44+1 MiB wrapped to a budget of 1
// MiB, 2^43 MiB to a negative one (no limit), while the log said what
// was asked.
func TestMaxBodyMemoryBounds(t *testing.T) {
	for _, tc := range []struct {
		mib  int64
		want string // "": accepted
		max  int64
	}{
		{0, "", 0},
		{1024, "", 1 << 30},
		{1<<43 - 1, "", (1<<43 - 1) << 20},
		{-1, "--max-body-memory -1: want 0 (no limit) to 8796093022207 MiB", 0},
		{1 << 43, "--max-body-memory 8796093022208: want 0 (no limit) to 8796093022207 MiB", 0},
		{1<<44 + 1, "--max-body-memory 17592186044417: want 0 (no limit) to 8796093022207 MiB", 0},
	} {
		d, err := newFrontDoor(&serveFlags{maxBodyMemMB: tc.mib}, slog.New(slog.DiscardHandler), prometheus.NewRegistry())
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("--max-body-memory %d: %v; want %d bytes", tc.mib, err, tc.max)
		case tc.want == "" && d.budget.Max() != tc.max:
			t.Errorf("--max-body-memory %d: a budget of %d bytes; want %d", tc.mib, d.budget.Max(), tc.max)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("--max-body-memory %d: %v; want %q", tc.mib, err, tc.want)
		}
	}
}

// --max-spool is 4 times --max-body where unset, at least 1 GiB, and as
// given otherwise.
func TestSpoolBudget(t *testing.T) {
	for _, tc := range []struct{ mib, bundle, want int64 }{
		{0, 256 << 20, 1 << 30},
		{0, 1 << 30, 4 << 30},
		{0, 1 << 20, 1 << 30},
		{512, 256 << 20, 512 << 20},
		{0, 1 << 62, math.MaxInt64}, // 4 times it would wrap
	} {
		if got := spoolBudget(tc.mib, tc.bundle); got != tc.want {
			t.Errorf("spoolBudget(%d MiB, --max-body %d) = %d, want %d", tc.mib, tc.bundle, got, tc.want)
		}
	}
}
