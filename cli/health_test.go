package cli

import (
	"encoding/pem"
	"errors"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/plover-run/plover/device"
	"github.com/plover-run/plover/engine"
	"github.com/plover-run/plover/httpapi"
	"github.com/plover-run/plover/internal/testkit"
)

// sickDevice is the host device reporting what a GPU that fell off the bus
// reports, so that /healthz answers 503 as it would then.
type sickDevice struct{ device.Device }

func (sickDevice) Health() error { return errors.New("GPU fell off the bus (Xid 79)") }

// healthServer serves the real HTTP API over an engine with devs (nil: the
// host device) and returns its URL and the server, whose readiness a case
// may turn off as a drain does.
func healthServer(t *testing.T, devs ...device.Device) (string, *httpapi.Server) {
	t.Helper()
	e := testkit.Engine(t, engine.Config{Devices: devs})
	srv := httpapi.New(testkit.Door(e, nil, nil), e.Control(), httpapi.Options{})
	return testkit.ServeWith(t, srv), srv
}

// writeCA writes the certificate of an httptest TLS server, its own CA, to
// a PEM file and returns the file's path.
func writeCA(t *testing.T, ts *httptest.Server) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "ca.pem")
	b := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ts.Certificate().Raw})
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestHealth runs plover health against a real API server (healthy, a sick
// device, draining), a port nothing listens on, a server that does not
// answer, TLS servers, and a server that is not plover's, and checks the
// exit status and what each says.
func TestHealth(t *testing.T) {
	healthy, _ := healthServer(t)
	sick, _ := healthServer(t, sickDevice{device.NewHost(0)})
	// Draining: /readyz says 503 while /healthz still says 200, so --ready
	// must ask the other path to see it.
	draining, drainSrv := healthServer(t)
	drainSrv.SetReady(false)

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := "http://" + ln.Addr().String()
	ln.Close()

	release := make(chan struct{})
	stuck := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// Bounded, so that a client with no timeout fails the case
		// (an answer, and late) rather than hanging the test.
		select {
		case <-release:
		case <-r.Context().Done():
		case <-time.After(5 * time.Second):
		}
	}))
	t.Cleanup(stuck.Close)
	t.Cleanup(func() { close(release) }) // before stuck.Close, which waits for the handler

	tlsOK := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Write([]byte(`{"status":"ok","devices":[{"name":"gpu0","target":"cuda","healthy":true},{"name":"gpu1","target":"cuda","healthy":true}]}`))
	}))
	tlsOK.Config.ErrorLog = log.New(io.Discard, "", 0) // the untrusted case's handshake error is expected
	tlsOK.StartTLS()
	t.Cleanup(tlsOK.Close)
	ca := writeCA(t, tlsOK)

	tlsPlover, _, _ := tlsPloverServer(t)
	httpToTLS := strings.Replace(tlsPlover, "https://", "http://", 1)

	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "404 page not found", http.StatusNotFound)
	}))
	t.Cleanup(other.Close)

	tests := []struct {
		name   string
		vars   map[string]string
		args   []string
		code   int
		stdout string   // in stdout; "" wants it empty
		stderr []string // each in stderr
	}{
		{"healthy", nil, []string{"--server", healthy}, 0,
			"healthy: " + healthy + "/healthz answered 200; 1 device: host", nil},
		{"ready", nil, []string{"--server", healthy, "--ready"}, 0,
			"ready: " + healthy + "/readyz answered 200", nil},
		{"quiet", nil, []string{"--server", healthy, "-q"}, 0, "", nil},
		{"server from the environment", map[string]string{"PLOVER_SERVER": healthy}, nil, 0,
			"healthy: " + healthy + "/healthz", nil},
		{"sick device", nil, []string{"--server", sick}, 1, "",
			[]string{"GET " + sick + "/healthz answered 503 Service Unavailable", `status "unhealthy"`, "unhealthy: GPU fell off the bus (Xid 79)"}},
		{"sick device, quiet", nil, []string{"--server", sick, "-q"}, 1, "",
			[]string{"GPU fell off the bus"}},
		{"draining is healthy", nil, []string{"--server", draining}, 0, "healthy: ", nil},
		{"draining is not ready", nil, []string{"--server", draining, "--ready"}, 1, "",
			[]string{"GET " + draining + "/readyz answered 503 Service Unavailable: not ready"}},
		{"nothing listens", nil, []string{"--server", closed}, 3, "",
			[]string{"GET " + closed + "/healthz: no answer: connection refused"}},
		{"no answer in time", nil, []string{"--server", stuck.URL, "--timeout", "200ms"}, 3, "",
			[]string{"GET " + stuck.URL + "/healthz: no answer", "connected, but no answer within 200ms (timeout)"}},
		{"unknown host", nil, []string{"--server", "http://nohost.invalid:1", "--timeout", "1s"}, 3, "",
			[]string{"GET http://nohost.invalid:1/healthz: no answer: "}},
		{"TLS with its CA", nil, []string{"--server", tlsOK.URL, "--cacert", ca}, 0,
			"healthy: " + tlsOK.URL + "/healthz answered 200; 2 devices: gpu0, gpu1", nil},
		{"TLS with its CA from the environment", map[string]string{"PLOVER_SERVER": tlsOK.URL, "PLOVER_CACERT": ca}, nil, 0,
			"healthy: " + tlsOK.URL, nil},
		{"TLS without its CA", nil, []string{"--server", tlsOK.URL}, 3, "",
			[]string{"GET " + tlsOK.URL + "/healthz: no answer: TLS: the server's certificate is not trusted", "--cacert"}},
		{"https to a plain server", nil, []string{"--server", strings.Replace(healthy, "http://", "https://", 1)}, 3, "",
			[]string{"no answer: TLS handshake failed: the server speaks plain HTTP there (use " + healthy + ")"}},
		{"http to a TLS listener", nil, []string{"--server", httpToTLS}, 3, "",
			[]string{"GET " + httpToTLS + "/healthz: no answer: the server speaks TLS there and closed this plain-HTTP request unread, before any TLS handshake (use " + tlsPlover + ")"}},
		{"not plover", nil, []string{"--server", other.URL}, 1, "",
			[]string{"GET " + other.URL + "/healthz answered 404 Not Found: not plover's answer (another service at --server, or a proxy's page?): it began \"404 page not found\""}},
		// --json: the same exit status, the answer whatever it was.
		{"json, healthy", nil, []string{"--server", healthy, "--json"}, 0,
			`"http_status": 200,`, nil},
		{"json, sick device", nil, []string{"--server", sick, "--json"}, 1,
			`"error": "GPU fell off the bus (Xid 79)"`, []string{"GPU fell off the bus"}},
		{"json, nothing listens", nil, []string{"--server", closed, "--json"}, 3,
			`"error": "GET ` + closed + `/healthz: no answer: connection refused`, []string{"connection refused"}},
		{"json, not plover", nil, []string{"--server", other.URL, "--json"}, 1,
			`"http_status": 404,`, []string{"not plover's answer ("}},
		{"zero timeout", nil, []string{"--server", healthy, "--timeout", "0s"}, 2, "",
			[]string{"--timeout 0s: want a positive duration"}},
		{"unreadable CA", nil, []string{"--server", tlsOK.URL, "--cacert", filepath.Join(t.TempDir(), "none.pem")}, 2, "",
			[]string{"--cacert: open "}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			start := time.Now()
			out, errs, code := runMain(t, envOf(tt.vars), append([]string{"health"}, tt.args...)...)
			if code != tt.code {
				t.Fatalf("exit %d, want %d; stdout %q, stderr %q", code, tt.code, out, errs)
			}
			if tt.stdout == "" && out != "" || !strings.Contains(out, tt.stdout) {
				t.Errorf("stdout %q, want %q", out, tt.stdout)
			}
			if tt.code == 0 && errs != "" {
				t.Errorf("stderr %q on success", errs)
			}
			for _, w := range tt.stderr {
				if !strings.Contains(errs, w) {
					t.Errorf("stderr %q, want %q in it", errs, w)
				}
			}
			// The default bound is short, and no case here should wait
			// for it.
			if d := time.Since(start); d > 2*time.Second {
				t.Errorf("took %v", d)
			}
		})
	}
}

// plover health sends no token, so a stale $PLOVER_TOKEN cannot make a
// healthy server look down; the probes need none.
func TestHealthSendsNoToken(t *testing.T) {
	got := make(chan string, 1)
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got <- r.Header.Get("Authorization")
		w.Write([]byte(`{"status":"ok","devices":[]}`))
	}))
	defer ts.Close()
	vars := map[string]string{"PLOVER_SERVER": ts.URL, "PLOVER_TOKEN": "expired"}
	_, errs, code := runMain(t, envOf(vars), "health")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	if a := <-got; a != "" {
		t.Fatalf("sent Authorization %q", a)
	}
}

// The default --timeout is short enough for a container's probe, and the
// help states every exit status.
func TestHealthHelp(t *testing.T) {
	out, _, code := runMain(t, envOf(nil), "health", "--help")
	if code != 0 {
		t.Fatalf("exit %d", code)
	}
	for _, w := range []string{"(default 3s)", "  0  the server answered 200", "  1  the server answered something else",
		"  2  the command line cannot run", "  3  no answer"} {
		if !strings.Contains(out, w) {
			t.Errorf("help lacks %q:\n%s", w, out)
		}
	}
}
