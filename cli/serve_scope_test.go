package cli

import (
	"bytes"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/plover-run/plover/api"
	"github.com/plover-run/plover/device"
	"github.com/plover-run/plover/worker"
)

// --worker-scope takes function or tenant, and tenant only where there are
// worker processes to share; --worker-max-pids 0 or a bound a worker's own
// threads fit in: refused, naming the flag, before the server opens
// anything. (MPS, on only with a CUDA device, is refused where the devices
// are known: isolate.) Sizes in MiB out of range, likewise.
func TestServeWorkerFlagRefusals(t *testing.T) {
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"unknown", []string{"--worker-scope", "process"}, `--worker-scope "process": want function or tenant`},
		{"empty", []string{"--worker-scope", ""}, `--worker-scope "": want function or tenant`},
		{"unknown without workers", []string{"--worker-scope", "tenants", "--isolation", "none"}, `--worker-scope "tenants"`},
		{"tenant without workers", []string{"--worker-scope", "tenant", "--isolation", "none"}, "--worker-scope tenant: --isolation none"},
		{"negative pids bound", []string{"--worker-max-pids", "-1"}, "--worker-max-pids -1: want 0 (no bound) or at least 32"},
		{"pids bound below a worker's own", []string{"--worker-max-pids", "8"}, "--worker-max-pids 8: want 0 (no bound) or at least 32"},
		// Past the kernel's PID_MAX_LIMIT, pids.max refused the bound and
		// workers ran unbounded.
		{"pids bound past the kernel's", []string{"--worker-max-pids", "4194305"}, "--worker-max-pids 4194305: want at most 4194304, the kernel's PID_MAX_LIMIT"},
		{"standby workers past the bound", []string{"--standby-workers", "257"}, "--standby-workers 257: want at most 256"},
		{"standby ceiling past the bound", []string{"--standby-max", "100000"}, "--standby-max 100000: want at most 256"},
		// A run's time times the device's runs overflowed the scheduler's
		// charges: host runs were charged about nothing.
		{"device runs past the bound", []string{"--device-runs", "4611686018427387904"}, "--device-runs 4611686018427387904: want at most 4096"},
		// Past the open-file limit the connection guard protected nothing.
		{"connections past the descriptors", []string{"--max-conns", "9223372036854775807"}, "--max-conns 9223372036854775807: want 0 (derived) or at most"},
		// Sizes in MiB: --max-body -1 was taken as fasthttp's default, and
		// a size past 2^43 MiB wrapped in bytes (a negative one: no limit).
		{"no body at all", []string{"--max-body", "0"}, "--max-body 0: want 1 to 8796093022207 MiB"},
		{"negative body", []string{"--max-body", "-1"}, "--max-body -1: want 1 to"},
		{"negative device memory", []string{"--memory-limit", "-5"}, "--memory-limit -5: want 0 (no limit) to"},
		{"cache past an int64", []string{"--cache-limit", "8796093022208"}, "--cache-limit 8796093022208: want 0 (no limit) to 8796093022207 MiB"},
		{"worker memory past an int64", []string{"--worker-max-memory", "9999999999999999"}, "--worker-max-memory 9999999999999999"},
		{"negative pinned memory", []string{"--max-pinned-memory", "-1"}, "--max-pinned-memory -1"},
		{"negative pipeline memory", []string{"--max-pipeline-memory", "-1"}, "--max-pipeline-memory -1: want 0 (no limit) to"},
		{"spool below the body bound", []string{"--max-spool", "100"}, "--max-spool 100: want 0 (4 times --max-body) or --max-body (256) to"},
		{"negative spool", []string{"--max-spool", "-1"}, "--max-spool -1: want 0"},
		{"negative flood runs", []string{"--flood-runs", "-1"}, "--flood-runs -1: want 0 (all runs but the reserve) or more"},
		{"negative shared runs", []string{"--shared-runs", "-1"}, "--shared-runs -1: want 0 (the device's default) or more"},
		{"no reserve hold", []string{"--reserve-hold", "0s"}, "--reserve-hold 0s: want a positive duration"},
		{"negative reserve hold", []string{"--reserve-hold", "-1s"}, "--reserve-hold -1s: want a positive duration"},
		{"negative copy piece", []string{"--copy-piece", "-1"}, "--copy-piece -1: want 0 (whole copies) or 64 to 9007199254740991 KiB"},
		{"copy piece below 64 KiB", []string{"--copy-piece", "16"}, "--copy-piece 16: want 0 (whole copies) or 64 to"},
		{"copy piece past an int64", []string{"--copy-piece", "9007199254740992"}, "--copy-piece 9007199254740992: want 0 (whole copies) or 64 to"},
		{"light slice under the kernel's bound", []string{"--light-slice", "50us"}, "--light-slice 50µs: want 0 (off) or 100us to 100ms"},
		{"light slice past the kernel's bound", []string{"--light-slice", "101ms"}, "--light-slice 101ms: want 0 (off) or 100us to 100ms"},
		{"negative light slice", []string{"--light-slice", "-1ms"}, "--light-slice -1ms: want 0 (off)"},
		{"unknown memory groups", []string{"--memory-groups", "yes"}, `--memory-groups "yes": want auto, on or off`},
		{"empty memory groups", []string{"--memory-groups", ""}, `--memory-groups "": want auto, on or off`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { serveRefuses(t, tt.args, tt.want) })
	}
}

// serveRefuses runs plover serve with args and wants exit 2 and want in
// its usage error. A --log-format no logger takes is added, so that args
// the flag checks pass fail at once (exit 1) after them, rather than
// serving until the test's deadline.
func serveRefuses(t *testing.T, args []string, want string) {
	t.Helper()
	var out, errb bytes.Buffer
	args = append([]string{"serve", "--data", t.TempDir(), "--listen", "127.0.0.1:0", "--log-format", "refused-after-the-flag-checks"}, args...)
	code := Main(args, &Env{Stdin: strings.NewReader(""), Stdout: &out, Stderr: &errb})
	if code != 2 || !strings.Contains(errb.String(), want) {
		t.Fatalf("exit %d, stderr %q; want exit 2 and %q", code, errb.String(), want)
	}
}

// The pool and deadline flags' 0 or negative values, which the engine and
// the transports took as their defaults (--timeout 0: 30 s, --max-queue
// -5: 64, --idle-ttl 0: 5 minutes, --read-timeout 0: 60 s) are refused
// naming the flag; the values that mean something pass, a --min-instances
// over --max-instances too (both defaults: a manifest's max_instances of
// 10 keeps the whole 10 warm).
func TestServePoolFlagRefusals(t *testing.T) {
	for _, tt := range []struct {
		name string
		args []string
		want string
	}{
		{"no request deadline", []string{"--timeout", "0"}, "--timeout 0s: want a positive duration"},
		{"negative request deadline", []string{"--timeout", "-1s"}, "--timeout -1s: want a positive duration"},
		{"no longest deadline", []string{"--max-timeout", "0"}, "--max-timeout 0s: want a positive duration"},
		{"no read timeout", []string{"--read-timeout", "0"}, "--read-timeout 0s: want a positive duration"},
		{"negative write timeout", []string{"--write-timeout", "-1s"}, "--write-timeout -1s: want a positive duration"},
		{"no instances", []string{"--max-instances", "0"}, "--max-instances 0: want 1 or more"},
		{"negative instances", []string{"--max-instances", "-1"}, "--max-instances -1: want 1 or more"},
		{"no queue", []string{"--max-queue", "0"}, "--max-queue 0: want 1 or more"},
		{"negative queue", []string{"--max-queue", "-5"}, "--max-queue -5: want 1 or more"},
		{"negative warm instances", []string{"--min-instances", "-1"}, "--min-instances -1: want 0 (none kept warm) or more"},
		{"idle ttl 0", []string{"--idle-ttl", "0"}, "--idle-ttl 0s: want 10ms or more, or a negative duration to never release idle instances"},
		// A reap period of a quarter of it, and no shorter: 3 ns gave 0,
		// which panicked once the server was serving.
		{"idle ttl under the least", []string{"--idle-ttl", "3ns"}, "--idle-ttl 3ns: want 10ms or more"},
		{"idle ttl just under the least", []string{"--idle-ttl", "9ms"}, "--idle-ttl 9ms: want 10ms or more"},
		// Polls that kept a core busy re-reading.
		{"poll of 1ns", []string{"--poll", "1ns"}, "--poll 1ns: want 0 (never re-read) or 100ms or more"},
		{"poll under the least", []string{"--poll", "99ms"}, "--poll 99ms: want 0 (never re-read) or 100ms or more"},
		{"negative poll", []string{"--poll", "-5s"}, "--poll -5s: want 0 (never re-read) or a positive duration"},
		{"negative grace", []string{"--grace", "-1s"}, "--grace -1s: want 0 (cut requests in flight at once) or a positive duration"},
	} {
		t.Run(tt.name, func(t *testing.T) { serveRefuses(t, tt.args, tt.want) })
	}
	ok := serveFlags{minInstances: 10, maxInstances: 8, maxQueue: 1, timeout: time.Nanosecond, maxTimeout: time.Nanosecond, readTimeout: time.Second, writeTimeout: time.Second}
	for _, ttl := range []time.Duration{-time.Nanosecond, leastIdleTTL} {
		f := ok
		f.idleTTL = ttl
		if err := checkPoolFlags(&f, &Env{Stderr: io.Discard}); err != nil {
			t.Errorf("--idle-ttl %v, --min-instances over --max-instances: %v", ttl, err)
		}
	}
}

// Each instance holds a thread of its worker: past --worker-max-pids, less
// the worker's own threads, the Go runtime aborted the worker (and every
// function in it) each time it made them. --min-instances and
// --max-instances past that, or past a manifest's 1024 where workers are
// unbounded or absent, and --max-queue past a manifest's bound, are
// usage errors; what is within passes.
func TestServeInstanceFlagBounds(t *testing.T) {
	own := worker.OwnThreads()
	room := defaultWorkerMaxPids - own
	bound := fmt.Sprintf("want 1 to %d (the instances one worker may hold: --worker-max-pids %d, less up to %d threads of the worker's own)", room, defaultWorkerMaxPids, own)
	for _, tt := range []struct {
		name string
		args []string
		want string
	}{
		{"max past a worker's room", []string{"--max-instances", "3000"}, "--max-instances 3000: " + bound},
		{"max just past a worker's room", []string{"--max-instances", strconv.Itoa(room + 1)}, "--max-instances " + strconv.Itoa(room+1) + ": " + bound},
		{"min past a worker's room", []string{"--min-instances", "3000"}, "--min-instances 3000: want 0 to " + strconv.Itoa(room)},
		{"max past a manifest's without workers", []string{"--isolation", "none", "--max-instances", "1025"}, "--max-instances 1025: want 1 to 1024 (a manifest's bound)"},
		{"max past a manifest's with workers unbounded", []string{"--worker-max-pids", "0", "--max-instances", "1025"}, "--max-instances 1025: want 1 to 1024 (a manifest's bound)"},
		{"queue past a manifest's", []string{"--max-queue", "9223372036854775807"}, "--max-queue 9223372036854775807: want 1 to 1048576"},
	} {
		t.Run(tt.name, func(t *testing.T) { serveRefuses(t, tt.args, tt.want) })
	}
	for _, f := range []serveFlags{
		{isolation: "process", workerMaxPids: defaultWorkerMaxPids, minInstances: room, maxInstances: room, maxQueue: 1 << 20},
		{isolation: "none", workerMaxPids: defaultWorkerMaxPids, minInstances: 1024, maxInstances: 1024, maxQueue: 1},
		{isolation: "process", minInstances: 1024, maxInstances: 1024, maxQueue: 1},
	} {
		if err := checkInstanceFlags(&f); err != nil {
			t.Errorf("%+v: %v", f, err)
		}
	}
}

// --repository-poll under 100 ms kept a core busy rescanning: refused,
// as a negative one is; 0 and 100 ms pass.
func TestRepositoryPollBound(t *testing.T) {
	for _, tc := range []struct {
		poll time.Duration
		want string // "": passes
	}{
		{time.Nanosecond, "--repository-poll 1ns: a period of 0 (scan once) or 100ms or more"},
		{99 * time.Millisecond, "--repository-poll 99ms: a period of 0 (scan once) or 100ms or more"},
		{-time.Second, "--repository-poll -1s: a period of 0 (scan once) or 100ms or more"},
		{0, ""},
		{leastPoll, ""},
	} {
		err := repositoryFlags(&serveFlags{repository: "models", repositoryPoll: tc.poll, repositorySettle: time.Second})
		if got := fmt.Sprint(err); tc.want == "" && err != nil || tc.want != "" && !strings.Contains(got, tc.want) {
			t.Errorf("--repository-poll %v: %v; want %q", tc.poll, err, tc.want)
		}
	}
}

// The default keeps each function a worker of its own; tenant passes
// where there are worker processes.
func TestWorkerScopeDefault(t *testing.T) {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	serveCmd().flags(fs)
	if got := fs.Lookup("worker-scope"); got == nil || got.DefValue != "function" {
		t.Fatalf("--worker-scope %+v, want the default function", got)
	}
	if err := checkWorkerScope(&serveFlags{workerScope: "tenant", isolation: "process"}); err != nil {
		t.Fatalf("tenant with worker processes: %v", err)
	}
}

// plover versions shows a TENANT column where a token deployed a version,
// and none where none did (the table reads as before).
func TestVersionsTenantColumn(t *testing.T) {
	sha := strings.Repeat("ab", 32)
	created := time.Date(2026, 11, 29, 6, 0, 0, 0, time.UTC) // whole minutes in any zone
	tests := []struct {
		name    string
		tenants []string // oldest first
		head    string
		ends    []string // how each row ends, newest first
	}{
		{"no auth file", []string{"", ""}, "VERSION SHA256 BUNDLE DEPLOYED", nil},
		{"tokens", []string{"", "acme"}, "VERSION SHA256 BUNDLE DEPLOYED TENANT", []string{"acme", ":00"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rec := &api.Record{Name: "fn", Current: "v2"}
			for i, tn := range tt.tenants {
				rec.Versions = append(rec.Versions, api.Version{ID: fmt.Sprintf("v%d", i+1), SHA256: sha, Size: 10, Tenant: tn, Created: created})
			}
			var out bytes.Buffer
			if err := writeVersions(&out, rec); err != nil {
				t.Fatal(err)
			}
			lines := strings.Split(strings.TrimRight(out.String(), "\n"), "\n")
			if len(lines) != 3 || strings.Join(strings.Fields(lines[0]), " ") != tt.head ||
				!strings.HasPrefix(lines[1], "*  v2") || !strings.HasPrefix(strings.TrimSpace(lines[2]), "v1") {
				t.Fatalf("table:\n%s", out.String())
			}
			for i, end := range tt.ends {
				if !strings.HasSuffix(strings.TrimSpace(lines[i+1]), end) {
					t.Fatalf("row %d does not end with %q:\n%s", i+1, end, out.String())
				}
			}
		})
	}
}

// --memory-groups: auto (the default) gives memory groups to the host
// device's workers only (a CUDA worker's driver memory charged to its
// group is not yet measured), on to every worker, off to none.
func TestMemoryGroupsFlag(t *testing.T) {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	serveCmd().flags(fs)
	if got := fs.Lookup("memory-groups"); got == nil || got.DefValue != "auto" {
		t.Fatalf("--memory-groups %+v, want the default auto", got)
	}
	for _, tc := range []struct {
		mode, target string
		want         bool
	}{
		{"auto", "host", true}, {"auto", "cuda", false},
		{"on", "host", true}, {"on", "cuda", true},
		{"off", "host", false}, {"off", "cuda", false},
	} {
		if got := memGroupsFor(tc.mode, tc.target); got != tc.want {
			t.Errorf("--memory-groups %s, a %s worker: memory group %v, want %v", tc.mode, tc.target, got, tc.want)
		}
	}
}

// --memory-groups on names worker processes' groups: under --isolation
// none, which has none, it is said to be ignored, as --mps is off CUDA.
func TestMemoryGroupsOnWithoutWorkersIsTold(t *testing.T) {
	for _, tc := range []struct {
		mode string
		told bool
	}{{"on", true}, {"auto", false}, {"off", false}} {
		var logs bytes.Buffer
		f := &serveFlags{isolation: "none", memoryGroups: tc.mode, lightBoost: 1}
		if _, _, _, _, err := isolate(f, []device.Device{device.NewHost(0)}, false, slog.New(slog.NewTextHandler(&logs, nil))); err != nil {
			t.Fatal(err)
		}
		if got := strings.Contains(logs.String(), "--memory-groups on"); got != tc.told {
			t.Errorf("--memory-groups %s with --isolation none: told %v, want %v; logs:\n%s", tc.mode, got, tc.told, logs.String())
		}
	}
}

// A record's digest is the store's word: one shorter than the 12
// characters shown (a record written by hand or another tool) is printed
// as it is, where plover versions panicked (a read-only review's probe).
func TestVersionsShortDigest(t *testing.T) {
	var out bytes.Buffer
	rec := &api.Record{Name: "fn", Current: "v1", Versions: []api.Version{{ID: "v1", SHA256: "abc"}}}
	err := writeVersions(&out, rec)
	if lines := strings.Split(out.String(), "\n"); err != nil || len(lines) < 2 || !strings.HasPrefix(strings.Join(strings.Fields(lines[1]), " "), "* v1 abc ") {
		t.Fatalf("%v:\n%s", err, out.String())
	}
}

// Whether the server opens its GPUs bare (no CUDA context, so that it is
// none of the MPS server's clients) is decided before they open: under
// --isolation process with --mps or a control daemon running; never with
// --isolation none, where functions run on the server's own context.
func TestMPSWantedBeforeTheDevicesOpen(t *testing.T) {
	dir := t.TempDir()
	t.Setenv("CUDA_MPS_PIPE_DIRECTORY", dir)
	for _, tc := range []struct {
		isolation string
		flag      bool
		daemon    bool
		want      bool
	}{
		{"process", true, false, true}, {"process", false, true, true}, {"process", false, false, false},
		{"none", true, true, false}, {"none", true, false, false},
	} {
		t.Run(fmt.Sprintf("%s mps=%v daemon=%v", tc.isolation, tc.flag, tc.daemon), func(t *testing.T) {
			if tc.daemon {
				ln, err := net.Listen("unix", filepath.Join(dir, "control"))
				if err != nil {
					t.Fatal(err)
				}
				defer ln.Close()
			}
			f := &serveFlags{isolation: tc.isolation, mps: tc.flag}
			if got := mpsWanted(f); got != tc.want {
				t.Errorf("mpsWanted = %v, want %v", got, tc.want)
			}
			// isolate's verdict on a GPU is the one the devices opened
			// by, asked again of nothing (a daemon started meanwhile).
			if got, err := mpsFor(f, []device.Device{cudaStub{}}, tc.want, nil, slog.New(slog.DiscardHandler)); got != tc.want || err != nil {
				t.Errorf("mpsFor on a GPU: %v, %v; want %v", got, err, tc.want)
			}
			if got, err := mpsFor(f, []device.Device{device.NewHost(0)}, tc.want, nil, slog.New(slog.DiscardHandler)); got || err != nil {
				t.Errorf("mpsFor on the host device: %v, %v; want false", got, err)
			}
		})
	}
}

// cudaStub is a device of the CUDA target that does nothing.
type cudaStub struct{ device.Device }

func (cudaStub) Target() string { return "cuda" }
