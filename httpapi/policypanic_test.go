package httpapi_test

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/plover-run/plover/engine"
	"github.com/plover-run/plover/httpapi"
	"github.com/plover-run/plover/internal/testkit"
)

var startBug = testkit.RegisterPolicyBug("httpapi-test-buggy")

// A panic in the device scheduler's policy, under its mutex, is recovered
// by the HTTP transport (500). Before the fix the scheduler stayed locked:
// every later request to any function on the device hung past its
// deadline, where before the transports recovered the process ended (and
// was restarted).
func TestSchedulerPolicyPanicLeavesDeviceUsable(t *testing.T) {
	e := testkit.Engine(t, engine.Config{Sched: engine.SchedConfig{Policy: "httpapi-test-buggy"}})
	testkit.Deploy(t, e, testkit.BundleDir(t, testkit.Manifest("echo"), nil))
	api := testkit.Serve(t, e, httpapi.Options{})
	c := &http.Client{Timeout: 3 * time.Second}
	post := func() (int, error) {
		req, err := http.NewRequest("POST", api+"/v1/functions/echo/invoke", strings.NewReader("hello"))
		if err != nil {
			return 0, err
		}
		req.Header.Set("X-Plover-Timeout-Ms", "500")
		resp, err := c.Do(req)
		if err != nil {
			return 0, err
		}
		resp.Body.Close()
		return resp.StatusCode, nil
	}
	if st, err := post(); st != 200 {
		t.Fatalf("the first request: %d %v", st, err)
	}
	startBug.Arm("Started")
	if st, err := post(); st != 500 || startBug.Armed() {
		t.Fatalf("the request whose admission panics: %d %v (the bug still armed: %v), want 500", st, err, startBug.Armed())
	}
	t0 := time.Now()
	if st, err := post(); st != 200 {
		t.Fatalf("the next request (500 ms deadline): %d %v after %v: the scheduler's mutex is still held", st, err, time.Since(t0))
	}
}

var countedBug = testkit.RegisterPolicyBug("httpapi-test-counted")

// An invoke whose handling panicked is counted as a 500 in
// plover_requests_total, besides plover_panics_total. It was in
// plover_panics_total alone, so an error rate on requests did not see it.
func TestPanickedInvokeIsCounted(t *testing.T) {
	e := testkit.Engine(t, engine.Config{Sched: engine.SchedConfig{Policy: "httpapi-test-counted"}})
	testkit.Deploy(t, e, testkit.BundleDir(t, testkit.Manifest("echo"), nil))
	reg := prometheus.NewRegistry()
	api := testkit.Serve(t, e, httpapi.Options{Registry: reg})
	if resp, body := testkit.Post(t, "POST", api+"/v1/functions/echo/invoke", "application/octet-stream", []byte("hello")); resp.StatusCode != 200 {
		t.Fatalf("the first request: %d %s", resp.StatusCode, body)
	}
	countedBug.Arm("Started")
	if resp, body := testkit.Post(t, "POST", api+"/v1/functions/echo/invoke", "application/octet-stream", []byte("hello")); resp.StatusCode != 500 {
		t.Fatalf("the request whose admission panics: %d %s, want 500", resp.StatusCode, body)
	}
	if n := testkit.Panics(t, reg, "http"); n != 1 {
		t.Errorf("plover_panics_total{transport=http} %v, want 1", n)
	}
	if n, _ := testkit.Counter(t, reg, "plover_requests_total", map[string]string{"function": "echo", "code": "500"}); n != 1 {
		t.Errorf(`plover_requests_total{function="echo",code="500"} %v, want 1`, n)
	}
}
