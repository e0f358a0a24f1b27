package httpapi_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/plover-run/plover/frontdoor"
	"github.com/plover-run/plover/httpapi"
	"github.com/plover-run/plover/internal/selfsigned"
	"github.com/plover-run/plover/internal/testkit"
	"github.com/plover-run/plover/ioshare"
	"github.com/plover-run/plover/netguard"
	"github.com/plover-run/plover/reqmetrics"
)

// pausedConn is a client's socket that sends what is written to it, its TLS
// records too, but for the bytes past pass once hold set it, which it
// keeps until open: a client that pauses anywhere, in a TLS record's
// header or payload too.
type pausedConn struct {
	net.Conn
	mu   sync.Mutex
	pass int // bytes still sent before the rest is held; -1: all
	held []byte
}

func (c *pausedConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.pass < 0 {
		return c.Conn.Write(p)
	}
	n := min(len(p), c.pass)
	if _, err := c.Conn.Write(p[:n]); err != nil {
		return 0, err
	}
	c.pass -= n
	c.held = append(c.held, p[n:]...)
	return len(p), nil
}

func (c *pausedConn) hold(pass int) {
	c.mu.Lock()
	c.pass = pass
	c.mu.Unlock()
}

func (c *pausedConn) open() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.pass = -1
	_, err := c.Conn.Write(c.held)
	c.held = nil
	return err
}

// wantOwnBytes reads an answer from br and wants it a 200 of body's bytes.
func wantOwnBytes(t *testing.T, br *bufio.Reader, body []byte, when string) {
	t.Helper()
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	out, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != 200 || !bytes.Equal(out, body) {
		t.Fatalf("%s: %d, %d bytes of %d, %v; its own bytes back %v", when, resp.StatusCode, len(out), len(body), err, bytes.Equal(out, body))
	}
}

// refusingRunner is a lendingRunner that counts nothing of the requests
// refused before their runs (a 504 or 408 while the body arrives).
type refusingRunner struct{ lendingRunner }

func (refusingRunner) Refused(string, int) {}

// A raw invoke's body lent its worker's slot that stops arriving gives the
// slot back once it has brought no byte for the slot's idle time (250 ms
// to twice that), and goes on in the server's memory, as a body that
// found no slot: the slot is released while the client still holds the
// rest back, never lent again, and once the rest comes the run gets
// exactly the body (not from a slot), the copies counted (what the body
// copied into the slot and out of it). Wherever it pauses: just past what
// fasthttp reads with the headers (8 KiB) and its 4 KiB read buffer, a
// read window (64 KiB) in, a byte short of a slot's whole input, in a body
// of 8-12 KiB (lent after its first read past the pre-read), over TLS at
// a record's end and inside a record's header and payload (a read cut
// by the slot's deadline there resumes where it was), with and without a
// request deadline of its own. A request whose deadline comes first still
// gets its 504, and one whose read timeout does its 408, whether or not
// the slot was given back before.
func TestSlotGivenBackWhenTheBodyPauses(t *testing.T) {
	const pre, slotIn = 8 << 10, 1 << 20 // fasthttp's pre-read; countedSlot's input
	for _, tc := range []struct {
		name        string
		tls         bool
		size, first int    // the body's length, and what is sent before the pause
		pass        int    // under TLS, bytes of the rest's records sent before the pause
		header      string // headers beside the body's
		readTimeout time.Duration
		// status: what the request ends with when its client never
		// sends the rest (0: it sends it, and wants its bytes back).
		status  int
		message string
		early   bool // the request ends before the slot's idle time: its slot is never given back
	}{
		{name: "a byte past the pre-read", size: 256 << 10, first: pre + 1},
		{name: "a read buffer past the pre-read", size: 256 << 10, first: pre + 4<<10},
		{name: "a byte past the read buffer", size: 256 << 10, first: pre + 4<<10 + 1},
		{name: "a read window in", size: 256<<10 + 7, first: pre + 64<<10},
		{name: "a byte past a read window", size: 300 << 10, first: pre + 64<<10 + 1},
		{name: "a byte short of the slot", size: slotIn, first: slotIn - 1},
		{name: "with a deadline of its own", size: 512 << 10, first: 100<<10 + 3, header: "X-Plover-Timeout-Ms: 20000\r\n"},
		{name: "a body of 8-12 KiB", size: 12<<10 - 1, first: pre + 2<<10},
		{name: "TLS, at a record's end", tls: true, size: 256 << 10, first: pre + 20<<10},
		{name: "TLS, inside a record's header", tls: true, size: 256 << 10, first: pre + 20<<10, pass: 3},
		{name: "TLS, inside a record's payload", tls: true, size: 256<<10 + 5, first: pre + 20<<10 + 1, pass: 100, header: "X-Plover-Timeout-Ms: 20000\r\n"},
		{name: "its deadline before the slot's idle time", size: 256 << 10, first: pre + 1, header: "X-Plover-Timeout-Ms: 100\r\n",
			status: 504, message: "deadline", early: true},
		{name: "its deadline after the give-back", size: 256 << 10, first: pre + 1, header: "X-Plover-Timeout-Ms: 1500\r\n",
			status: 504, message: "deadline"},
		{name: "TLS, its deadline after the give-back", tls: true, size: 256 << 10, first: pre + 20<<10, pass: 50, header: "X-Plover-Timeout-Ms: 1500\r\n",
			status: 504, message: "deadline"},
		{name: "the read timeout after the give-back", size: 256 << 10, first: pre + 1, readTimeout: 1500 * time.Millisecond,
			status: 408, message: "read timeout"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fl := ioshare.New(ioshare.Config{Slots: 2}).Flow("f")
			r := lendingRunner{fl: fl, started: make(chan struct{}, 1),
				lent: new(atomic.Int32), released: new(atomic.Int32), fromSlot: new(atomic.Int32), notInIt: new(atomic.Int32)}
			reg := prometheus.NewRegistry()
			door := frontdoor.New(frontdoor.Config{Runner: refusingRunner{r}, Metrics: reqmetrics.New(reg)})
			srv := httpapi.New(door, nil, httpapi.Options{Registry: reg, ReadTimeout: tc.readTimeout})
			inner := listenLoopback(t)
			raw, err := net.Dial("tcp", inner.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			pc := &pausedConn{Conn: raw, pass: -1}
			var c net.Conn = pc
			if tc.tls {
				serveOn(t, srv, tls.NewListener(inner, selfsigned.Config(t)), srv.Serve)
				tc := tls.Client(pc, &tls.Config{InsecureSkipVerify: true})
				if err := tc.Handshake(); err != nil {
					t.Fatal(err)
				}
				c = tc
			} else {
				serveOn(t, srv, inner, srv.Serve)
			}
			defer c.Close()
			c.SetDeadline(time.Now().Add(20 * time.Second))
			body := make([]byte, tc.size)
			for i := range body {
				body[i] = byte(i*7 + i>>11) // no run of it like another
			}
			fmt.Fprintf(c, "POST /v1/functions/f/invoke HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/octet-stream\r\n%sContent-Length: %d\r\n\r\n%s",
				tc.header, tc.size, body[:tc.first])
			pc.hold(tc.pass)
			if _, err := c.Write(body[tc.first:]); err != nil { // held back, but for pass bytes
				t.Fatal(err)
			}
			// The state to wait for: the body lent its slot, given back,
			// and still being read (in memory).
			given := func() bool {
				inSlot, inMemory := fl.Bodies()
				return r.lent.Load() == 1 && r.released.Load() == 1 && inSlot == 0 && inMemory == 1
			}
			if !tc.early {
				for end := time.Now().Add(10 * time.Second); !given(); time.Sleep(time.Millisecond) {
					if time.Now().After(end) {
						inSlot, inMemory := fl.Bodies()
						t.Fatalf("lent %d slots, released %d, bodies read in a slot %d and in memory %d while the client holds the rest back; want one lent and given back, the body read on in memory",
							r.lent.Load(), r.released.Load(), inSlot, inMemory)
					}
				}
			}
			br := bufio.NewReader(c)
			if tc.status != 0 {
				resp, err := http.ReadResponse(br, nil)
				if err != nil {
					t.Fatal(err)
				}
				out, _ := io.ReadAll(resp.Body)
				if resp.StatusCode != tc.status || !strings.Contains(string(out), tc.message) {
					t.Fatalf("%d %.200s; want %d naming the %s", resp.StatusCode, out, tc.status, tc.message)
				}
				if r.lent.Load() != 1 || r.released.Load() != 1 || r.fromSlot.Load()+r.notInIt.Load() != 0 {
					t.Fatalf("lent %d slots, released %d, ran %d; want one lent, released once, no run", r.lent.Load(), r.released.Load(), r.fromSlot.Load()+r.notInIt.Load())
				}
				return
			}
			if err := pc.open(); err != nil {
				t.Fatal(err)
			}
			wantOwnBytes(t, br, body, "once the rest came")
			if r.lent.Load() != 1 || r.released.Load() != 1 || r.fromSlot.Load() != 0 || r.notInIt.Load() != 1 {
				t.Fatalf("lent %d slots, released %d, ran %d from one and %d without; want one lent and released, the run without it",
					r.lent.Load(), r.released.Load(), r.fromSlot.Load(), r.notInIt.Load())
			}
			if inSlot, inMemory := fl.Bodies(); inSlot != 0 || inMemory != 0 {
				t.Fatalf("bodies read in a slot %d, in memory %d once answered; want none", inSlot, inMemory)
			}
			// Copied: the pre-read, into the slot, and the body so far
			// out of it; lent after its first read past the pre-read
			// (TLS, 8-12 KiB), what that read brought (the pre-read and
			// up to a read buffer more) into it too.
			copied, _ := testkit.Counter(t, reg, "plover_payload_copied_bytes_total", map[string]string{"function": "f"})
			lo, hi := pre+tc.first, pre+tc.first
			if tc.tls || tc.size-pre <= 4<<10 {
				lo, hi = lo+pre+1, hi+min(tc.first, pre+4<<10)
			}
			if int(copied) < lo || int(copied) > hi {
				t.Fatalf("%v payload bytes copied, want %d to %d", copied, lo, hi)
			}
		})
	}
}

// Only the client's silence gives a slot back: a body whose client sends
// it whole, without a pause, keeps its slot while the server itself keeps
// it waiting past slotIdle, here for room in the body budget (--max-body-
// memory: another holder keeps all but 70 KiB of it, and another body
// waits for 100 KiB, so that this one waits about 1.4 s between reads).
// The slot's deadline passed during such a wait, and the next read failed
// at once as if the client had paused: the body was copied out of its
// slot and its answer copied too (a final review found it).
func TestAServerWaitKeepsTheSlot(t *testing.T) {
	for _, hold := range []time.Duration{0, 700 * time.Millisecond} {
		t.Run(fmt.Sprint("budget held ", hold), func(t *testing.T) {
			const max = 1 << 20
			budget := netguard.NewBudget(max)
			if hold > 0 {
				if !budget.TryAcquire(max - 70<<10) {
					t.Fatal("acquire")
				}
				go func() {
					time.Sleep(hold)
					budget.Release(64 << 10)
					time.Sleep(hold)
					budget.Release(max - 70<<10 - 64<<10)
				}()
				go func() {
					time.Sleep(100 * time.Millisecond)
					budget.Acquire(context.Background(), 100<<10)
					time.Sleep(3 * time.Second)
					budget.Release(100 << 10)
				}()
			}
			fl := ioshare.New(ioshare.Config{Slots: 2}).Flow("f")
			r := lendingRunner{fl: fl, started: make(chan struct{}, 1),
				lent: new(atomic.Int32), released: new(atomic.Int32), fromSlot: new(atomic.Int32), notInIt: new(atomic.Int32)}
			reg := prometheus.NewRegistry()
			door := frontdoor.New(frontdoor.Config{Runner: refusingRunner{r}, Metrics: reqmetrics.New(reg)})
			srv := httpapi.New(door, nil, httpapi.Options{Registry: reg, BodyBudget: budget})
			ln := listenLoopback(t)
			serveOn(t, srv, ln, srv.Serve)
			c, err := net.Dial("tcp", ln.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			c.SetDeadline(time.Now().Add(20 * time.Second))
			body := make([]byte, 256<<10)
			for i := range body {
				body[i] = byte(i*7 + i>>11)
			}
			go fmt.Fprintf(c, "POST /v1/functions/f/invoke HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/octet-stream\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
			wantOwnBytes(t, bufio.NewReader(c), body, "answer")
			if r.lent.Load() != 1 || r.fromSlot.Load() != 1 || r.notInIt.Load() != 0 {
				t.Errorf("lent %d slots, ran %d from a slot and %d without: want the one slot kept, its client never paused", r.lent.Load(), r.fromSlot.Load(), r.notInIt.Load())
			}
		})
	}
}
