package httpapi

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"runtime"
	"runtime/debug"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/plover-run/plover/api"
	"github.com/plover-run/plover/call"
	"github.com/plover-run/plover/frontdoor"
	"github.com/plover-run/plover/internal/racebuild"
	"github.com/plover-run/plover/ioshare"
	"github.com/plover-run/plover/pipeline"
)

// outputRunner answers as the engine does where no slot is lent: the
// output in the buffer the request brings when it is large enough, else
// in one made at the function's size. Each function's name says its
// output: its size (big: past keptBody; mid: within it), a short answer
// in a big buffer (a function writing fewer bytes than its out_bytes),
// or a run that fails after its output was made. seen is the capacity
// of the output buffer the last request brought: what the server kept.
type outputRunner struct {
	frontdoor.Runner // nil: a method not below panics
	seen             *atomic.Int64
}

func (outputRunner) Deadline(d, _ time.Time) time.Time { return d }
func (outputRunner) Land(string) call.Landing          { return nil }
func (outputRunner) IO(string) *ioshare.Flow           { return nil }

func (outputRunner) Admit(context.Context, string, time.Time) (pipeline.Admission, error) {
	return pipeline.Admission{}, nil
}

var errRunFailed = errors.New("the run failed after its output was made")

func (r outputRunner) Invoke(_ context.Context, name string, req *call.Request) error {
	r.seen.Store(int64(cap(req.Output)))
	size, answer, err := 100, -1, error(nil)
	switch name {
	case "big":
		size = 4 << 20
	case "big-short":
		size, answer = 4<<20, 10
	case "big-fail":
		size, err = 4<<20, errRunFailed
	case "mid":
		size = 512 << 10
	case "mid-fail":
		size, err = 512<<10, errRunFailed
	}
	if cap(req.Output) < size {
		req.Output = make([]byte, size)
	}
	req.Output = req.Output[:size]
	if answer >= 0 {
		req.Output = req.Output[:answer]
	}
	return err
}

// What a request's output leaves behind for the next request once it is
// answered, as that request's run finds it: the pooled exchange's output
// (a JSON invoke's) and the connection's response buffer (a raw invoke's,
// which the run writes into when no slot is lent) hold no more than
// keptBody after an output past it, whether the run succeeded, answered
// fewer bytes than its buffer holds, or failed; one within it is kept,
// for the next request to reuse. Before, each pooled exchange and each
// idle keep-alive connection a burst of large outputs passed through kept
// one for good.
func TestLargeOutputIsNotKept(t *testing.T) {
	// One P and no collection: the next request of the connection gets
	// the exchange the last one put back (sync.Pool's per-P slot).
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	defer debug.SetGCPercent(debug.SetGCPercent(-1))
	var seen atomic.Int64
	addr := servedOn(t, New(frontdoor.New(frontdoor.Config{Runner: outputRunner{seen: &seen}}), nil, Options{}))
	for _, tc := range []struct {
		name, fn, ct string
		status, size int   // the first request's answer: its status, its output's bytes (raw)
		keptAtLeast  int64 // what the next request must find kept (0: nothing over keptBody)
	}{
		{"JSON, a big output", "big", "application/json", 200, 4 << 20, 0},
		{"JSON, a big output, the run failed", "big-fail", "application/json", 500, 0, 0},
		{"JSON, an output within the bound is kept", "mid", "application/json", 200, 512 << 10, 512 << 10},
		{"raw, a big output", "big", "application/octet-stream", 200, 4 << 20, 0},
		{"raw, a short answer in a big buffer", "big-short", "application/octet-stream", 200, 10, 0},
		{"raw, a big output, the run failed", "big-fail", "application/octet-stream", 500, 0, 0},
		{"raw, an output within the bound is kept", "mid-fail", "application/octet-stream", 500, 0, 512 << 10},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, br := dialKept(t, addr)
			st, n := invokeOn(t, c, br, tc.fn, tc.ct)
			if st != tc.status || (st == 200 && tc.ct != "application/json" && n != tc.size) {
				t.Fatalf("%s: %d with %d bytes, want %d with %d", tc.fn, st, n, tc.status, tc.size)
			}
			if st, _ := invokeOn(t, c, br, "small", tc.ct); st != 200 {
				t.Fatalf("the next request on the connection: %d", st)
			}
			got := seen.Load()
			switch {
			case tc.keptAtLeast > 0 && tc.ct == "application/json" && racebuild.Enabled:
				// The race detector drops sync.Pool's items on purpose:
				// the next request may find a fresh exchange.
			case tc.keptAtLeast == 0 && got > keptBody:
				t.Errorf("after %s's output the next request found a buffer of %d bytes kept, want at most %d", tc.fn, got, keptBody)
			case got < tc.keptAtLeast:
				t.Errorf("after %s's output the next request found a buffer of %d bytes, want its %d kept for reuse", tc.fn, got, tc.keptAtLeast)
			}
		})
	}
}

// invokeOn sends an invoke of fn with an empty input on c, as ct, and
// reads its answer from br: its status and its body's length.
func invokeOn(t *testing.T, c net.Conn, br *bufio.Reader, fn, ct string) (int, int) {
	t.Helper()
	body := ""
	if ct == "application/json" {
		body = `{"input":""}`
	}
	if _, err := fmt.Fprintf(c, "POST /v1/functions/%s/invoke HTTP/1.1\r\nHost: localhost\r\nContent-Type: %s\r\nContent-Length: %d\r\n\r\n%s",
		fn, ct, len(body), body); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("%s: no answer: %v", fn, err)
	}
	defer resp.Body.Close()
	n, err := io.Copy(io.Discard, resp.Body)
	if err != nil || resp.Close {
		t.Fatalf("%s: %d, %d bytes, %v, closing %v: want a whole answer on a connection kept open", fn, resp.StatusCode, n, err, resp.Close)
	}
	if resp.StatusCode == 500 && !strings.Contains(resp.Header.Get("Content-Type"), "json") {
		t.Fatalf("%s: a 500 that is not an error object", fn)
	}
	return resp.StatusCode, int(n)
}

// listingAdmin lists n functions of long names: a GET /v1/functions answer
// of about n*540 bytes, written into the response's own buffer.
type listingAdmin struct {
	Admin // nil: a method not below panics
	n     int
}

func (a listingAdmin) Functions(context.Context) ([]api.FunctionInfo, error) {
	fs := make([]api.FunctionInfo, a.n)
	for i := range fs {
		fs[i].Name = fmt.Sprintf("a-function-of-a-long-name-%0120d", i)
	}
	return fs, nil
}

// An answer a handler writes into the response's own buffer (a listing
// here; a scrape or a /v2 answer alike) leaves the connection a buffer of
// at most keptBody once it is past it, as the next request on the
// connection finds it (a raw invoke runs into the response's buffer); one
// within it is kept. Before, each keep-alive connection a long listing
// passed through held its size for good. The answer itself is whole.
func TestLargeListingIsNotKept(t *testing.T) {
	for _, tc := range []struct {
		name        string
		functions   int
		keptAtLeast int64
	}{
		{"a listing past the bound", 20000, 0},
		{"a listing within it is kept", 500, 128 << 10},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var seen atomic.Int64
			c, br := dialKept(t, servedOn(t, New(frontdoor.New(frontdoor.Config{Runner: outputRunner{seen: &seen}}), listingAdmin{n: tc.functions}, Options{})))
			fmt.Fprintf(c, "GET /v1/functions HTTP/1.1\r\nHost: localhost\r\n\r\n")
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatal(err)
			}
			var list struct{ Functions []api.FunctionInfo }
			err = json.NewDecoder(resp.Body).Decode(&list)
			resp.Body.Close()
			if err != nil || resp.StatusCode != 200 || len(list.Functions) != tc.functions || resp.Close {
				t.Fatalf("listing: %d, %d functions, %v, closing %v; want 200 with %d on a connection kept open", resp.StatusCode, len(list.Functions), err, resp.Close, tc.functions)
			}
			if st, _ := invokeOn(t, c, br, "small", "application/octet-stream"); st != 200 {
				t.Fatalf("the next request on the connection: %d", st)
			}
			switch got := seen.Load(); {
			case tc.keptAtLeast == 0 && got > keptBody:
				t.Errorf("after a listing of %d functions the next request found a buffer of %d bytes kept, want at most %d", tc.functions, got, keptBody)
			case got < tc.keptAtLeast:
				t.Errorf("after a listing of %d functions the next request found a buffer of %d bytes, want it kept for reuse", tc.functions, got)
			}
		})
	}
}

// servedOn serves s on a loopback port until the test ends: its address.
func servedOn(t *testing.T, s *Server) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go s.Serve(ln)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		s.Shutdown(ctx)
	})
	return ln.Addr().String()
}

// dialKept is a connection to addr, closed when the test ends, and its
// reader: its requests are sent one after another on it.
func dialKept(t *testing.T, addr string) (net.Conn, *bufio.Reader) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(20 * time.Second))
	return c, bufio.NewReader(c)
}
