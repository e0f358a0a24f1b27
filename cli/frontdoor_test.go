package cli

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"math"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/plover-run/plover/auth"
	"github.com/plover-run/plover/gate"
	"github.com/plover-run/plover/internal/testkit"
)

// --max-body-memory is refused, naming the flag, when it is negative or
// more MiB than a byte count holds: 2^44+1 MiB wrapped to a budget of 1
// MiB, 2^43 MiB to a negative one (no limit), while the log said what
// was asked.
func TestMaxBodyMemoryBounds(t *testing.T) {
	for _, tc := range []struct {
		mib  int64
		want string // "": accepted
		max  int64
	}{
		{0, "", 0},
		{1024, "", 1 << 30},
		{1<<43 - 1, "", (1<<43 - 1) << 20},
		{-1, "--max-body-memory -1: want 0 (no limit) to 8796093022207 MiB", 0},
		{1 << 43, "--max-body-memory 8796093022208: want 0 (no limit) to 8796093022207 MiB", 0},
		{1<<44 + 1, "--max-body-memory 17592186044417: want 0 (no limit) to 8796093022207 MiB", 0},
	} {
		d, err := newFrontDoor(&serveFlags{maxBodyMemMB: tc.mib}, slog.New(slog.DiscardHandler), prometheus.NewRegistry())
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("--max-body-memory %d: %v; want %d bytes", tc.mib, err, tc.max)
		case tc.want == "" && d.budget.Max() != tc.max:
			t.Errorf("--max-body-memory %d: a budget of %d bytes; want %d", tc.mib, d.budget.Max(), tc.max)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("--max-body-memory %d: %v; want %q", tc.mib, err, tc.want)
		}
	}
}

// --max-spool is 4 times --max-body where unset, at least 1 GiB, and as
// given otherwise.
func TestSpoolBudget(t *testing.T) {
	for _, tc := range []struct{ mib, bundle, want int64 }{
		{0, 256 << 20, 1 << 30},
		{0, 1 << 30, 4 << 30},
		{0, 1 << 20, 1 << 30},
		{512, 256 << 20, 512 << 20},
		{0, 1 << 62, math.MaxInt64}, // 4 times it would wrap
	} {
		if got := spoolBudget(tc.mib, tc.bundle); got != tc.want {
			t.Errorf("spoolBudget(%d MiB, --max-body %d) = %d, want %d", tc.mib, tc.bundle, got, tc.want)
		}
	}
}

// The metrics listener had 64 connections and no bound per client: one
// peer holding 64 silent connections cut every scrape off, its closes
// saying nothing (a review's finding). A client holds at most 8; the rest
// read a 503 naming the listener, and another client still connects.
func TestTheMetricsListenerBoundsAClient(t *testing.T) {
	d, err := newFrontDoor(&serveFlags{metricsListen: "127.0.0.1:0"}, slog.New(slog.DiscardHandler), prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	ln, err := d.listenMetrics()
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			defer c.Close() // held open, silent, until the test ends
		}
	}()
	dial := func(from string) net.Conn {
		t.Helper()
		dl := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}}
		c, err := dl.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	for range metricsPerClient {
		dial("127.0.0.1")
	}
	// Past its bound: the 503 names the listener, and the connection ends.
	c := dial("127.0.0.1")
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	b, err := io.ReadAll(c)
	if !strings.Contains(string(b), "503") || !strings.Contains(string(b), "--metrics-listen") {
		t.Fatalf("a client's connection past %d: read %q (%v), want a 503 naming --metrics-listen", metricsPerClient, b, err)
	}
	// Another client is not held out: its connection is kept open.
	o := dial("127.0.0.2")
	o.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
	if n, err := o.Read(make([]byte, 1)); n != 0 || !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("another client's connection: read %d bytes, %v; want it held open", n, err)
	}
}

// A SIGHUP that removes a token has the gate forget it: its
// plover_token_limited_total series go from the scrape (they stayed for
// the server's life), while a token still in the file keeps its own.
func TestReloadForgetsRemovedTokens(t *testing.T) {
	file := filepath.Join(t.TempDir(), "auth")
	line := func(name string) string {
		return name + " invoke " + auth.Hash(name+"-secret") + " * concurrency=1\n"
	}
	if err := os.WriteFile(file, []byte(line("a")+line("b")), 0o600); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	d, err := newFrontDoor(&serveFlags{authFile: file}, slog.New(slog.DiscardHandler), reg)
	if err != nil {
		t.Fatal(err)
	}
	g := gate.New(d.tokens, reg)
	d.gate.Store(g)
	for _, name := range []string{"a", "b"} {
		tk, r := g.Admit([]byte("Bearer "+name+"-secret"), auth.Invoke, "f")
		if r != nil {
			t.Fatal(r)
		}
		if _, r := g.Admit([]byte("Bearer "+name+"-secret"), auth.Invoke, "f"); r == nil {
			t.Fatalf("%s: a call past its concurrency was admitted", name)
		}
		tk.Done()
	}
	limited := func() (names []string) {
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() != "plover_token_limited_total" {
				continue
			}
			for _, m := range mf.GetMetric() {
				for _, l := range m.GetLabel() {
					if l.GetName() == "token" {
						names = append(names, l.GetValue())
					}
				}
			}
		}
		return names
	}
	if got := limited(); len(got) != 2 {
		t.Fatalf("limited series for %v, want a and b", got)
	}
	if err := os.WriteFile(file, []byte(line("b")), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	hup := make(chan os.Signal, 1)
	go d.reloadOnHUP(ctx, hup)
	hup <- syscall.SIGHUP
	testkit.Until(t, "a's series gone after the reload", func() bool {
		got := limited()
		return len(got) == 1 && got[0] == "b"
	})
}
