package main_test

import (
	"bytes"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/plover-run/plover/internal/testkit"
)

// The "cold start" log line and the cold request's Server-Timing tell the
// same load time: one measurement, reported twice.
func TestColdStartLogAgreesWithServerTiming(t *testing.T) {
	if testing.Short() {
		t.Skip("builds binaries and starts servers")
	}
	bin := buildPlover(t)
	s := startIsoServer(t, bin, t.TempDir(), nil)
	run(t, bin, []string{"PLOVER_SERVER=" + s.url}, "deploy", testkit.BundleDir(t, testkit.Manifest("echo"), nil))
	resp, err := http.Post(s.url+"/v1/functions/echo/invoke", "application/octet-stream", bytes.NewReader([]byte("x")))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.Header.Get("X-Plover-Start") != "cold" {
		t.Fatalf("start %q, want cold", resp.Header.Get("X-Plover-Start"))
	}
	m := regexp.MustCompile(`load;dur=([0-9.]+)`).FindStringSubmatch(resp.Header.Get("Server-Timing"))
	if m == nil {
		t.Fatalf("Server-Timing %q", resp.Header.Get("Server-Timing"))
	}
	st, _ := strconv.ParseFloat(m[1], 64)
	re := regexp.MustCompile(`msg="cold start" .*load_ms=([0-9.]+) fetch_ms=([0-9.]+) program_ms=([0-9.]+)`)
	var logged, fetch, program float64
	waitFor(t, 5*time.Second, "the cold start log line", func() bool {
		for _, l := range strings.Split(s.log.String(), "\n") {
			if g := re.FindStringSubmatch(l); g != nil {
				logged, _ = strconv.ParseFloat(g[1], 64)
				fetch, _ = strconv.ParseFloat(g[2], 64)
				program, _ = strconv.ParseFloat(g[3], 64)
				return true
			}
		}
		return false
	})
	t.Logf("Server-Timing load %.3f ms; log load_ms %.3f (fetch %.3f, program %.3f)", st, logged, fetch, program)
	if d := logged - st; d > 0.002 || d < -0.002 || fetch+program > logged+0.002 {
		t.Fatalf("log load_ms %.3f, Server-Timing load %.3f, parts %.3f+%.3f", logged, st, fetch, program)
	}
}
