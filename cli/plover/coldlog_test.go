package main_test

import (
	"bytes"
	"fmt"
	"math"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/plover-run/plover/internal/testkit"
)

// serverTimingParts are the Server-Timing entries that add up to a
// function request's total.
var serverTimingParts = []string{"resolve", "queue", "sched", "load", "copyin", "kernels", "copyout", "dispatch"}

// parseServerTiming reads name;dur=ms entries.
func parseServerTiming(h string) map[string]float64 {
	out := map[string]float64{}
	for _, e := range strings.Split(h, ",") {
		name, params, _ := strings.Cut(strings.TrimSpace(e), ";")
		for _, p := range strings.Split(params, ";") {
			if v, ok := strings.CutPrefix(strings.TrimSpace(p), "dur="); ok {
				if f, err := strconv.ParseFloat(v, 64); err == nil {
					out[name] = f
				}
			}
		}
	}
	return out
}

// logFields reads a logfmt line's key=number fields.
func logFields(line string) map[string]float64 {
	out := map[string]float64{}
	for _, m := range regexp.MustCompile(`(\w+)=([0-9.]+)(?:\s|$)`).FindAllStringSubmatch(line, -1) {
		out[m[1]], _ = strconv.ParseFloat(m[2], 64)
	}
	return out
}

// A request's Server-Timing parts add up to its total, and the "cold start"
// log line tells the same load as the cold request's header, in parts that
// add up to it (issue 42, item 7: after a scale to zero, ~400 ms of a cold
// request's total were in no part, and the log's total_ms, fetch plus
// program, read below its load_ms). The first request after the deploy,
// the first after the function scaled to zero, and a hot one after it.
func TestColdStartTimingAddsUp(t *testing.T) {
	if testing.Short() {
		t.Skip("builds binaries and starts servers")
	}
	bin := buildPlover(t)
	s := startIsoServer(t, bin, t.TempDir(), nil, "--idle-ttl", "1s")
	run(t, bin, []string{"PLOVER_SERVER=" + s.url}, "deploy", testkit.BundleDir(t, testkit.Manifest("echo"), nil))
	in := bytes.Repeat([]byte("x"), 1<<16) // copied into a worker's slot: the request's body did not land in one
	coldLogs := func() []string {
		var ls []string
		for _, l := range strings.Split(s.log.String(), "\n") {
			if strings.Contains(l, `msg="cold start"`) {
				ls = append(ls, l)
			}
		}
		return ls
	}
	for i, tt := range []struct {
		name, start string
		before      func()
	}{
		{"first request", "cold", nil},
		{"after scaling to zero", "cold", func() {
			waitFor(t, 20*time.Second, `the "scaled to zero" log line (--idle-ttl 1s)`, func() bool { return strings.Contains(s.log.String(), `msg="scaled to zero"`) })
		}},
		{"hot", "hot", nil},
	} {
		if tt.before != nil {
			tt.before()
		}
		resp, err := http.Post(s.url+"/v1/functions/echo/invoke", "application/octet-stream", bytes.NewReader(in))
		if err != nil {
			t.Fatalf("%s: %v", tt.name, err)
		}
		resp.Body.Close()
		hdr := resp.Header.Get("Server-Timing")
		if resp.StatusCode != 200 || resp.Header.Get("X-Plover-Start") != tt.start {
			t.Fatalf("%s: status %d, start %q, want 200 and %s (Server-Timing %q)", tt.name, resp.StatusCode, resp.Header.Get("X-Plover-Start"), tt.start, hdr)
		}
		st := parseServerTiming(hdr)
		sum := 0.0
		for _, p := range serverTimingParts {
			v, ok := st[p]
			if !ok {
				t.Fatalf("%s: Server-Timing %q has no %s, want every part of %v", tt.name, hdr, p, serverTimingParts)
			}
			sum += v
		}
		// Each entry is rounded to a microsecond.
		if total := st["total"]; math.Abs(sum-total) > 0.001*float64(len(serverTimingParts)) {
			t.Errorf("%s: Server-Timing parts add up to %.3f ms, its total is %.3f ms (%.3f ms in no part), want them equal within rounding: %s",
				tt.name, sum, total, total-sum, hdr)
		}
		// The run went through a worker process: dispatch names its two
		// waits, the message's for the worker and the reply's for the
		// server, which lie in it.
		off, okOff := st["handoff"]
		back, okBack := st["handback"]
		if !okOff || !okBack || off+back > st["dispatch"]+0.002 {
			t.Errorf("%s: Server-Timing's handoff %.3f and handback %.3f (present: %v, %v), dispatch %.3f: want both, within dispatch: %s",
				tt.name, off, back, okOff, okBack, st["dispatch"], hdr)
		}
		t.Logf("%s: %s", tt.name, hdr)
		if tt.start != "cold" {
			continue
		}
		var line string
		waitFor(t, 5*time.Second, fmt.Sprintf("cold start log line %d", i+1), func() bool {
			if ls := coldLogs(); len(ls) > i {
				line = ls[i]
				return true
			}
			return false
		})
		f := logFields(line)
		if _, ok := f["total_ms"]; ok {
			t.Errorf("%s: the cold start line has a total_ms, which is not the request's total (the request has not run when it is logged): %s", tt.name, line)
		}
		parts := f["fetch_ms"] + f["program_ms"] + f["instance_ms"] + f["wait_ms"]
		switch {
		case math.Abs(f["load_ms"]-st["load"]) > 0.002:
			t.Errorf("%s: the log's load_ms %.3f, Server-Timing's load %.3f: want the same measurement\n%s", tt.name, f["load_ms"], st["load"], line)
		case math.Abs(parts-f["load_ms"]) > 0.005 || f["program_ms"] <= 0 || f["instance_ms"] <= 0:
			t.Errorf("%s: fetch_ms + program_ms + instance_ms + wait_ms = %.3f, load_ms %.3f: want them equal, program and instance above 0\n%s", tt.name, parts, f["load_ms"], line)
		}
	}
}
