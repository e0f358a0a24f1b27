package scripts

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// houseStandIn is a build's plover for bench-house.sh's test: serve answers
// every request 200 and logs each invoke, bench logs itself and prints
// its build's canned report, deploy does nothing. Build "bad" fails one of
// vecadd's requests and gives no report of the CNN at 4 clients.
const houseStandIn = `#!/usr/bin/env python3
import http.server, json, os, sys
build = os.path.basename(os.path.dirname(os.path.abspath(__file__)))[len("ab-bin-"):]
log = os.path.join(os.environ["AB"], "calls.log")
args = sys.argv[1:]
def note(line):
    with open(log, "a") as f:
        f.write(build + " " + line + "\n")
if args[0] == "serve":
    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200); self.end_headers()
        def do_POST(self):
            self.rfile.read(int(self.headers["Content-Length"]))
            note("invoke " + self.path)
            self.send_response(200); self.end_headers()
        def log_message(self, *a): pass
    host, port = args[args.index("--listen") + 1].rsplit(":", 1)
    http.server.HTTPServer((host, int(port)), H).serve_forever()
elif args[0] == "bench":
    fn, clients = args[1], args[args.index("--concurrency") + 1]
    note("bench " + fn + " " + clients)
    ok, errors = 100, []
    if build == "bad" and fn == "cnn" and clients == "4":
        sys.exit(1)
    if build == "bad" and fn == "vecadd":
        ok, errors = 99, [{"status": 503, "count": 1, "message": "unavailable:  no worker"}]
    print(json.dumps({"latency_ms": {"p50": 0.3, "p99": 0.9}, "throughput_per_s": 250.4, "ok": ok, "requests": 100,
        "errors": errors, "server_ms": {"total": {"p50": 0.2}, "kernels": {"p50": 0.1}}}))
`

// bench-house.sh counts each build's requests, and a row whose requests
// failed ends FAILED and fails the script: its p50, p99 and requests/s
// alone made a build that fails some requests look faster. Each function
// gets untimed requests before its benches.
func TestBenchHouseSaysFailedRequests(t *testing.T) {
	for _, tool := range []string{"bash", "python3", "curl"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s not found", tool)
		}
	}
	ab := t.TempDir()
	for _, build := range []string{"good", "bad"} {
		writeUnder(t, ab, "ab-bin-"+build+"/plover", []byte(houseStandIn), 0o755)
		writeUnder(t, ab, "ab-"+build+"/build/samples/vecadd-input.bin", []byte("0123456789abcdef"), 0o644)
	}
	cmd := exec.Command("bash", "bench-house.sh", "1", "good", "bad")
	cmd.Env = append(os.Environ(), "AB="+ab)
	b, err := cmd.CombinedOutput()
	out := string(b)
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 {
		t.Errorf("exit %v, want 1 (a row failed):\n%s", err, out)
	}
	for _, want := range []string{
		"round 1 good cnn-c1 p50/p99/rps/ok: 0.3 0.9 250 100/100 | server total/kernels/dispatch p50: 0.2 0.1 - | cnn-c4 p50/p99/rps/ok: 0.3 0.9 250 100/100 | vecadd p50/p99/rps/ok: 0.3 0.9 250 100/100\n",
		"round 1 bad cnn-c1 p50/p99/rps/ok: 0.3 0.9 250 100/100 | server total/kernels/dispatch p50: 0.2 0.1 - | cnn-c4 p50/p99/rps/ok: FAILED: no report from plover bench | vecadd p50/p99/rps/ok: 0.3 0.9 250 99/100 FAILED: 503 x 1: unavailable: no worker | FAILED\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("the output lacks %q:\n%s", want, out)
		}
	}
	calls, err := os.ReadFile(filepath.Join(ab, "calls.log"))
	if err != nil {
		t.Fatal(err)
	}
	for _, build := range []string{"good", "bad"} {
		var seq []string
		for _, l := range strings.Split(string(calls), "\n") {
			if rest, ok := strings.CutPrefix(l, build+" "); ok {
				seq = append(seq, rest)
			}
		}
		warm := strings.Repeat("invoke /v1/functions/cnn/invoke,invoke /v1/functions/vecadd/invoke,", 3)
		if got := strings.Join(seq, ","); got != warm+"bench cnn 1,bench cnn 4,bench vecadd 1" {
			t.Errorf("%s's calls: %s; want 3 untimed requests to each function, then the benches", build, got)
		}
	}
}
