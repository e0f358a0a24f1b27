package httpapi_test

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/plover-run/plover/auth"
	"github.com/plover-run/plover/engine"
	"github.com/plover-run/plover/httpapi"
	"github.com/plover-run/plover/internal/testkit"
	"github.com/plover-run/plover/objectstore"
)

// A large answer written after its handler returned keeps its token's
// place in its concurrency until its last piece is written: given back
// with the handler's return, a token of concurrency 1 could have any
// number of large answers held in the server for clients that read them
// slowly. Once the answer is read to its end, the place is free for the
// next request, on another connection. So too for a name's first request
// on a node (another node's deploy), which has no I/O turns yet and is
// written without them (helper-383's LOW: its ticket went before it).
func TestALargeAnswerHoldsItsTokensPlaceUntilWritten(t *testing.T) {
	for _, elsewhere := range []bool{false, true} {
		t.Run(map[bool]string{false: "deployed here", true: "first request on another node"}[elsewhere], func(t *testing.T) {
			store, err := objectstore.NewFS(filepath.Join(t.TempDir(), "store"))
			if err != nil {
				t.Fatal(err)
			}
			e := testkit.Engine(t, engine.Config{Store: store})
			m := testkit.Manifest("big")
			m.OutBytes = 32 << 20 // more than the loopback's socket buffers hold
			testkit.Deploy(t, e, testkit.BundleDir(t, m, nil))
			if elsewhere {
				e = testkit.Engine(t, engine.Config{Store: store})
			}
			holdsItsPlace(t, e, m.OutBytes)
		})
	}
}

func holdsItsPlace(t *testing.T, e *engine.Engine, size int64) {
	tok, err := auth.NewToken()
	if err != nil {
		t.Fatal(err)
	}
	tab, err := auth.Parse(strings.NewReader(auth.Line("single", auth.Invoke|auth.Read, auth.Hash(tok), nil, auth.Limits{Concurrency: 1})+"\n"), "tokens")
	if err != nil {
		t.Fatal(err)
	}
	addr := strings.TrimPrefix(testkit.ServeTokens(t, e, tab, httpapi.Options{}), "http://")
	req := "POST /v1/functions/big/invoke HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer " + tok + "\r\nContent-Length: 1\r\n\r\nx"

	slow, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer slow.Close()
	slow.SetDeadline(time.Now().Add(30 * time.Second))
	if _, err := io.WriteString(slow, req); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(slow), nil) // the headers: the handler has returned
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("the first request: %v %v", resp, err)
	}
	if code := oneExchange(t, addr, req); code != 429 {
		t.Fatalf("a second request while the first's answer is unread: %d, want 429 (the token's one place held)", code)
	}
	if n, err := io.Copy(io.Discard, resp.Body); err != nil || n != size {
		t.Fatalf("the first answer: %d bytes (%v), want %d", n, err, size)
	}
	if code := oneExchange(t, addr, req); code != 200 {
		t.Fatalf("a request once the first answer is read: %d, want 200", code)
	}
}

// oneExchange sends raw on a connection of its own and returns the status
// of its answer, read to its end.
func oneExchange(t *testing.T, addr, raw string) int {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c, raw); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode
}
