package main_test

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// body is n bytes that say which client and request they belong to in
// every 8-byte word, so that a response carrying any other request's
// bytes is caught wherever they are.
func body(client, req, n int) []byte {
	b := make([]byte, n)
	for i := 0; i+8 <= n; i += 8 {
		binary.LittleEndian.PutUint64(b[i:], uint64(client)<<40|uint64(req)<<20|uint64(i/8)&0xfffff)
	}
	return b
}

// copiedBytes is plover_payload_copied_bytes_total for fn.
func copiedBytes(t *testing.T, url, fn string) int64 {
	t.Helper()
	return int64(max(0, metric(t, url, `plover_payload_copied_bytes_total{function="`+fn+`"}`)))
}

// The data path through worker processes: a body lands in a slot of the
// function's worker and the response is written from there. Every response
// carries its own request's bytes, under concurrency, while another
// client's large response is still being written (its slot is not lent
// again until it is), with slow uploads and with more uploads at once than
// a worker has slots; and the server copies no payload beyond the part of a
// body fasthttp reads before any handler runs.
func TestDataPath(t *testing.T) {
	bin := buildPlover(t)
	srv := startServer(t, bin, "--isolation", "process", "--max-instances", "4", "--timeout", "20s")
	env := []string{"PLOVER_SERVER=" + srv.url}
	const size = 1 << 20
	echoBig(t, bin, env)
	url := srv.url + "/v1/functions/big/invoke"
	post := postEcho(srv.url)
	if err := post(0, 0, size); err != nil { // loaded: the worker exists and lends
		t.Fatal(err)
	}
	base := copiedBytes(t, srv.url, "big")

	t.Run("concurrent clients", func(t *testing.T) {
		concurrently(t, 8, 12, func(c, i int) int { return size + c*4096 + i*8 }, post)
		// What fasthttp read before the handler ran (8 KiB of each body)
		// is all the payload the server copied.
		if got := copiedBytes(t, srv.url, "big") - base; got != 8*12*8<<10 {
			t.Errorf("%d payload bytes copied for 96 requests of about 1 MiB, want 8 KiB each (what fasthttp reads with the headers)", got)
		}
	})

	t.Run("Expect: 100-continue", func(t *testing.T) {
		// Asked for after 100 Continue, the body is read from the socket
		// into the slot: fasthttp read none of it with the headers, and
		// nothing is copied.
		before := copiedBytes(t, srv.url, "big")
		in := body(98, 0, size)
		c, err := net.Dial("tcp", strings.TrimPrefix(srv.url, "http://"))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		br := bufio.NewReader(c)
		c.SetReadDeadline(time.Now().Add(20 * time.Second))
		for i := range 2 { // the connection stays open for the next
			fmt.Fprintf(c, "POST /v1/functions/big/invoke HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/octet-stream\r\nContent-Length: %d\r\nExpect: 100-continue\r\n\r\n", size)
			resp, err := http.ReadResponse(br, nil)
			if err != nil || resp.StatusCode != 100 {
				t.Fatalf("request %d before its body: %v %v, want 100 Continue", i, resp, err)
			}
			if _, err := c.Write(in); err != nil {
				t.Fatal(err)
			}
			resp, err = http.ReadResponse(br, nil)
			if err != nil {
				t.Fatal(err)
			}
			out, err := io.ReadAll(resp.Body)
			if err != nil || resp.StatusCode != 200 || !bytes.Equal(out, in) {
				t.Fatalf("request %d: %d, %d bytes, %v; equal %v", i, resp.StatusCode, len(out), err, bytes.Equal(out, in))
			}
		}
		if got := copiedBytes(t, srv.url, "big") - before; got != 0 {
			t.Errorf("%d payload bytes copied for two 1 MiB bodies sent after 100 Continue, want 0", got)
		}
	})

	t.Run("a response still being written keeps its slot", func(t *testing.T) {
		const large = 16 << 20
		in := body(99, 0, large)
		c, err := net.Dial("tcp", strings.TrimPrefix(srv.url, "http://"))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		// A small receive buffer: the server's write waits for this reader
		// (loopback's can grow to hold the whole response).
		if err := c.(*net.TCPConn).SetReadBuffer(64 << 10); err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(c, "POST /v1/functions/big/invoke HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/octet-stream\r\nContent-Length: %d\r\n\r\n", large)
		if _, err := c.Write(in); err != nil {
			t.Fatal(err)
		}
		// The slow reader's response is now partly written; others run,
		// as large, so that any of them in its slot would overwrite what
		// is still to be sent.
		// At once, so that they need more slots than one freed by each.
		var wg sync.WaitGroup
		for i := range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if err := post(7, 100+i, large); err != nil {
					t.Error(err)
				}
			}()
		}
		wg.Wait()
		c.SetReadDeadline(time.Now().Add(20 * time.Second))
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatal(err)
		}
		out, err := io.ReadAll(resp.Body)
		if err != nil || resp.StatusCode != 200 || !bytes.Equal(out, in) {
			t.Fatalf("the slow reader's response: %d, %d bytes, %v; equal %v", resp.StatusCode, len(out), err, bytes.Equal(out, in))
		}
	})

	t.Run("slow uploads, more than the pool", func(t *testing.T) {
		const uploads = 40 // a worker lends 32 slots: the rest go to ordinary memory
		var wg sync.WaitGroup
		errs := make(chan error, uploads)
		release := make(chan struct{})
		half := make(chan struct{}, uploads)
		for u := range uploads {
			wg.Add(1)
			go func() {
				defer wg.Done()
				in := body(200+u, 0, 64<<10)
				pr, pw := io.Pipe()
				go func() {
					pw.Write(in[:32<<10]) // returns once the client has taken it
					half <- struct{}{}
					<-release // every upload is half sent, and waits
					pw.Write(in[32<<10:])
					pw.Close()
				}()
				req, _ := http.NewRequest("POST", url, pr)
				req.ContentLength = int64(len(in))
				req.Header.Set("Content-Type", "application/octet-stream")
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					errs <- err
					return
				}
				defer resp.Body.Close()
				out, _ := io.ReadAll(resp.Body)
				if resp.StatusCode != 200 || !bytes.Equal(out, in) {
					errs <- fmt.Errorf("upload %d: %d, %d bytes", u, resp.StatusCode, len(out))
				}
			}()
		}
		for range uploads {
			<-half
		}
		close(release)
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Error(err)
		}
	})
}

// /healthz says how workers' CPU weights are applied: cgroups where they
// can be written, nice levels where they cannot (a pod; here a cgroup root
// with nothing in it), and why they are off where they are.
func TestCPUWeightsReported(t *testing.T) {
	bin := buildPlover(t)
	for _, tc := range []struct {
		args []string
		want []string
		why  string // in cpu_weights_off; "": none
	}{
		{nil, []string{"cgroup v1", "cgroup v2", "nice"}, ""}, // whatever this machine allows
		{[]string{"--cgroup-root", t.TempDir()}, []string{"nice"}, ""},
		{[]string{"--cpu-weights=false"}, []string{"off"}, "--cpu-weights=false"},
	} {
		srv := startServer(t, bin, append([]string{"--isolation", "process"}, tc.args...)...)
		resp, err := http.Get(srv.url + "/healthz")
		if err != nil {
			t.Fatal(err)
		}
		var h struct {
			CPUWeights string `json:"cpu_weights"`
			Off        string `json:"cpu_weights_off"`
		}
		err = json.NewDecoder(resp.Body).Decode(&h)
		resp.Body.Close()
		if err != nil || !slices.Contains(tc.want, h.CPUWeights) {
			t.Fatalf("%v: cpu_weights %q (%v), want one of %q", tc.args, h.CPUWeights, err, tc.want)
		}
		if (tc.why == "") != (h.Off == "") || !strings.Contains(h.Off, tc.why) {
			t.Fatalf("%v: cpu_weights_off %q, want %q in it", tc.args, h.Off, tc.why)
		}
	}
}
