package httpapi_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/plover-run/plover/engine"
	"github.com/plover-run/plover/httpapi"
	"github.com/plover-run/plover/internal/testkit"
	"github.com/plover-run/plover/netguard"
)

// An answer the server holds in its own memory (a pipeline's, /v1's JSON,
// /v2's; not one written from its function's slot) counts in the body
// budget from when it is made until it is written or dropped: a client
// that asks for 16 MiB answers with 5-byte bodies and never reads them
// held the server's memory for up to the write timeout each, counted
// nowhere (a pipeline's answer left --max-pipeline-memory as its last
// step ended). Each row's answer is held while its client reads nothing,
// and given back once it reads the answer, or leaves without reading it.
func TestAnAnswerInMemoryHoldsTheBodyBudget(t *testing.T) {
	const out = 16 << 20
	e := testkit.Engine(t, engine.Config{})
	m := testkit.Manifest("echo")
	m.OutBytes = out
	testkit.Deploy(t, e, testkit.BundleDir(t, m, nil))
	testkit.Deploy(t, e, testkit.PipelineDir(t, "p", "echo"))
	budget := netguard.NewBudget(64 << 20)
	addr := strings.TrimPrefix(testkit.Serve(t, e, httpapi.Options{BodyBudget: budget}), "http://")

	request := func(route, ctype, body string) string {
		return fmt.Sprintf("POST %s HTTP/1.1\r\nHost: localhost\r\nContent-Type: %s\r\nContent-Length: %d\r\n\r\n%s", route, ctype, len(body), body)
	}
	v2 := `{"inputs":[{"name":"INPUT0","datatype":"UINT8","shape":[5],"data":[1,2,3,4,5]}],"parameters":{"binary_data_output":true}}`
	for _, tc := range []struct {
		name, req string
	}{
		{"a pipeline's answer", request("/v1/functions/p/invoke", "application/octet-stream", "hello")},
		{"/v1 JSON", request("/v1/functions/echo/invoke", "application/json", `{"input":"aGVsbG8="}`)},
		{"/v2 binary", request("/v2/models/echo/infer", "application/json", v2)},
	} {
		for _, reads := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s, client reads %v", tc.name, reads), func(t *testing.T) {
				c := dialSmallWindow(t, addr)
				defer c.Close()
				if _, err := io.WriteString(c, tc.req); err != nil {
					t.Fatal(err)
				}
				// The body holds at most a window: 16 MiB held is the answer.
				awaitBudget(t, budget, "an answer its client does not read is not counted", func(n int64) bool { return n >= out })
				if !reads {
					c.Close()
				} else {
					c.SetReadDeadline(time.Now().Add(15 * time.Second))
					resp, err := http.ReadResponse(bufio.NewReader(c), nil)
					if err != nil {
						t.Fatal(err)
					}
					n, err := io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					if err != nil || resp.StatusCode != 200 || n < out {
						t.Fatalf("%d, %d bytes, %v; want 200 and at least %d bytes", resp.StatusCode, n, err, out)
					}
				}
				awaitBudget(t, budget, "an answer written or dropped is still counted", func(n int64) bool { return n == 0 })
			})
		}
	}
}

// awaitBudget waits until ok holds of the bytes budget holds, failing the
// test with what after 10 s: a state the server reaches, waited for.
func awaitBudget(t *testing.T, budget interface{ InUse() int64 }, what string, ok func(int64) bool) {
	t.Helper()
	end := time.Now().Add(10 * time.Second)
	for !ok(budget.InUse()) {
		if time.Now().After(end) {
			t.Fatalf("%s: %d budget bytes in use", what, budget.InUse())
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// dialSmallWindow connects to addr with a 4 KiB receive buffer, so that
// an answer the client does not read stays with the server.
func dialSmallWindow(t *testing.T, addr string) net.Conn {
	t.Helper()
	d := net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error {
		var serr error
		err := rc.Control(func(fd uintptr) {
			serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4<<10)
		})
		if err != nil {
			return err
		}
		return serr
	}}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	return c
}
