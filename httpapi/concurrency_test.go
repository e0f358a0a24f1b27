package httpapi_test

import (
	"math"
	"testing"

	"github.com/plover-run/plover/frontdoor"
	"github.com/plover-run/plover/httpapi"
)

// fasthttp serves at most its Concurrency connections at once, 262,144
// unless set, and answers the rest a 503 of its own that names no flag
// and no metric counts. Under a --max-conns above it (one derived from a
// container's open-file limit) it was the API port's real bound, and the
// per-client cap below --max-conns never came into play (a review's
// finding): it is set past --max-conns now, so the listener's limits are
// the ones that hold.
func TestFasthttpServesWhatTheListenerLetsThrough(t *testing.T) {
	for _, max := range []int{1000, 786_432, 805_306_362, math.MaxInt} {
		s := httpapi.New(frontdoor.New(frontdoor.Config{}), nil, httpapi.Options{MaxConns: max})
		got := httpapi.Concurrency(s)
		if got == 0 {
			got = 256 * 1024 // fasthttp's DefaultConcurrency
		}
		if got < min(max, math.MaxInt/2) { // past it, as many as an int holds: the sum wrapped to the default
			t.Errorf("--max-conns %d: fasthttp serves %d at once, want at least --max-conns", max, got)
		}
	}
}
