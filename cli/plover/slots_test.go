package main_test

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/plover-run/plover/internal/testkit"
)

// Uploads that never send their bodies hold none of their function's
// worker slots (a worker lends 32): not a chunked request that sent its
// headers alone, one that expects 100-continue and sends nothing after
// it, nor one that stopped at the end of what fasthttp reads with the
// headers. With 42 of them open the function's other requests still land
// in slots: the server copies 8 KiB of each 4 MiB request (what fasthttp
// read with its headers), not its body and its answer (8 MiB each, when
// the waiting uploads had been lent every slot as their handlers began).
func TestStalledUploadsLeaveTheSlots(t *testing.T) {
	bin := buildPlover(t)
	srv := startServer(t, bin, "--isolation", "process", "--timeout", "60s")
	env := []string{"PLOVER_SERVER=" + srv.url}
	echoBig(t, bin, env)
	post := postEcho(srv.url)
	const size = 4 << 20
	if err := post(0, 0, size); err != nil { // loaded: the worker exists and lends
		t.Fatal(err)
	}
	addr := strings.TrimPrefix(srv.url, "http://")
	const head = "POST /v1/functions/big/invoke HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/octet-stream\r\n"
	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for i := range 42 {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
		switch i % 3 {
		case 0:
			fmt.Fprintf(c, "%sTransfer-Encoding: chunked\r\n\r\n", head)
		case 1:
			fmt.Fprintf(c, "%sExpect: 100-continue\r\nContent-Length: %d\r\n\r\n", head, 1<<20)
		case 2:
			fmt.Fprintf(c, "%sContent-Length: %d\r\n\r\n%s", head, 1<<20, make([]byte, 8<<10))
		}
	}
	// Their handlers are on their bodies, none in a slot: lent one as
	// they start, they would hold every one now.
	waitBodies(t, http.DefaultClient, srv.url, "big", 0, 42)
	before := copiedBytes(t, srv.url, "big")
	const requests = 10
	for i := range requests {
		if err := post(1, i, size); err != nil {
			t.Fatal(err)
		}
	}
	if got := copiedBytes(t, srv.url, "big") - before; got != requests*8<<10 {
		t.Fatalf("%.1f KiB payload copied a request of 4 MiB beside 42 uploads that sent no body, want 8 KiB (what fasthttp reads with the headers): the uploads held the worker's slots",
			float64(got)/requests/1024)
	}
}

// waitBodies waits, bounded, until the server at url reads fn's request
// bodies, past what came with their headers, inSlot of them into worker
// slots and inMemory into its memory (plover_bodies_reading), in three
// reads of /metrics in a row.
func waitBodies(t *testing.T, client *http.Client, url, fn string, inSlot, inMemory int) {
	t.Helper()
	var slot, memory float64
	for row, end := 0, time.Now().Add(20*time.Second); row < 3; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("the server reads %v of %s's bodies into slots and %v into memory, want %d and %d", slot, fn, memory, inSlot, inMemory)
		}
		m := metricsOf(t, client, url)
		slot, memory = m(`plover_bodies_reading{function="`+fn+`",into="slot"}`), m(`plover_bodies_reading{function="`+fn+`",into="memory"}`)
		if row++; slot != float64(inSlot) || memory != float64(inMemory) {
			row = 0
		}
	}
}

// Uploads that were lent their slots as their bodies began to arrive, and
// then stopped, give the slots back once no byte came for the slot's idle
// time (250 ms to twice that): 40 uploads of 1 MiB that sent their headers,
// 8 KiB and 64 KiB, and wait. Once the server reads all of them into its
// memory (none in a slot), the function's other 4 MiB requests land in
// slots, copying 8 KiB each (what fasthttp reads with the headers; under
// TLS up to 20 KiB, lent after their first read past it), where
// they copied 8 MiB each (body and answer) beside uploads that kept their
// slots until the request's deadline (60 s here). Then the uploads send
// the rest, and each gets exactly its own bytes back, its copies counted:
// 2 MiB each (body and answer, as any body read into memory), and for one
// that gave a slot back the 8 KiB pre-read copied into it and the 72 KiB
// copied out of it (under TLS also what was read before its slot was
// lent, the pre-read and up to 4 KiB, copied into it).
func TestPausedUploadsGiveTheirSlotsBack(t *testing.T) {
	bin := buildPlover(t)
	for _, overTLS := range []bool{false, true} {
		t.Run(map[bool]string{false: "plain", true: "TLS"}[overTLS], func(t *testing.T) {
			args := []string{"--isolation", "process", "--timeout", "60s"}
			client, dial := http.DefaultClient, func(addr string) (net.Conn, error) { return net.Dial("tcp", addr) }
			var env []string
			if overTLS {
				ca, cert, key, caPEM := testkit.WriteCerts(t, t.TempDir())
				args = append(args, "--tls-cert", cert, "--tls-key", key)
				pool := x509.NewCertPool()
				pool.AppendCertsFromPEM(caPEM)
				cfg := &tls.Config{RootCAs: pool}
				client = &http.Client{Transport: &http.Transport{TLSClientConfig: cfg}}
				dial = func(addr string) (net.Conn, error) { return tls.Dial("tcp", addr, cfg) }
				env = append(env, "PLOVER_CACERT="+ca)
			}
			srv := startIsoServer(t, bin, t.TempDir(), nil, args...)
			env = append(env, "PLOVER_SERVER="+srv.url)
			echoBig(t, bin, env)
			post := postEchoVia(client, srv.url)
			const size, upload, sent, uploads = 4 << 20, 1 << 20, 8<<10 + 64<<10, 40
			if err := post(0, 0, size); err != nil { // loaded: the worker exists and lends
				t.Fatal(err)
			}
			addr := srv.url[strings.Index(srv.url, "://")+3:]
			conns, ins := make([]net.Conn, uploads), make([][]byte, uploads)
			for i := range conns {
				c, err := dial(addr)
				if err != nil {
					t.Fatal(err)
				}
				defer c.Close()
				conns[i], ins[i] = c, body(100+i, 0, upload)
				fmt.Fprintf(c, "POST /v1/functions/big/invoke HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/octet-stream\r\nContent-Length: %d\r\n\r\n%s", upload, ins[i][:sent])
			}
			waitBodies(t, client, srv.url, "big", 0, uploads)
			m := metricsOf(t, client, srv.url)
			before := int64(m(`plover_payload_copied_bytes_total{function="big"}`))
			const requests = 10
			for i := range requests {
				if err := post(1, i, size); err != nil {
					t.Fatal(err)
				}
			}
			m = metricsOf(t, client, srv.url)
			after := int64(m(`plover_payload_copied_bytes_total{function="big"}`))
			// In a slot, a request copies what fasthttp read with its
			// headers; under TLS, lent its slot after its first read past
			// them, that and what the read brought (up to 4 KiB) again.
			least, most := int64(requests*8<<10), int64(requests*8<<10)
			if overTLS {
				least, most = 2*least+requests, 2*most+requests*4<<10
			}
			if got := after - before; got < least || got > most {
				t.Fatalf("%.1f KiB payload copied a request of 4 MiB beside %d uploads that stopped midway, want %.1f to %.1f KiB (what a request lent a slot copies): the uploads kept the worker's slots",
					float64(got)/requests/1024, uploads, float64(least)/requests/1024, float64(most)/requests/1024)
			}
			for i, c := range conns {
				if _, err := c.Write(ins[i][sent:]); err != nil {
					t.Fatal(err)
				}
				wantEcho(t, c, ins[i], fmt.Sprintf("upload %d, once the rest came", i))
			}
			m = metricsOf(t, client, srv.url)
			extra := int64(m(`plover_payload_copied_bytes_total{function="big"}`)) - after - uploads*2*upload
			per, most := int64(8<<10+sent), int64(uploads*(8<<10+sent))
			if overTLS {
				per, most = per+8<<10+1, most+uploads*(12<<10)
			}
			if extra < per || extra > most || (!overTLS && extra%per != 0) {
				t.Fatalf("%d payload bytes copied for %d uploads of 1 MiB beyond their bodies and answers (2 MiB each), want what some of them (at least one) copied into the slots they gave back and out: %d each%s",
					extra, uploads, per, map[bool]string{false: "", true: " and up to 4 KiB more"}[overTLS])
			}
			if !overTLS {
				t.Logf("%d of %d uploads gave their slots back", extra/per, uploads)
			}
		})
	}
}
