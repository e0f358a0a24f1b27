package main_test

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/internal/testkit"
)

func TestSIGTERMDrainsInFlightRequests(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a server")
	}
	bin := buildPlover(t)
	srv := startServer(t, bin, "--grace", "10s")
	m := testkit.Slow("slow", 800)
	run(t, bin, []string{"PLOVER_SERVER=" + srv.url}, "deploy", testkit.BundleDir(t, m, nil))
	invokeHTTP(srv.url, "slow", []byte("warm")) // load it, so the drained request is only the sleep

	res := invokeInFlight(t, srv, "slow", []byte("drain me"))
	start := time.Now()
	srv.cmd.Process.Signal(syscall.SIGTERM)
	(<-res).echoed(t, []byte("drain me"), "during shutdown")
	exited(t, srv, start, 15*time.Second)
	if !strings.Contains(srv.log.String(), "shutting down") {
		t.Fatal("no shutdown log line")
	}
}

func rssKiB(pid int) (int, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, "VmRSS:") {
			return strconv.Atoi(strings.Fields(line)[1])
		}
	}
	return 0, fmt.Errorf("no VmRSS")
}

// TestLoad runs many clients across several functions against a real server
// for a bounded time and request count, and checks that only the designed
// statuses come back, that no response carries another request's bytes,
// and that resident memory stays flat. Each failure says what it wanted and
// what it saw, with an example of the response: on a loaded machine the
// server's log of its 504s (printed on failure) runs to hundreds of lines.
func TestLoad(t *testing.T) {
	if testing.Short() {
		t.Skip("load test")
	}
	const (
		clients     = 48
		perClient   = 4000 // bound on requests
		duration    = 8 * time.Second
		rssSlackKiB = 16 << 10 // allowed growth, last third over first third
		afterTries  = 20       // requests the server gets to answer 200 after the load
	)
	bin := buildPlover(t)
	srv := startServer(t, bin, "--max-instances", "4", "--max-queue", "32", "--timeout", "100ms")
	env := []string{"PLOVER_SERVER=" + srv.url}
	names := []string{"f0", "f1", "f2", "f3"}
	for i, n := range names {
		m := testkit.Manifest(n)
		m.Chain = []abi.Launch{{Kernel: "echo", Grid: 1, Block: 64}, {Kernel: "sleep_ms", Grid: 1 + i, Block: 1}}
		run(t, bin, env, "deploy", testkit.BundleDir(t, m, nil))
	}
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: clients}}
	var mu sync.Mutex
	statuses := map[int]int{}
	example := map[int]string{} // the first response (or error) of each status
	bad, badExample := 0, ""
	var samples []int
	stop := make(chan struct{})
	go func() {
		tk := time.NewTicker(200 * time.Millisecond)
		defer tk.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tk.C:
				if kb, err := rssKiB(srv.cmd.Process.Pid); err == nil {
					mu.Lock()
					samples = append(samples, kb)
					mu.Unlock()
				}
			}
		}
	}()
	start := time.Now()
	var wg sync.WaitGroup
	for c := 0; c < clients; c++ {
		wg.Add(1)
		go func(c int) {
			defer wg.Done()
			in := bytes.Repeat([]byte{byte(c)}, 200)
			for i := 0; i < perClient && time.Since(start) < duration; i++ {
				name := names[(c+i)%len(names)]
				resp, err := client.Post(srv.url+"/v1/functions/"+name+"/invoke", "application/octet-stream", bytes.NewReader(in))
				code, seen := 0, ""
				var out []byte
				if err == nil {
					out, err = io.ReadAll(resp.Body)
					resp.Body.Close()
					code = resp.StatusCode
					seen = fmt.Sprintf("%s: %d %q", name, code, tailString(string(out), 200))
				}
				if err != nil {
					seen = fmt.Sprintf("%s: %d, %v", name, code, err)
					code = 0 // no whole response
				}
				mu.Lock()
				statuses[code]++
				if _, ok := example[code]; !ok {
					example[code] = seen
				}
				if code == 200 && !bytes.HasPrefix(out, in) {
					if bad++; bad == 1 {
						badExample = fmt.Sprintf("client %d sent %d bytes of %#x and got %d bytes beginning %x", c, len(in), c, len(out), out[:min(len(out), 16)])
					}
				}
				mu.Unlock()
			}
		}(c)
	}
	wg.Wait()
	close(stop)
	elapsed := time.Since(start)
	total := 0
	for code, n := range statuses {
		total += n
		if code != 200 && code != 429 && code != 504 {
			t.Errorf("%d of %d responses had status %d (0: no whole response), want only 200, 429 (queue full) or 504 (past --timeout); the first: %s",
				n, total, code, example[code])
		}
	}
	if bad > 0 {
		t.Errorf("%d responses with status 200 did not begin with their request's 200 bytes (another request's bytes?); the first: %s", bad, badExample)
	}
	if statuses[200] == 0 {
		t.Fatalf("none of %d requests succeeded, want some 200s: statuses %v; the first 504: %s", total, statuses, example[504])
	}
	third := len(samples) / 3
	if third == 0 {
		t.Fatalf("%d samples of the server's RSS in %v, want 3 or more (one every 200 ms)", len(samples), elapsed.Round(time.Millisecond))
	}
	mean := func(s []int) int {
		sum := 0
		for _, v := range s {
			sum += v
		}
		return sum / len(s)
	}
	first, last := mean(samples[:third]), mean(samples[len(samples)-third:])
	t.Logf("load: %d clients, %d requests in %v (%.0f req/s): 200=%d 429=%d 504=%d; RSS first third %d KiB, last third %d KiB, max %d KiB",
		clients, total, elapsed.Round(time.Millisecond), float64(total)/elapsed.Seconds(), statuses[200], statuses[429], statuses[504], first, last, maxInt(samples))
	if last > first+rssSlackKiB {
		t.Errorf("resident memory grew from %d KiB (mean of the first third of %d samples) to %d KiB (the last third), want at most +%d KiB",
			first, len(samples), last, rssSlackKiB)
	}
	// The server is still healthy and serving: a request of its own, with
	// the same 100 ms --timeout, may still meet a 504 on a loaded machine
	// (the machine, not the server, is slow), so it gets a bounded number
	// of requests to answer one 200.
	var after []string
	for len(after) < afterTries {
		code, out, err := invokeHTTP(srv.url, "f0", make([]byte, 200))
		if err == nil && code == 200 {
			return
		}
		after = append(after, fmt.Sprintf("%d %v %q", code, err, tailString(string(out), 120)))
		if code != 504 && code != 429 {
			break // not the machine's load: say so now
		}
	}
	t.Fatalf("after the load, f0 answered %d requests without a 200, want a 200 within %d (a server still serving): %s",
		len(after), afterTries, strings.Join(after, "; "))
}

func maxInt(s []int) int {
	m := 0
	for _, v := range s {
		m = max(m, v)
	}
	return m
}
