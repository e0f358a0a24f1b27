package main_test

import (
	"os"
	"runtime"
	"strconv"
	"testing"
)

// The server runs twice the Go processors the runtime would give it,
// unless GOMAXPROCS says how many: a thread moving a flood's bytes at the
// flood's CPU weight holds its processor while the kernel runs others
// first, and a quiet function's request must still find one.
func TestServerGoProcessors(t *testing.T) {
	bin := buildPlover(t)
	if os.Getenv("GOMAXPROCS") != "" {
		t.Skip("GOMAXPROCS is set for the tests: the runtime's own choice is not known here")
	}
	for _, tc := range []struct {
		name string
		env  []string
		want int
	}{
		{"twice the runtime's", nil, 2 * runtime.GOMAXPROCS(0)},
		{"GOMAXPROCS says", []string{"GOMAXPROCS=3"}, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := startIsoServer(t, bin, t.TempDir(), tc.env)
			if got := metric(t, srv.url, "go_sched_gomaxprocs_threads"); got != float64(tc.want) {
				t.Fatalf("go_sched_gomaxprocs_threads = %v, want %s", got, strconv.Itoa(tc.want))
			}
		})
	}
}
