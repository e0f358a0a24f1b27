package httpapi_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/plover-run/plover/bundle"
	"github.com/plover-run/plover/engine"
	"github.com/plover-run/plover/httpapi"
	"github.com/plover-run/plover/internal/testkit"
)

// A request whose Content-Length is over --max-body is answered from its
// headers, whatever of its body has come: fasthttp read min(Content-Length,
// 8 KiB) of a body before any handler, so that one announcing 2^63-1
// bytes and sending 100 had no answer until the read timeout (408 after
// 60 s). A route that reads no body answers too, closing the connection.
func TestBodyOverMaxBodyIsAnsweredAtOnce(t *testing.T) {
	e := testkit.Engine(t, engine.Config{})
	testkit.Deploy(t, e, testkit.BundleDir(t, testkit.Manifest("echo"), nil))
	addr := strings.TrimPrefix(testkit.Serve(t, e, httpapi.Options{MaxBodyBytes: 1 << 20, ReadTimeout: time.Minute}), "http://")
	sent := strings.Repeat("x", 100)
	for _, tc := range []struct {
		name, head string
		code       int
		want       string
	}{
		{"v1 invoke", "POST /v1/functions/echo/invoke HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/octet-stream\r\n", 413, "request body of 9223372036854775807 bytes is over the limit"},
		{"v2 infer", "POST /v2/models/echo/infer HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n", 413, "request body of 9223372036854775807 bytes is over the limit"},
		{"deploy", "PUT /v1/functions/echo HTTP/1.1\r\nHost: localhost\r\nContent-Type: " + bundle.MediaType + "\r\n", 413, "bundle of 9223372036854775807 bytes is over the limit of 1048576 bytes (plover serve --max-body)"},
		{"a route without a body", "GET /healthz HTTP/1.1\r\nHost: localhost\r\n", 200, ""},
		// An HTTP/1.0 request's 100-continue is ignored, not its length.
		{"HTTP/1.0 expecting 100-continue", "POST /v1/functions/echo/invoke HTTP/1.0\r\nHost: localhost\r\nExpect: 100-continue\r\nContent-Type: application/octet-stream\r\n", 413, "request body of 9223372036854775807 bytes is over the limit"},
	} {
		for _, cl := range []int64{1<<63 - 1, 2 << 20} {
			t.Run(fmt.Sprintf("%s, Content-Length %d", tc.name, cl), func(t *testing.T) {
				want := strings.ReplaceAll(tc.want, "9223372036854775807", fmt.Sprint(cl))
				code, b := firstResponse(t, addr, fmt.Sprintf("%sContent-Length: %d\r\n\r\n%s", tc.head, cl, sent), 5*time.Second)
				if code != tc.code || !strings.Contains(b, want) {
					t.Fatalf("%d %s; want %d saying %q within 5 s", code, b, tc.code, want)
				}
			})
		}
	}
	// Within --max-body a request is served as before on the same server.
	code, b := firstResponse(t, addr, "POST /v1/functions/echo/invoke HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/octet-stream\r\nContent-Length: 100\r\n\r\n"+sent, 5*time.Second)
	if code != 200 || !strings.HasPrefix(b, sent) {
		t.Fatalf("a body within --max-body: %d %.80s", code, b)
	}
}
