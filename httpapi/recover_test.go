package httpapi_test

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/plover-run/plover/api"
	"github.com/plover-run/plover/frontdoor"
	"github.com/plover-run/plover/httpapi"
	"github.com/plover-run/plover/internal/testkit"
	"github.com/plover-run/plover/reqmetrics"
)

// panicAdmin is a control plane with a bug: listing or describing a
// function panics.
type panicAdmin struct{ httpapi.Admin }

func (panicAdmin) Functions(context.Context) ([]api.FunctionInfo, error) {
	panic("a bug in Functions")
}

func (panicAdmin) Function(context.Context, string) (api.FunctionInfo, error) {
	panic("a bug in Function")
}

// A request whose handling panics (a bug) is answered 500 internal in its
// route's error shape, on the API's address and the metrics one, and its
// connection closed; the panic is logged once, with its route, function
// and stack, and counted in plover_panics_total; the server goes on
// serving. fasthttp recovers no panic: one ended the process, every
// tenant's requests with it.
func TestPanicIsAnswered500(t *testing.T) {
	var log testkit.LogBuffer
	reg := prometheus.NewRegistry()
	door := frontdoor.New(frontdoor.Config{Runner: testkit.PanicRunner{}, Metrics: reqmetrics.New(reg),
		Log: slog.New(slog.NewTextHandler(&log, nil))})
	srv := httpapi.New(door, panicAdmin{}, httpapi.Options{Registry: reg})
	httpapi.PanicOnScrape(srv, "a bug in the scrape")
	api := testkit.ServeWith(t, srv)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.ServeMetrics(ln) // shut down with the API's server (ServeWith)
	metrics := "http://" + ln.Addr().String()

	client := &http.Client{Timeout: 10 * time.Second}
	do := func(method, url, body string, panics bool) (*http.Response, string) {
		t.Helper()
		req, err := http.NewRequest(method, url, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		if panics {
			req.Header.Set("X-Test-Panic", "1")
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatalf("%s %s: %v (did the server die?)", method, url, err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp, string(b)
	}
	for i, tc := range []struct {
		name, method, url, body  string
		panicked, says, function string
		next                     string // a request that must then be answered 200
	}{
		{"list", "GET", api + "/v1/functions", "", "a bug in Functions", `"code":"internal"`, "", api + "/readyz"},
		{"describe", "GET", api + "/v1/functions/f", "", "a bug in Function", `"code":"internal"`, "f", api + "/readyz"},
		{"invoke", "POST", api + "/v1/functions/echo/invoke", "some input", "a bug in Land", `"code":"internal"`, "echo", api + "/readyz"},
		{"v2 metadata", "GET", api + "/v2/models/m", "", "a bug in Pin", `{"error":"internal error`, "m", api + "/readyz"},
		{"scrape", "GET", api + "/metrics", "", "a bug in the scrape", `"code":"internal"`, "", api + "/metrics"},
		{"metrics address", "GET", metrics + "/metrics", "", "a bug in the scrape", `"code":"internal"`, "", metrics + "/metrics"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, body := do(tc.method, tc.url, tc.body, true)
			if resp.StatusCode != 500 || !strings.Contains(body, tc.says) || !strings.Contains(body, "plover_panics_total") {
				t.Fatalf("%s %s: %d %s, want 500 with %s", tc.method, tc.url, resp.StatusCode, body, tc.says)
			}
			if strings.Contains(body, tc.panicked) || strings.Contains(body, "goroutine") {
				t.Errorf("the answer tells the panic: %s", body)
			}
			if !resp.Close {
				t.Errorf("the connection of a request that panicked is kept open: %v", resp.Header)
			}
			if resp, body := do("GET", tc.next, "", false); resp.StatusCode != 200 {
				t.Fatalf("the next request, GET %s: %d %s", tc.next, resp.StatusCode, body)
			}
			lines := testkit.PanicLines(log.String())
			if len(lines) != i+1 {
				t.Fatalf("%d panics, %d lines logged:\n%s", i+1, len(lines), log.String())
			}
			line := lines[i]
			route := "route=\"" + tc.method + " " + strings.TrimPrefix(strings.TrimPrefix(tc.url, api), metrics) + "\""
			for _, want := range []string{"transport=http", route, "panic=\"" + tc.panicked + "\"", "stack=", `\npanic({`} {
				if !strings.Contains(line, want) {
					t.Errorf("the log line lacks %s: %s", want, line)
				}
			}
			if has := strings.Contains(line, "function="); has != (tc.function != "") || tc.function != "" && !strings.HasSuffix(line, " function="+tc.function) {
				t.Errorf("the log line should name function %q: %s", tc.function, line)
			}
		})
	}
	if _, body := do("GET", metrics+"/metrics", "", false); !strings.Contains(body, "plover_panics_total{transport=\"http\"} 6\n") ||
		!strings.Contains(body, "plover_panics_total{transport=\"grpc\"} 0\n") {
		t.Errorf("plover_panics_total after 6 panics over HTTP:\n%s", grep(body, "plover_panics_total"))
	}
}

// grep is the lines of s that hold sub.
func grep(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
