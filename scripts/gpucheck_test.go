// Package scripts holds no Go code: its test checks scripts/gpu-check.sh's
// budget here, without a GPU, against stand-ins for the binaries that hang.
package scripts

import (
	"cmp"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// checkTree lays out what gpu-check.sh runs from: the script, and stand-ins
// for bin/plover (serve answers /healthz from a tiny HTTP server; every
// other command runs cmd), bin/device.test, bin/plover-bench-suite and
// nvidia-smi that sleep, as a hung GPU step would.
func checkTree(t *testing.T, plover string) (root, path string) {
	t.Helper()
	for _, tool := range []string{"bash", "timeout", "python3", "curl", "tar"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s not found", tool)
		}
	}
	root = t.TempDir()
	src, err := os.ReadFile("gpu-check.sh")
	if err != nil {
		t.Fatal(err)
	}
	write := func(rel, text string, mode os.FileMode) { writeUnder(t, root, rel, []byte(text), mode) }
	write("scripts/gpu-check.sh", string(src), 0o755)
	hang := "#!/bin/sh\necho \"$0 $*\"\nexec sleep 600\n"
	write("bin/device.test", hang, 0o755)
	write("bin/plover-bench-suite", hang, 0o755)
	write("bin/plover-worker", hang, 0o755)
	write("bin/plover", `#!/bin/sh
if [ "$1" = serve ]; then
  while [ "$1" != --listen ]; do shift; done
  exec python3 -c '
import http.server, sys
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers(); self.wfile.write(b"{\"ok\":true}")
    def log_message(self, *a): pass
host, port = sys.argv[1].rsplit(":", 1)
http.server.HTTPServer((host, int(port)), H).serve_forever()' "$2"
fi
`+plover+"\n", 0o755)
	write("build/cudatest/testkernels.so", "", 0o644)
	write("device/.keep", "", 0o644) // the device tests run from there
	for _, d := range []string{"vecadd-cuda", "vecadd-host"} {
		write("build/samples/"+d+"/plover.json", "{}", 0o644)
	}
	write("build/samples/vecadd-input.bin", "x", 0o644)
	write("path/nvidia-smi", "#!/bin/sh\necho 'name, driver_version, memory.total'\necho 'Stand-in GPU, 0, 0 MiB'\n", 0o755)
	return root, filepath.Join(root, "path") + ":" + os.Getenv("PATH")
}

// writeUnder writes b to root/rel, making its folders.
func writeUnder(t *testing.T, root, rel string, b []byte, mode os.FileMode) {
	t.Helper()
	p := filepath.Join(root, rel)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, b, mode); err != nil {
		t.Fatal(err)
	}
}

// runCheck runs the check with env and returns its report and wall time;
// $OUT must hold the report and the logs' archive whatever happened.
func runCheck(t *testing.T, root, path string, env ...string) (string, time.Duration) {
	t.Helper()
	out := filepath.Join(root, "out")
	cmd := exec.Command("bash", "scripts/gpu-check.sh")
	cmd.Dir = root
	cmd.Env = append([]string{"PATH=" + path, "HOME=" + root, "OUT=" + out, "PORT=" + strconv.Itoa(30000+os.Getpid()%20000)}, env...)
	start := time.Now()
	b, _ := cmd.CombinedOutput()
	took := time.Since(start)
	report, err := os.ReadFile(filepath.Join(out, "gpu-check.txt"))
	if err != nil {
		t.Fatalf("no report in $OUT: %v; the check printed:\n%s", err, b)
	}
	if _, err := os.Stat(filepath.Join(out, "gpu-check-logs.tgz")); err != nil {
		t.Errorf("no logs' archive in $OUT: %v; report:\n%s", err, report)
	}
	return string(report), took
}

// A step that hangs (the device tests here) is cut where the budget ends,
// the sections it leaves no room for are skipped and named for a second
// call, and the check still writes its summary and packs its logs, inside
// its budget.
func TestGPUCheckCutsAHungStep(t *testing.T) {
	root, path := checkTree(t, "exit 1")
	const budget = 40
	report, took := runCheck(t, root, path, "BUDGET="+strconv.Itoa(budget), "RESERVE=5", "ONLY=tests bench vecadd")
	for _, want := range []string{
		"FAIL: bin/device.test exited 124",
		"SKIP: bench: ",
		`not run for the budget: bench servers vecadd (ONLY="bench servers vecadd" runs them)`,
		"== summary ==",
	} {
		if !strings.Contains(report, want) {
			t.Errorf("the report lacks %q:\n%s", want, report)
		}
	}
	if took > budget*time.Second {
		t.Errorf("the check took %v, past its budget of %d s", took, budget)
	}
}

// An archive of binaries that does not unpack is a failure that stops the
// check: on a warm machine bin/ still holds the previous run's binaries
// (the stand-ins here), which would otherwise be checked in its place.
func TestGPUCheckStopsOnABadArchive(t *testing.T) {
	root, path := checkTree(t, "exit 1")
	writeUnder(t, root, "build/gpu-bin.tgz", []byte("not a gzip archive"), 0o644)
	report, _ := runCheck(t, root, path, "BUDGET=60", "RESERVE=5", "ONLY=tests")
	if !strings.Contains(report, "FAIL: build/gpu-bin.tgz did not unpack") {
		t.Errorf("the report does not count the archive as a failure:\n%s", report)
	}
	if strings.Contains(report, "== CUDA device tests") || strings.Contains(report, "ok  bin/plover") {
		t.Errorf("the check went on with the binaries already in bin/:\n%s", report)
	}
}

// A step that no section bounds (a deploy that hangs) meets the budget's
// own timeout: the report says where it stopped and the logs are packed.
func TestGPUCheckStopsAtItsBudget(t *testing.T) {
	root, path := checkTree(t, `exec sleep 600 # deploy, invoke: hang`)
	// vecadd asks for about 10 s, and the servers' start before it took
	// 4 s on a loaded machine: with 15 s vecadd was skipped, not stopped.
	const budget = 25
	report, took := runCheck(t, root, path, "BUDGET="+strconv.Itoa(budget), "RESERVE=2", "ONLY=vecadd")
	if !strings.Contains(report, "STOPPED: the budget of 25 s ran out") || !strings.Contains(report, "== vecadd: CUDA vs host ==") {
		t.Errorf("the report does not say the budget stopped it in vecadd:\n%s", report)
	}
	if took > (budget+12)*time.Second { // the timeout's TERM, then its KILL 10 s later
		t.Errorf("the check took %v with a budget of %d s", took, budget)
	}
}

// The contexts section ends as soon as its processes do, with OUT set (a
// bare wait there once waited for the report's tee until the budget ran
// out), and counts a TestGPUInfo that skipped (no device: PASS all the
// same) as a failure.
func TestGPUCheckContexts(t *testing.T) {
	for _, tc := range []struct {
		name, test, want string
	}{
		{"passed", "--- PASS: TestGPUInfo (0.01s)", "PASS: 3 contexts at once"},
		{"skipped", "--- SKIP: TestGPUInfo (0.00s)", "FAIL: 4 TestGPUInfo run(s) of 4 did not pass"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root, path := checkTree(t, "exit 1")
			stand := "#!/bin/sh\necho '" + tc.test + "'\necho PASS\n"
			if err := os.WriteFile(filepath.Join(root, "bin/device.test"), []byte(stand), 0o755); err != nil {
				t.Fatal(err)
			}
			const budget = 60
			report, took := runCheck(t, root, path, "BUDGET="+strconv.Itoa(budget), "RESERVE=5", "ONLY=contexts", "CONTEXTS=3")
			if !strings.Contains(report, tc.want) || !strings.Contains(report, "3 processes at once: all done in") || strings.Contains(report, "STOPPED") {
				t.Errorf("the report lacks %q, or stopped at the budget:\n%s", tc.want, report)
			}
			if took > 20*time.Second {
				t.Errorf("the check took %v for three stand-ins that end at once", took)
			}
		})
	}
}

// standInServer is a bin/plover whose serve answers /healthz, fails the
// fault bundle's invocations (500, naming CUDA_ERROR_ILLEGAL_ADDRESS) and
// answers 200 to every other; its other commands succeed.
const standInServer = `#!/bin/sh
if [ "$1" = serve ]; then
  while [ "$1" != --listen ]; do shift; done
  exec python3 -c '
import http.server, sys
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers(); self.wfile.write(b"{\"ok\":true}")
    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        fault = "/functions/fault/" in self.path
        self.send_response(500 if fault else 200); self.end_headers()
        self.wfile.write(b"{\"error\":\"kernel_failed: CUDA_ERROR_ILLEGAL_ADDRESS\"}" if fault else b"out")
    def log_message(self, *a): pass
host, port = sys.argv[1].rsplit(":", 1)
http.server.HTTPServer((host, int(port)), H).serve_forever()' "$2"
fi
exit 0
`

// The mps section runs the fairness bench as nobody beside an MPS control
// daemon of its own, both seeing the daemon's directories, then a fault
// and another function on a server as nobody, asking the daemon for its
// clients, and stops the daemon after: here with stand-ins for the
// daemon, the bench and the server.
func TestGPUCheckMPS(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("the section needs root (it runs the bench as nobody)")
	}
	if _, err := exec.LookPath("runuser"); err != nil {
		t.Skip("runuser not found")
	}
	if err := exec.Command("id", "nobody").Run(); err != nil {
		t.Skip("no user nobody")
	}
	// The stand-in bench prints its table, then what its row says, and
	// keeps a server log where --server-logs (its second to last
	// argument pair) says.
	const bench = "#!/bin/sh\necho \"| fair | as $(id -un), pipes in $CUDA_MPS_PIPE_DIRECTORY, $*\"\n" +
		"while [ \"$1\" != --server-logs ]; do shift; done; mkdir -p \"$2\" && echo stand-in server log >\"$2/server-001.log\"\n"
	// The stand-in device suite's TestGPUContained: its children pass.
	const contained = `echo "    --- PASS: TestGPUContained/all (2.31s)"; echo "--- PASS: TestGPUContained (9.90s) as $(id -un) $*"; echo PASS; exit 0`
	for _, tc := range []struct {
		name, row, contained string
		want                 []string
		clients              string // the stand-in daemon's get_client_list ("": a worker's pid)
	}{
		{"served", "", contained, []string{"PASS: the fairness bench as nobody",
			"under MPS: get_client_list 4242: 4343", "PASS: under MPS: the Plover server (pid ",
			"--- PASS: TestGPUContained (9.90s) as nobody -test.count=1 -test.timeout=",
			"-test.v -test.run ^TestGPUContained$",
			"PASS: a worker's containment under MPS as nobody",
			"nobody's tasks during the run: at most "}, ""},
		// A child under one step failed (and so all): the check names
		// them, apart from the one-process suite's verdict.
		{"a containment step failed", "", `echo "    --- FAIL: TestGPUContained/landlock (0.20s)"; echo "    --- FAIL: TestGPUContained/all (0.30s)"; echo "--- FAIL: TestGPUContained (3.00s)"; echo FAIL; exit 1`,
			[]string{"FAIL: a worker's containment under MPS as nobody: failed landlock all (exit 1; mps-contained.txt)",
				"PASS: the device suite under MPS as nobody, one process"}, ""},
		// The first MPS run on a GPU (2026-12-04): every request failed,
		// the suite exited 0 with its tables saying so, and this said PASS.
		// Then the same without the daemon tells MPS from a server run
		// as nobody: here it serves.
		{"every request failed", `[ -n "$CUDA_MPS_PIPE_DIRECTORY" ] && echo "| fair | 0 / 0 (**1 failed, 2 never sent**) |" && echo "**Requests lost to the figures above** (failed: a non-2xx answer or none; never sent: due, not sent by its end): fair, the victim alone: 1 failed, 2 never sent (the most common: status 503: no worker)."; true`, contained,
			[]string{"FAIL: the fairness bench as nobody: requests failed (fair, the victim alone: 1 failed, 2 never sent (the most common: status 503: no worker).; mps.md, mps-servers/)",
				"-- the same as nobody without MPS, to tell the two apart",
				"| fair | as nobody, pipes in , --plover",
				"PASS: the fairness bench as nobody (MPS off)"}, ""},
		// The suite stops as its server serves nothing, its reason on a
		// line above the server's log it quotes, longer than the tail
		// the check shows: the reason is shown too.
		{"the suite stopped", `[ -n "$CUDA_MPS_PIPE_DIRECTORY" ] || exit 0; echo "plover-bench-suite: --sched fair: mode fair: every request to cnn failed as the server warmed up (4; status 503: stand-in); the server's log ends:"; for i in $(seq 30); do echo "{\"msg\":\"line $i\"}"; done; exit 1`, contained,
			[]string{"FAIL: the fairness bench as nobody (exit 1; mps.md, mps-servers/)",
				"plover-bench-suite: --sched fair: mode fair: every request to cnn failed as the server warmed up (4; status 503: stand-in)",
				`{"msg":"line 30"}`,
				"PASS: the fairness bench as nobody (MPS off)"}, ""},
		// The Plover server is an MPS client (as before issue 61: its
		// own context on each GPU): the check says so.
		{"the server is a client", "", contained, []string{"PASS: the fairness bench as nobody",
			") is listed as an MPS client (get_client_list)"}, "pgrep -u nobody -f http.server"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root, path := checkTree(t, "exit 1")
			// nobody runs the stand-in daemon from PATH: the test's
			// directories must let it through.
			for d := filepath.Join(root, "path"); d != "/"; d = filepath.Dir(d) {
				if strings.HasPrefix(d, os.TempDir()) && d != os.TempDir() {
					if err := os.Chmod(d, 0o755); err != nil {
						t.Fatal(err)
					}
				}
			}
			files := map[string]string{
				// It answers get_server_list (one server, 4242) and
				// get_client_list (its clients: a worker's pid).
				"path/nvidia-cuda-mps-control": "#!/bin/sh\nif [ \"$1\" = -d ]; then echo \"stand-in daemon of uid $(id -u), pipes in $CUDA_MPS_PIPE_DIRECTORY\" >\"$CUDA_MPS_LOG_DIRECTORY/control.log\"; exit 0; fi\nread cmd; echo \"stand-in $cmd\" >>\"$CUDA_MPS_LOG_DIRECTORY/control.log\"\n" +
					"case $cmd in get_server_list) echo 4242 ;; get_client_list*) " + cmp.Or(tc.clients, "echo 4343") + " ;; esac\n",
				// A server that serves: the fault bundle's request
				// faults (500), vecadd answers 200; deploys succeed.
				"bin/plover":             standInServer,
				"bin/plover-bench-suite": bench + tc.row + "\n",
				// The device suite as an MPS client: run from device/,
				// given the test kernels, with the daemon's pipes.
				"bin/device.test": "#!/bin/sh\n[ \"$(basename \"$PWD\")\" = device ] && [ -f \"$PLOVER_TEST_CUDA_BUNDLE_DIR/testkernels.so\" ] && [ -n \"$CUDA_MPS_PIPE_DIRECTORY\" ] || exit 1\n" +
					"case \"$*\" in *TestGPUContained*) " + tc.contained + ";; esac\n" +
					"echo \"--- PASS: TestGPUSuite (0.01s) as $(id -un) $*\"\necho PASS\n",
				"samples/cnn/testdata/digit": "x",
				"go.mod":                     "module stand.in\n",
			}
			for _, d := range []string{"cnn-cuda", "spin-cuda", "vecadd-cuda"} {
				files["build/samples/"+d+"/plover.json"] = "{}"
			}
			for rel, text := range files {
				writeUnder(t, root, rel, []byte(text), 0o755)
			}
			report, _ := runCheck(t, root, path, "BUDGET=90", "RESERVE=5", "ONLY=mps")
			for _, want := range append([]string{
				"MPS control daemon started as nobody",
				"| fair | as nobody, pipes in /tmp/plover-mps.",
				"--fair-sparse-rounds 0 --server-logs /tmp/plover-mps.",
				"--fair-modes fair",
				"stand-in daemon of uid 65534",
				"--- PASS: TestGPUSuite (0.01s) as nobody -test.count=1 -test.timeout=",
				"s -test.v -test.run ^TestGPU(Suite|Info)$",
				"PASS: the device suite under MPS as nobody, one process",
				// A fault under MPS, then another function.
				"-- under MPS: one function's fault, then another function on the same GPU",
				"under MPS: get_server_list: 4242",
				"under MPS: get_client_list 4242: ",
				"PASS: under MPS: faulting request: 500",
				"PASS: under MPS: another function on the GPU after the fault: 200 (try 1)",
			}, tc.want...) {
				if !strings.Contains(report, want) {
					t.Errorf("the report lacks %q:\n%s", want, report)
				}
			}
			for _, f := range []string{"./mps-log/control.log", "./mps-servers/server-001.log"} {
				b, err := exec.Command("tar", "-xzOf", filepath.Join(root, "out", "gpu-check-logs.tgz"), f).CombinedOutput()
				if err != nil || !strings.Contains(string(b), "stand-in") {
					t.Errorf("%s kept: %s %v", f, b, err)
				}
			}
			if b, _ := exec.Command("tar", "-xzOf", filepath.Join(root, "out", "gpu-check-logs.tgz"), "./mps-log/control.log").CombinedOutput(); !strings.Contains(string(b), "stand-in quit") {
				t.Errorf("the daemon's log: %s; want it told to quit", b)
			}
		})
	}
}

// lost_requests finds a fairness table's cell that lost requests however
// it says so: a cell with only never-sent requests ("**N never sent**")
// passed, as its pattern wanted "failed". The function is taken from the
// script and run by bash on each report.
func TestGPUCheckLostRequests(t *testing.T) {
	if _, err := exec.LookPath("bash"); err != nil {
		t.Skip("bash not found")
	}
	src, err := os.ReadFile("gpu-check.sh")
	if err != nil {
		t.Fatal(err)
	}
	var fn string
	for _, l := range strings.Split(string(src), "\n") {
		if strings.HasPrefix(l, "lost_requests() {") {
			fn = l
		}
	}
	if fn == "" {
		t.Fatal("no lost_requests() { ... } line in gpu-check.sh")
	}
	for _, tt := range []struct {
		report string
		lost   bool
	}{
		{"| fair | 1.00× / 1.00× (**7 failed**) |", true},
		{"| fair | 0 / 0 (**1 failed, 2 never sent**) |", true},
		{"| fair | 2.00 → 1.00 / 2.00 (**3 never sent**) |", true},
		{"| fair | 2.00 → 1.00 / 2.00 (flood: **4 never sent**, 2 late) |", true},
		{"| fair | 2.00 → 1.00 / 2.00 (2 late) |", false},
		{"no request failed, none never sent", false},
	} {
		report := filepath.Join(t.TempDir(), "fair.md")
		if err := os.WriteFile(report, []byte("## Sharing a device\n\n"+tt.report+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		err := exec.Command("bash", "-c", fn+"\nlost_requests \"$1\"", "bash", report).Run()
		if lost := err == nil; lost != tt.lost {
			t.Errorf("%q: lost %v (%v), want %v", tt.report, lost, err, tt.lost)
		}
	}
}
