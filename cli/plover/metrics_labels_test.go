package main_test

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/plover-run/plover/internal/testkit"
)

// holdingProxy forwards TCP connections to target until hold(true), after
// which it holds every byte either way until hold(false): a store that
// stops answering without refusing connections.
func holdingProxy(t *testing.T, target string) (addr string, hold func(bool)) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	cond := sync.NewCond(&mu)
	held := false
	wait := func() {
		mu.Lock()
		for held {
			cond.Wait()
		}
		mu.Unlock()
	}
	pipe := func(dst, src net.Conn) {
		buf := make([]byte, 32<<10)
		for {
			n, err := src.Read(buf)
			wait()
			if n > 0 {
				if _, werr := dst.Write(buf[:n]); werr != nil {
					break
				}
			}
			if err != nil {
				break
			}
		}
		dst.Close()
		src.Close()
	}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				u, err := net.Dial("tcp", target)
				if err != nil {
					c.Close()
					return
				}
				go pipe(u, c)
				pipe(c, u)
			}()
		}
	}()
	hold = func(on bool) {
		mu.Lock()
		held = on
		mu.Unlock()
		cond.Broadcast()
	}
	t.Cleanup(func() { hold(false); ln.Close() })
	return ln.Addr().String(), hold
}

// A name takes a series of plover_requests_total only once a function of
// that name has answered: a request for a made-up name that runs out of
// time while its record is read (a slow store, a client's short deadline)
// is counted under _unknown, or a client could fill the node's labels
// (1,000 of them; then every new function shares _other) with names of
// its choosing.
func TestTimedOutLookupsOfMadeUpNamesShareOneSeries(t *testing.T) {
	if testing.Short() {
		t.Skip("starts MinIO and a server")
	}
	srvMinio, store := minioStore(t, "labels")
	addr, hold := holdingProxy(t, strings.TrimPrefix(srvMinio.Endpoint, "http://"))
	t.Setenv("PLOVER_S3_ENDPOINT", "http://"+addr)
	bin := buildPlover(t)
	run(t, bin, nil, "deploy", testkit.BundleDir(t, testkit.Manifest("echo"), nil), "--store", store)
	srv := startServer(t, bin, "--store", store)
	if code, _, err := invokeHTTP(srv.url, "echo", []byte{7}); err != nil || code != 200 {
		t.Fatalf("echo: %d %v", code, err)
	}

	hold(true)
	const probes = 5
	for i := range probes {
		req, _ := http.NewRequest("POST", fmt.Sprintf("%s/v1/functions/probe-%d/invoke", srv.url, i), strings.NewReader("x"))
		req.Header.Set("X-Plover-Timeout-Ms", "100")
		resp, err := (&http.Client{Timeout: 10 * time.Second}).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 504 {
			t.Fatalf("probe-%d with the store held: %d %s, want 504", i, resp.StatusCode, body)
		}
	}
	hold(false)

	resp, err := http.Get(srv.url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var series []string
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "plover_requests_total{") {
			series = append(series, l)
			if strings.Contains(l, `function="probe-`) {
				t.Errorf("a made-up name has its own series: %s", l)
			}
		}
	}
	if want := fmt.Sprintf(`plover_requests_total{code="504",function="_unknown"} %d`, probes); !strings.Contains(string(b), want) {
		t.Errorf("no %q among\n%s", want, strings.Join(series, "\n"))
	}
}
