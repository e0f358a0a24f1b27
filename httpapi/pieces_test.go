package httpapi_test

import (
	"bufio"
	"bytes"
	"encoding/base64"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/engine"
	"github.com/plover-run/plover/httpapi"
	"github.com/plover-run/plover/internal/testkit"
)

// Bodies of every size around the edges of what fasthttp reads with the
// headers (8 KiB) and its read buffer (4 KiB) arrive whole when sent in one
// write, raw and as JSON, in turns and not: a read shorter than fasthttp's
// buffer once let it read ahead and keep the body's last bytes, and the
// server then waited on an empty socket until its read timeout (a 10,000
// byte JSON body, 60 s, then 408).
func TestBodiesOfEverySizeArrive(t *testing.T) {
	for _, off := range []bool{false, true} {
		t.Run(fmt.Sprintf("io shares off %v", off), func(t *testing.T) {
			cfg := engine.Config{}
			cfg.Sched.IO.Off = off
			e := testkit.Engine(t, cfg)
			m := testkit.Manifest("echo")
			m.OutBytes = 1 << 16
			m.ZeroOut = new(bool)
			m.Chain = []abi.Launch{{Kernel: "echo_exact", Grid: 1, Block: 256}}
			testkit.Deploy(t, e, testkit.BundleDir(t, m, nil))
			url := testkit.Serve(t, e, httpapi.Options{ReadTimeout: 20 * time.Second})
			for _, n := range []int{8191, 8192, 8193, 9000, 9472, 10000, 12287, 12288, 12289, 16384, 40000, 65535, 65536} {
				raw := bytes.Repeat([]byte{byte(n)}, n)
				postOnce(t, url, "application/octet-stream", raw, raw)
				// A JSON body of n bytes in all: {"input":"<base64>"}.
				in := raw[:(n-len(`{"input":""}`))/4*3]
				js := []byte(`{"input":"` + base64.StdEncoding.EncodeToString(in) + `"}`)
				postOnce(t, url, "application/json", js, nil)
			}
		})
	}
}

// postOnce sends body in one write on a connection of its own and wants a 200
// within 5 s (and want back, if set).
func postOnce(t *testing.T, url, ct string, body, want []byte) {
	t.Helper()
	c, err := net.Dial("tcp", strings.TrimPrefix(url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	req := fmt.Sprintf("POST /v1/functions/echo/invoke HTTP/1.1\r\nHost: localhost\r\nContent-Type: %s\r\nContent-Length: %d\r\n\r\n", ct, len(body))
	if _, err := c.Write(append([]byte(req), body...)); err != nil {
		t.Fatal(err)
	}
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("%s body of %d bytes: no answer within 5 s: %v", ct, len(body), err)
	}
	got, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || (want != nil && !bytes.Equal(got, want)) {
		t.Fatalf("%s body of %d bytes: %d, %d bytes back", ct, len(body), resp.StatusCode, len(got))
	}
}
