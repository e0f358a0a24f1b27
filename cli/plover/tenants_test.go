package main_test

import (
	"bytes"
	"crypto/rand"
	"encoding/json"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/plover-run/plover/api"
	"github.com/plover-run/plover/internal/testkit"
)

// TestTenantWorkers runs a real server with --worker-scope tenant and two
// tenants (tokens a and b), and hostile bundles deployed by a:
//   - a's functions share one worker process, b's function has another;
//   - a's function crashing five times and hanging once, under load on a
//     sibling of a's and on b's function: b's sees no failure, a's
//     sibling at most 1% (its requests in flight are retried once);
//   - a's memory scanner cannot find b's request bytes; what it finds of
//     its sibling's is logged (the documented trade: one process);
//   - a's other hostile functions (a SIGKILL at b's worker, forged ring
//     messages, closed descriptors, exit, an overflow) leave b alone, while
//     a's worker deaths put a's tenant on hold (logged).
func TestTenantWorkers(t *testing.T) {
	if testing.Short() {
		t.Skip("builds binaries and starts servers")
	}
	bin := buildPlover(t)
	dir := t.TempDir()
	authFile := filepath.Join(dir, "auth")
	toks := writeAuthFile(t, authFile, [][3]string{{"a", "deploy,invoke,read", "*"}, {"b", "deploy,invoke,read", "*"}, {"ops", "read", "*"}})
	clients := map[string]*http.Client{}
	for name, tok := range toks {
		clients[name] = &http.Client{Timeout: 20 * time.Second, Transport: bearerRT{token: tok}}
	}
	srv := startIsoServer(t, bin, filepath.Join(dir, "data"), nil,
		"--isolation", "process", "--worker-scope", "tenant", "--standby-workers", "2", "--auth-file", authFile)
	defer srv.stop(t)
	libs := t.TempDir()
	hostile := testkit.BuildLib(t, testkit.HostileSource(), libs, "hostile.so", "-Wall", "-Wextra")
	ha := &isoHarness{mode: "process", bin: bin, srv: srv, hostile: hostile, client: clients["a"]}
	hb := &isoHarness{mode: "process", bin: bin, srv: srv, hostile: hostile, client: clients["b"]}

	ha.mustDeployDir(t, testkit.BundleDir(t, testkit.Manifest("a-good"), nil))
	ha.mustDeploy(t, hostileManifest("a-sib", launch("echo", 1, 64)), hostile)
	ha.mustDeploy(t, hostileManifest("a-segv", launch("segv", 1, 1)), hostile)
	ha.mustDeploy(t, hostileManifest("a-spin", launch("spin", 1, 1)), hostile)
	ha.mustDeploy(t, hostileManifest("a-memscan", launch("memscan", 1, 1)), hostile)
	hb.mustDeployDir(t, testkit.BundleDir(t, testkit.Manifest("b-good"), nil))
	hb.mustDeploy(t, hostileManifest("b-echo", launch("echo", 1, 64)), hostile)
	for _, c := range []struct {
		h  *isoHarness
		fn string
	}{{ha, "a-good"}, {ha, "a-sib"}, {hb, "b-good"}} {
		if r := c.h.invoke(t, c.fn, []byte("hi"), crashTimeout); r.code != 200 {
			t.Fatalf("%s: %d %.200s", c.fn, r.code, r.body)
		}
	}

	pids := tenantPIDs(t, clients["ops"], srv.url)
	t.Run("one process per tenant", func(t *testing.T) {
		if pids["a-good"] == 0 || pids["a-good"] != pids["a-sib"] {
			t.Errorf("a's functions in workers %d and %d, want one", pids["a-good"], pids["a-sib"])
		}
		if pids["b-good"] == 0 || pids["b-good"] == pids["a-good"] {
			t.Errorf("b's function in worker %d, a's in %d: want two processes", pids["b-good"], pids["a-good"])
		}
	})

	t.Run("tenants apart in memory", func(t *testing.T) {
		found := func(h *isoHarness, echo string) string {
			marker := make([]byte, 32)
			rand.Read(marker)
			if r := h.invoke(t, echo, marker, crashTimeout); r.code != 200 || !bytes.HasPrefix(r.body, marker) {
				t.Fatalf("%s echo of the marker: %d", echo, r.code)
			}
			r := ha.invoke(t, "a-memscan", memscanInput(marker), crashTimeout)
			if r.code != 200 {
				t.Fatalf("memscan: %d %.300s", r.code, r.body)
			}
			return cstr(r.body)
		}
		if got := found(hb, "b-echo"); got != "NOTFOUND" {
			t.Errorf("a's scanner found b's request bytes: %q, want NOTFOUND", got)
		}
		t.Logf("a's scanner looking for its sibling's request bytes (one process: it may): %s", found(ha, "a-sib"))
	})

	t.Run("a crashing function under load", func(t *testing.T) {
		la := startLoadAs(clients["a"], srv.url, "a-good", 100*time.Second, 20000)
		lb := startLoadAs(clients["b"], srv.url, "b-good", 100*time.Second, 20000)
		defer la.stopAndWait()
		defer lb.stopAndWait()
		for i := range 5 {
			la.waitCount(t, la.n.Load()+20, 10*time.Second)
			if r := ha.invokeNoFatal("a-segv", []byte("boom"), crashTimeout); r.code == 200 {
				t.Fatalf("a-segv %d answered 200", i)
			}
		}
		la.waitCount(t, la.n.Load()+20, 10*time.Second)
		if r := ha.invokeNoFatal("a-spin", []byte("stuck"), 500); r.code != 504 {
			t.Errorf("a-spin: %d %.200s, want 504", r.code, r.body)
		}
		la.waitCount(t, la.n.Load()+50, 20*time.Second)
		lb.waitCount(t, 50, 10*time.Second)
		na, fa := la.stopAndWait()
		nb, fb := lb.stopAndWait()
		t.Logf("load on a-good: %d requests, %d failures; on b-good: %d requests, %d failures", na, len(fa), nb, len(fb))
		if len(fb) > 0 {
			t.Errorf("b's function failed %d of %d requests while a's crashed; first: %s", len(fb), nb, strings.Join(fb[:min(3, len(fb))], "; "))
		}
		if float64(len(fa)) > 0.01*float64(na) {
			t.Errorf("a's sibling failed %d of %d requests (> 1%%) while a-segv crashed their worker; first: %s", len(fa), na, strings.Join(fa[:min(3, len(fa))], "; "))
		}
		if na < 100 || nb < 50 {
			t.Errorf("load made only %d and %d requests", na, nb)
		}
		// The crashes took a's shared worker (the sibling now runs in a
		// replacement) and left b's alone.
		after := tenantPIDs(t, clients["ops"], srv.url)
		if after["a-good"] == pids["a-good"] || after["b-good"] != pids["b-good"] {
			t.Errorf("workers before the crashes %v, after %v: want a-good's replaced, b-good's the same", pids, after)
		}
		srv.mustBeHealthy(t, "after the crashes")
	})

	t.Run("a's hostile functions leave b alone", func(t *testing.T) {
		lb := startLoadAs(clients["b"], srv.url, "b-good", 60*time.Second, 20000)
		defer lb.stopAndWait()
		bpid := tenantPIDs(t, clients["ops"], srv.url)["b-good"]
		ha.mustDeploy(t, hostileManifest("a-signal", launch("signal_pid", 1, 1)), hostile)
		if r := ha.invoke(t, "a-signal", []byte(strconv.Itoa(bpid)), crashTimeout); r.code != 200 || !strings.HasPrefix(cstr(r.body), "ERR") {
			t.Errorf("SIGKILL from a's function to b's worker %d: %d %q, want the kernel to refuse", bpid, r.code, cstr(r.body))
		}
		// What these do to a's own worker is a's business; b must not
		// notice.
		for _, k := range []string{"ring_twice", "close_fds", "exit_zero", "overflow_out"} {
			name := "a-" + strings.ReplaceAll(k, "_", "-")
			ha.mustDeploy(t, hostileManifest(name, launch(k, 1, 1)), hostile)
			lb.waitCount(t, lb.n.Load()+10, 10*time.Second)
			r := ha.invokeNoFatal(name, []byte("x"), crashTimeout)
			t.Logf("%s: %d", name, r.code)
		}
		lb.waitCount(t, lb.n.Load()+20, 10*time.Second)
		n, fails := lb.stopAndWait()
		if len(fails) > 0 {
			t.Errorf("b's function failed %d of %d requests beside a's hostile ones; first: %s", len(fails), n, strings.Join(fails[:min(3, len(fails))], "; "))
		}
		if after := tenantPIDs(t, clients["ops"], srv.url)["b-good"]; after != bpid {
			t.Errorf("b's worker changed from %d to %d", bpid, after)
		}
		srv.mustBeHealthy(t, "after a's hostile functions")
		r := ha.invokeNoFatal("a-good", []byte("hi"), crashTimeout)
		t.Logf("a-good after a's hostile functions: %d %.160s (ten deaths of a's worker within 30 s hold a's new workers)", r.code, r.body)
	})

}

// tenantPIDs is each function's worker pid from the listing (0: none).
func tenantPIDs(t *testing.T, c *http.Client, url string) map[string]int {
	t.Helper()
	resp, err := c.Get(url + "/v1/functions")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var list struct {
		Functions []api.FunctionInfo `json:"functions"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&list); err != nil {
		t.Fatalf("listing: %d: %v", resp.StatusCode, err)
	}
	pids := map[string]int{}
	for _, f := range list.Functions {
		for _, w := range f.Workers {
			pids[f.Name] = w.PID
		}
	}
	return pids
}

// bearerRT sends a token with every request, through base
// (http.DefaultTransport where nil).
type bearerRT struct {
	token string
	base  *http.Transport
}

func (b bearerRT) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	if b.token != "" {
		r.Header.Set("Authorization", "Bearer "+b.token)
	}
	if b.base == nil {
		return http.DefaultTransport.RoundTrip(r)
	}
	return b.base.RoundTrip(r)
}

// CloseIdleConnections closes base's (http.Client.CloseIdleConnections).
func (b bearerRT) CloseIdleConnections() {
	if b.base != nil {
		b.base.CloseIdleConnections()
	}
}
