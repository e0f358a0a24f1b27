package main_test

import (
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
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
