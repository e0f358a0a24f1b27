package httpapi_test

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/plover-run/plover/bundle"
	"github.com/plover-run/plover/engine"
	"github.com/plover-run/plover/httpapi"
	"github.com/plover-run/plover/internal/testkit"
)

// A deploy's upload that fails is told for what it is: one that stalls a
// read timeout is a 408 saying so, one that ends short of its length a
// 400 saying how short (it was taken for a damaged bundle, 422), and one
// that keeps moving is not cut off at the read timeout, which bounds the
// wait between its bytes, not the whole upload (a large bundle over a
// slow link). Before, the first two were 400 "deploy: reading the bundle"
// with no reason, and the third a 400 at the read timeout.
func TestDeployUploadFaults(t *testing.T) {
	const readTimeout = time.Second
	e := testkit.Engine(t, engine.Config{})
	url := testkit.Serve(t, e, httpapi.Options{ReadTimeout: readTimeout})
	// Constants of 1 MiB that do not compress: a body fasthttp streams to
	// the handler (a small one it reads whole before it).
	m := testkit.Manifest("slow")
	m.Constants = "weights.bin"
	consts := make([]byte, 1<<20)
	rand.Read(consts)
	b, _, _, err := bundle.PackBytes(testkit.BundleDir(t, m, consts))
	if err != nil {
		t.Fatal(err)
	}
	const pieces = 10
	for _, tc := range []struct {
		name   string
		send   func(c *net.TCPConn) error
		status int
		says   string
	}{
		{"stalled", func(c *net.TCPConn) error {
			_, err := c.Write(b[:len(b)/2])
			return err // and nothing more, the connection open
		}, 408, "the bundle's upload stalled: no byte of it arrived for the server's read timeout of 1s"},
		{"cut short", func(c *net.TCPConn) error {
			if _, err := c.Write(b[:len(b)/2]); err != nil {
				return err
			}
			return c.CloseWrite()
		}, 400, fmt.Sprintf("the bundle ended after %d of its %d bytes", len(b)/2, len(b))},
		{"slow but moving", func(c *net.TCPConn) error {
			// pieces a quarter of the read timeout apart: 2.5 times it in all
			step := (len(b) + pieces - 1) / pieces
			for i := 0; i < len(b); i += step {
				if _, err := c.Write(b[i:min(i+step, len(b))]); err != nil {
					return err
				}
				time.Sleep(readTimeout / 4)
			}
			return nil
		}, 201, `"name":"slow"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := net.Dial("tcp", strings.TrimPrefix(url, "http://"))
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			c.SetDeadline(time.Now().Add(20 * time.Second))
			fmt.Fprintf(c, "PUT /v1/functions/slow?force=true HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: %s\r\nContent-Length: %d\r\n\r\n", bundle.MediaType, len(b))
			if err := tc.send(c.(*net.TCPConn)); err != nil {
				t.Fatal(err)
			}
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != tc.status || !strings.Contains(string(body), tc.says) {
				t.Errorf("%d %s; want %d saying %q", resp.StatusCode, body, tc.status, tc.says)
			}
		})
	}
}

// A request body in a Content-Encoding no route decodes is refused (415
// naming it): read as sent, a gzip body ran the function on its
// compressed bytes and answered 200. identity, or an encoding on a
// request without a body, is no refusal.
func TestEncodedBodiesAreRefused(t *testing.T) {
	base, _ := setup(t)
	for _, tc := range []struct {
		name, path, ctype, encoding string
		body                        []byte
		status                      int
		says                        string
	}{
		{"invoke gzip", "/v1/functions/echo/invoke", "application/octet-stream", "gzip", []byte{0x1f, 0x8b, 8, 0}, 415, `Content-Encoding \"gzip\": request bodies are read as sent`},
		{"v2 deflate", "/v2/models/echo/infer", "application/json", "deflate", []byte("x"), 415, `Content-Encoding \"deflate\"`},
		{"deploy br", "/v1/functions/echo", bundle.MediaType, "br", []byte("x"), 415, `Content-Encoding \"br\"`},
		{"identity", "/v1/functions/echo/invoke", "application/octet-stream", "Identity", []byte("hi"), 200, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			method := "POST"
			if strings.HasPrefix(tc.name, "deploy") {
				method = "PUT"
			}
			req, _ := http.NewRequest(method, base+tc.path, bytes.NewReader(tc.body))
			req.Header.Set("Content-Type", tc.ctype)
			req.Header.Set("Content-Encoding", tc.encoding)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != tc.status || !strings.Contains(string(body), tc.says) {
				t.Errorf("%d %s; want %d saying %s", resp.StatusCode, body, tc.status, tc.says)
			}
		})
	}
	req, _ := http.NewRequest("GET", base+"/v1/functions/echo", nil)
	req.Header.Set("Content-Encoding", "gzip")
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != 200 {
		t.Errorf("a GET with Content-Encoding and no body: %v %v", resp.StatusCode, err)
	}
}

// A JSON invoke body's field of the wrong type is named with what it is
// and what it should be, not with encoding/json's Go types; a timeout
// longer than a time.Duration holds is cut to the server's longest, not
// wrapped round to a negative (ignored) or tiny one (a 504), over the
// header as over the body.
func TestInvokeBodyFieldsAndLongTimeouts(t *testing.T) {
	base, _ := setup(t)
	url := base + "/v1/functions/echo/invoke"
	for _, tc := range []struct {
		name, body, header string
		status             int
		says               string
	}{
		{"string for an integer", `{"input":"","out_bytes":"16"}`, "", 400, `\"out_bytes\" is a string, want an integer`},
		{"number for an array", `{"input":"","chain":3}`, "", 400, `\"chain\" is a number, want an array`},
		{"timeout past a Duration", `{"input":"aGk=","timeout_ms":18446744073710}`, "", 200, ""},
		{"timeout header past 32 bits", `{"input":"aGk="}`, "4294967296", 200, ""},
		{"timeout header past 64 bits", `{"input":"aGk="}`, "18446744073709551616", 200, ""},
		{"timeout header not a number", `{"input":"aGk="}`, "soon", 400, `must be a positive number of milliseconds`},
		{"closing brackets after the object", `{"input":"aGk="}]]}}`, "", 400, `trailing data after the JSON object (4 bytes)`},
		{"whitespace after the object", "{\"input\":\"aGk=\"} \r\n\t", "", 200, ""},
		{"an unknown field", `{"input":"aGk=","inptu":""}`, "", 400, `body: has an unknown field \"inptu\"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req, _ := http.NewRequest("POST", url, strings.NewReader(tc.body))
			req.Header.Set("Content-Type", "application/json")
			if tc.header != "" {
				req.Header.Set("X-Plover-Timeout-Ms", tc.header)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != tc.status || !strings.Contains(string(body), tc.says) || bytes.Contains(body, []byte("Go struct")) {
				t.Errorf("%d %s; want %d saying %s", resp.StatusCode, body, tc.status, tc.says)
			}
			if tc.status == 200 {
				var out struct{ Output string }
				if json.Unmarshal(body, &out) != nil || out.Output == "" {
					t.Errorf("no output in %s", body)
				}
			}
		})
	}
}
