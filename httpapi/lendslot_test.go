package httpapi_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/plover-run/plover/call"
	"github.com/plover-run/plover/frontdoor"
	"github.com/plover-run/plover/httpapi"
	"github.com/plover-run/plover/internal/testkit"
	"github.com/plover-run/plover/ioshare"
	"github.com/plover-run/plover/reqmetrics"
)

// countedSlot is a worker's slot that counts its lends and releases.
type countedSlot struct {
	mem      []byte
	released *atomic.Int32
}

func (s *countedSlot) Input() []byte  { return s.mem[:len(s.mem)/2] }
func (s *countedSlot) Output() []byte { return s.mem[len(s.mem)/2:] }
func (s *countedSlot) Release()       { s.released.Add(1) }
func (s *countedSlot) Discard()       { s.released.Add(1) }

// lendingRunner lends a slot of 1 MiB in and out to every raw invoke and
// echoes its input from there, as a device's run leaves its output in
// the slot. Its flow's first lookup (turnsOf, as a request's handler
// starts on its body) is signalled on started.
type lendingRunner struct {
	testkit.PanicRunner
	fl                *ioshare.Flow
	started           chan struct{}
	lent, released    *atomic.Int32
	fromSlot, notInIt *atomic.Int32
}

func (r lendingRunner) IO(string) *ioshare.Flow {
	select {
	case r.started <- struct{}{}:
	default:
	}
	return r.fl
}

func (r lendingRunner) Land(string) call.Landing {
	r.lent.Add(1)
	return &countedSlot{mem: make([]byte, 2<<20), released: r.released}
}

func (r lendingRunner) Invoke(_ context.Context, _ string, req *call.Request) error {
	if req.Landing == nil {
		r.notInIt.Add(1)
		req.Output = append(req.Output[:0], req.Input...)
		return nil
	}
	r.fromSlot.Add(1)
	req.Output = append(req.Landing.Output()[:0], req.Input...)
	return nil
}

// A raw invoke's body is lent its function's worker slot only once it is
// arriving, not as its handler starts: a client that sent its headers and
// nothing more (a chunked body, one that expects 100-continue, one that
// stopped at the end of what fasthttp reads with the headers) holds no
// slot while it waits, where 32 such connections took every slot of a
// worker's pool from the function's other requests, which then copied
// their bodies and answers. Once the body comes, it lands in the slot and
// its answer is written from there, copying at most what was read before
// the slot was lent. A chunked body holds none until it has all come, a
// chunk and a pause included (a read cut inside fasthttp's chunk parser
// could not resume, so such a body could not give a slot back as it
// paused): it is read into memory and copied into its slot once, whole.
func TestSlotLentOnlyOnceTheBodyArrives(t *testing.T) {
	const size = 256 << 10
	for _, tc := range []struct {
		name string
		// head is what the client sends before it stops: the request's
		// headers and perhaps some of its body.
		head func(body []byte) string
		rest func(body []byte) string // the rest, once the slot is checked
		// expect: the client waits for 100 Continue before the rest.
		expect bool
		// most bytes copied: what was read before the slot was lent.
		copied int
	}{
		{"chunked, headers only",
			func([]byte) string {
				return "POST /v1/functions/f/invoke HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/octet-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
			},
			func(b []byte) string { return fmt.Sprintf("%x\r\n%s\r\n0\r\n\r\n", len(b), b) },
			false, size},
		{"chunked, a chunk and a pause",
			func(b []byte) string {
				return fmt.Sprintf("POST /v1/functions/f/invoke HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/octet-stream\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n", 100<<10, b[:100<<10])
			},
			func(b []byte) string { return fmt.Sprintf("%x\r\n%s\r\n0\r\n\r\n", len(b)-100<<10, b[100<<10:]) },
			false, size},
		{"Expect: 100-continue, no body yet",
			func([]byte) string {
				return fmt.Sprintf("POST /v1/functions/f/invoke HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/octet-stream\r\nContent-Length: %d\r\nExpect: 100-continue\r\n\r\n", size)
			},
			func(b []byte) string { return string(b) },
			true, 0},
		{"Content-Length, stopped after the pre-read",
			func(b []byte) string {
				return fmt.Sprintf("POST /v1/functions/f/invoke HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/octet-stream\r\nContent-Length: %d\r\n\r\n%s", size, b[:8<<10])
			},
			func(b []byte) string { return string(b[8<<10:]) },
			false, 8 << 10},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := lendingRunner{fl: ioshare.New(ioshare.Config{Slots: 2}).Flow("f"), started: make(chan struct{}, 1),
				lent: new(atomic.Int32), released: new(atomic.Int32), fromSlot: new(atomic.Int32), notInIt: new(atomic.Int32)}
			reg := prometheus.NewRegistry()
			door := frontdoor.New(frontdoor.Config{Runner: r, Metrics: reqmetrics.New(reg)})
			url := testkit.ServeWith(t, httpapi.New(door, nil, httpapi.Options{Registry: reg}))
			c, err := net.Dial("tcp", strings.TrimPrefix(url, "http://"))
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			c.SetDeadline(time.Now().Add(20 * time.Second))
			br := bufio.NewReader(c)
			body := bytes.Repeat([]byte("0123456789abcdef"), size/16)
			if _, err := io.WriteString(c, tc.head(body)); err != nil {
				t.Fatal(err)
			}
			select {
			case <-r.started: // the handler is on the body now, and waits for it
			case <-time.After(10 * time.Second):
				t.Fatal("the request's handler did not start")
			}
			if tc.expect {
				resp, err := http.ReadResponse(br, nil)
				if err != nil || resp.StatusCode != 100 {
					t.Fatalf("before the body: %v %v, want 100 Continue", resp, err)
				}
			}
			// The body being read, then a moment for a handler that would
			// lend it a slot now: none must.
			for end := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
				if _, inMemory := r.fl.Bodies(); inMemory == 1 {
					break
				}
				if time.Now().After(end) {
					t.Fatal("the request's body is not being read")
				}
			}
			time.Sleep(100 * time.Millisecond)
			if inSlot, inMemory := r.fl.Bodies(); r.lent.Load() != 0 || inSlot != 0 || inMemory != 1 {
				t.Fatalf("%d slots lent, bodies read in a slot %d and in memory %d, while the client holds the rest of its body back; want none lent, one read in memory", r.lent.Load(), inSlot, inMemory)
			}
			if _, err := io.WriteString(c, tc.rest(body)); err != nil {
				t.Fatal(err)
			}
			wantOwnBytes(t, br, body, "once the body came")
			if r.lent.Load() != 1 || r.fromSlot.Load() != 1 || r.notInIt.Load() != 0 {
				t.Fatalf("lent %d slots, ran %d from one and %d without: want one, and the run from it", r.lent.Load(), r.fromSlot.Load(), r.notInIt.Load())
			}
			for end := time.Now().Add(10 * time.Second); r.released.Load() != 1; time.Sleep(time.Millisecond) {
				if time.Now().After(end) {
					t.Fatalf("the slot was released %d times once its answer was written, want once", r.released.Load())
				}
			}
			copied, _ := testkit.Counter(t, reg, "plover_payload_copied_bytes_total", map[string]string{"function": "f"})
			t.Logf("%v payload bytes copied", copied)
			if int(copied) > tc.copied {
				t.Fatalf("%v payload bytes copied for a body of %d that landed in its slot, want at most %d", copied, size, tc.copied)
			}
		})
	}
}
