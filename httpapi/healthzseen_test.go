package httpapi_test

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/plover-run/plover/auth"
	"github.com/plover-run/plover/engine"
	"github.com/plover-run/plover/httpapi"
	"github.com/plover-run/plover/internal/testkit"
)

// /healthz is open to probes, but with tokens it tells a caller without a
// token of the read scope only each device's name and health: its memory,
// pinned bytes and error follow other tenants' loads and cold starts.
// Before, anyone who reached the port read them (a review's probe). A
// caller that sends a token is admitted as any route's caller: one the
// server does not know is 401 (answered open, the two views told anyone
// whether a token was valid, with no trace), one past its rate 429 (it
// polled the devices' state past its limits).
func TestAnOpenProbeReadsNoDeviceMemory(t *testing.T) {
	e := testkit.Engine(t, engine.Config{})
	toks := map[string]string{}
	var lines []string
	for _, tk := range []struct {
		name   string
		scopes auth.Scope
		limits auth.Limits
	}{{"dash", auth.Read, auth.Limits{}}, {"app", auth.Invoke, auth.Limits{}}, {"slow", auth.Read, auth.Limits{Rate: 0.001, Burst: 1}}} {
		tok, err := auth.NewToken()
		if err != nil {
			t.Fatal(err)
		}
		toks[tk.name] = tok
		lines = append(lines, auth.Line(tk.name, tk.scopes, auth.Hash(tok), nil, tk.limits))
	}
	unknown, _ := auth.NewToken()
	toks["unknown"] = unknown
	tab, err := auth.Parse(strings.NewReader(strings.Join(lines, "\n")+"\n"), "tokens")
	if err != nil {
		t.Fatal(err)
	}
	url := testkit.ServeTokens(t, e, tab, httpapi.Options{})
	for _, tc := range []struct {
		token  string
		code   int
		memory bool
	}{{"", 200, false}, {"app", 200, false}, {"dash", 200, true}, {"slow", 200, true}, {"slow", 429, false}, {"unknown", 401, false}} {
		req, _ := http.NewRequest("GET", url+"/healthz", nil)
		if tc.token != "" {
			req.Header.Set("Authorization", "Bearer "+toks[tc.token])
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != tc.code {
			t.Fatalf("token %q: %d %s, want %d", tc.token, resp.StatusCode, body, tc.code)
		}
		if tc.code != 200 {
			if strings.Contains(string(body), "devices") {
				t.Errorf("token %q: refused %d, but told the devices: %s", tc.token, tc.code, body)
			}
			continue
		}
		var h struct {
			Status  string           `json:"status"`
			Devices []map[string]any `json:"devices"`
		}
		if err := json.Unmarshal(body, &h); err != nil || h.Status != "ok" || len(h.Devices) != 1 {
			t.Fatalf("token %q: %d %s (%v)", tc.token, resp.StatusCode, body, err)
		}
		d := h.Devices[0]
		_, mem := d["mem_total_bytes"]
		if mem != tc.memory || d["name"] == nil || d["healthy"] != true {
			t.Errorf("token %q: device %v: memory given %v, want %v, with its name and health", tc.token, d, mem, tc.memory)
		}
	}
}
