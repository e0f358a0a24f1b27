package console_test

import (
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// TestParseMetrics: metrics.js's reading of Prometheus text, in the
// browser (imported from a page of the origin, as app.js imports it).
// parseFloat read +Inf and -Inf as NaN, and the greedy label block read an
// OpenMetrics exemplar's value and labels for its sample's.
func TestParseMetrics(t *testing.T) {
	b := startBrowser(t)
	f := newFake(t, func(w http.ResponseWriter, r *http.Request) { http.NotFound(w, r) })
	p := b.tab(t, "")
	p.do(10*time.Second, "a page of the origin", chromedp.Navigate(f.url+"/blank"))
	text := strings.Join([]string{
		`# HELP h a histogram`,
		`h_bucket{le="0.1"} 5 # {trace_id="abc"} 0.05`,
		`h_bucket{le="+Inf"} 7`,
		`up +Inf`,
		`down -Inf`,
		`odd NaN`,
		`q{a="x}y",b="say \"hi\" {} # 9"} 3 1700000000000`,
		`plain 2.5e3`,
	}, "\n")
	got := eval[string](p, fmt.Sprintf(`import("/ui/metrics.js").then((m) => m.parseMetrics(%q).map((s) => s.name + JSON.stringify(s.labels) + " " + String(s.value)).join("\n"))`, text))
	want := strings.Join([]string{
		`h_bucket{"le":"0.1"} 5`,
		`h_bucket{"le":"+Inf"} 7`,
		`up{} Infinity`,
		`down{} -Infinity`,
		`odd{} NaN`,
		`q{"a":"x}y","b":"say \"hi\" {} # 9"} 3`,
		`plain{} 2500`,
	}, "\n")
	if got != want {
		t.Errorf("parsed:\n%s\nwant:\n%s", got, want)
	}
}

// TestOverviewPinning: with tokens and every device healthy, a device's
// figures come from /metrics (/healthz withholds them from anyone without
// a token): the bound on its pinned host memory among them
// (plover_pinned_host_limit_bytes), and, as /healthz leaves out a
// pinning field that is 0, so does the overview, that a device shows the
// same fields healthy or not.
func TestOverviewPinning(t *testing.T) {
	b := startBrowser(t)
	var mu sync.Mutex
	healthy := true
	f := newFake(t, func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		switch r.URL.Path {
		case "/v1/functions":
			writeJSON(w, 200, map[string]any{"functions": []any{}})
		case "/metrics":
			fmt.Fprint(w, "plover_device_memory_bytes{device=\"gpu0\",kind=\"total\"} 1000\n"+
				"plover_device_memory_bytes{device=\"gpu0\",kind=\"free\"} 600\n"+
				"plover_device_memory_bytes{device=\"gpu0\",kind=\"used\"} 400\n"+
				"plover_pinned_host_bytes{device=\"gpu0\"} 4096\n"+
				"plover_pinned_host_limit_bytes{device=\"gpu0\"} 8192\n"+
				"plover_pin_refusals_total{device=\"gpu0\"} 0\n")
		case "/healthz": // pin_refusals, 0, left out (omitempty)
			healthz(w, r, "gpu0", "cuda", healthy, map[string]any{"pinned_host_bytes": 4096, "pinned_host_limit_bytes": 8192})
		default:
			http.NotFound(w, r)
		}
	})
	p := b.tab(t, "")
	// The fields shown of the device, but its health and error, by name
	// (the fake's /healthz sends them in its own order).
	const fields = `[...document.querySelectorAll("#health td")].map((td) => td.textContent.split(":")[0]).filter((k) => !["healthy", "error"].includes(k)).sort().join(" ")`
	p.do(30*time.Second, "the overview",
		chromedp.Navigate(f.url+"/ui/#/?token="+token),
		poll(`document.getElementById("health").textContent.includes("status: ok")`))
	if got := eval[string](p, `document.getElementById("health").textContent`); !strings.Contains(got, "pinned_host_limit_bytes: 8192") || strings.Contains(got, "pin_refusals") {
		t.Errorf("healthy, the device shows %q: want its pinning bound, and no pin_refusals of 0", got)
	}
	ok := eval[string](p, fields)
	mu.Lock()
	healthy = false
	mu.Unlock()
	p.do(10*time.Second, "the device unhealthy", poll(`document.getElementById("health").textContent.includes("error: device lost")`))
	if bad := eval[string](p, fields); bad != ok {
		t.Errorf("the device shows %q healthy and %q unhealthy: want the same fields", ok, bad)
	}
}
