package httpapi_test

import (
	"encoding/json"
	"io"
	"net/http"
	"testing"

	"github.com/plover-run/plover/auth"
	"github.com/plover-run/plover/engine"
	"github.com/plover-run/plover/httpapi"
	"github.com/plover-run/plover/internal/testkit"
)

// /healthz is open to probes, but with tokens it tells a caller without a
// token of the read scope only each device's name and health: its memory,
// pinned bytes and error follow other tenants' loads and cold starts.
// Before, anyone who reached the port read them (a review's probe).
func TestAnOpenProbeReadsNoDeviceMemory(t *testing.T) {
	e := testkit.Engine(t, engine.Config{})
	tab, toks := newTokens(t, tokenSpec{"dash", auth.Read, nil}, tokenSpec{"app", auth.Invoke, nil})
	url := testkit.ServeTokens(t, e, tab, httpapi.Options{})
	for _, tc := range []struct {
		token  string
		memory bool
	}{{"", false}, {"app", false}, {"dash", true}} {
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
		var h struct {
			Status  string           `json:"status"`
			Devices []map[string]any `json:"devices"`
		}
		if err := json.Unmarshal(body, &h); err != nil || resp.StatusCode != 200 || h.Status != "ok" || len(h.Devices) != 1 {
			t.Fatalf("token %q: %d %s (%v)", tc.token, resp.StatusCode, body, err)
		}
		d := h.Devices[0]
		_, mem := d["mem_total_bytes"]
		if mem != tc.memory || d["name"] == nil || d["healthy"] != true {
			t.Errorf("token %q: device %v: memory given %v, want %v, with its name and health", tc.token, d, mem, tc.memory)
		}
	}
}
