package httpapi_test

import (
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/plover-run/plover/auth"
	"github.com/plover-run/plover/device"
	"github.com/plover-run/plover/engine"
	"github.com/plover-run/plover/httpapi"
	"github.com/plover-run/plover/internal/testkit"
)

// faulted is a device with a sticky fault.
type faulted struct{ device.Device }

func (faulted) Health() error { return errors.New("a sticky fault") }

// What the Helm chart's readiness probe relies on: /v2/health/ready is 503
// while a device is unhealthy, and open to a probe (no token) on a server
// that checks tokens; /readyz, which says only starting or draining, stays
// 200. A pod with a failed GPU on /readyz stayed in the Service's endpoints
// answering 503 until liveness restarted it.
func TestReadinessCountsTheDevices(t *testing.T) {
	tok, err := auth.NewToken()
	if err != nil {
		t.Fatal(err)
	}
	tab, err := auth.Parse(strings.NewReader(auth.Line("ops", auth.Admin, auth.Hash(tok), nil, auth.Limits{})+"\n"), "tokens")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name      string
		dev       device.Device
		v2, readz int
	}{
		{"healthy", device.NewHost(0), 200, 200},
		{"a faulted device", faulted{device.NewHost(0)}, 503, 200},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := testkit.Engine(t, engine.Config{Devices: []device.Device{tc.dev}})
			url := testkit.ServeTokens(t, e, tab, httpapi.Options{})
			for path, want := range map[string]int{"/v2/health/ready": tc.v2, "/readyz": tc.readz} {
				resp, err := http.Get(url + path) // no token: a kubelet's probe
				if err != nil {
					t.Fatal(err)
				}
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != want {
					t.Errorf("GET %s without a token: %d %s, want %d", path, resp.StatusCode, b, want)
				}
			}
		})
	}
}
