package bench

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// shedServer answers its first k invokes with status and Retry-After
// (none when retryAfter is ""), the rest 200, and notes when each
// request arrived: the test reads the bench's waits from the server's
// side, not from its own sleeps.
type shedServer struct {
	url string
	mu  sync.Mutex
	at  []time.Time
}

func startShedServer(t *testing.T, k, status int, retryAfter string) *shedServer {
	t.Helper()
	s := &shedServer{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		s.at = append(s.at, time.Now())
		n := len(s.at)
		s.mu.Unlock()
		if n <= k {
			if retryAfter != "" {
				w.Header().Set("Retry-After", retryAfter)
			}
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(status)
			w.Write([]byte(`{"error":{"code":"busy","message":"queue full"}}`))
			return
		}
		w.Write([]byte("ok"))
	}))
	t.Cleanup(srv.Close)
	s.url = srv.URL
	return s
}

func (s *shedServer) arrivals() []time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]time.Time(nil), s.at...)
}

// A closed loop that gets a 429 or 503 with Retry-After waits that long
// before its connection's next request, to the run's end at most, and
// counts the answer as shed (and still as an error). It sent again at once
// before, hammering a server that asked for room. The open loop keeps its
// schedule and does not wait. Gaps are asserted loosely (≥ 0.9 s for a
// 1 s Retry-After, bounds of seconds the other way): this runs on loaded
// two-core machines.
func TestRetryAfterWaitedOut(t *testing.T) {
	for _, tt := range []struct {
		name       string
		k, status  int
		retryAfter string
		cfg        Config
		shed       int64
		// minGap is the least time between the first request's arrival and
		// the (k+1)th's; maxGap, when set, the most.
		minGap, maxGap time.Duration
		// maxWall bounds the whole run: a wait cut short by the run's end.
		maxWall  time.Duration
		waited   bool // RetryAfterWait > 0.9 s
		requests int64
		stopped  string
	}{
		{name: "503 closed loop", k: 1, status: 503, retryAfter: "1",
			cfg:  Config{Concurrency: 1, Requests: 3, Duration: 20 * time.Second},
			shed: 1, minGap: 900 * time.Millisecond, waited: true, requests: 3, stopped: "requests"},
		{name: "429 closed loop, two in a row", k: 2, status: 429, retryAfter: "1",
			cfg:  Config{Concurrency: 1, Requests: 3, Duration: 20 * time.Second},
			shed: 2, minGap: 1800 * time.Millisecond, waited: true, requests: 3, stopped: "requests"},
		// Not a shed answer: no Retry-After, so nothing to wait for.
		{name: "503 without Retry-After", k: 1, status: 503, retryAfter: "",
			cfg:  Config{Concurrency: 1, Requests: 3, Duration: 20 * time.Second},
			shed: 0, requests: 3, stopped: "requests"},
		// Not a shedding status: a 500's Retry-After is not waited for.
		{name: "500 with Retry-After", k: 1, status: 500, retryAfter: "1",
			cfg:  Config{Concurrency: 1, Requests: 3, Duration: 20 * time.Second},
			shed: 0, requests: 3, stopped: "requests"},
		// An hour asked for: the wait ends with the run's duration, and
		// no request is sent after it.
		{name: "wait capped at the run's end", k: 1, status: 503, retryAfter: "3600",
			cfg:  Config{Concurrency: 1, Requests: 100, Duration: 1500 * time.Millisecond},
			shed: 1, maxWall: 10 * time.Second, waited: true, requests: 1, stopped: "duration"},
		// Another connection takes the last request: the one waiting
		// holds no ticket and stops with the run, not at --duration.
		{name: "wait ends when the requests run out", k: 1, status: 503, retryAfter: "30",
			cfg:  Config{Concurrency: 2, Requests: 2, Duration: 20 * time.Second},
			shed: 1, maxWall: 10 * time.Second, requests: 2, stopped: "requests"},
		// The open loop offers its rate whatever the answers: the request
		// after the shed ones is due 40 ms in and is not held back.
		{name: "open loop does not wait", k: 2, status: 503, retryAfter: "1",
			cfg:  Config{Rate: 50, Concurrency: 4, Requests: 5, Duration: 20 * time.Second},
			shed: 2, maxGap: 900 * time.Millisecond, requests: 5, stopped: "requests"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s := startShedServer(t, tt.k, tt.status, tt.retryAfter)
			cfg := tt.cfg
			cfg.Server, cfg.Function, cfg.Input = s.url, "f", []byte("in")
			t0 := time.Now()
			res, err := Run(context.Background(), cfg)
			wall := time.Since(t0)
			if err != nil {
				t.Fatalf("Run: %v", err)
			}
			at := s.arrivals()
			if res.Stopped != tt.stopped {
				t.Errorf("stopped by %q, want %q", res.Stopped, tt.stopped)
			}
			if res.Shed != tt.shed || res.Requests != tt.requests || int64(len(at)) != tt.requests {
				t.Fatalf("shed %d of %d requests (server saw %d); want %d of %d; errors %+v",
					res.Shed, res.Requests, len(at), tt.shed, tt.requests, res.Errors)
			}
			var failed int64
			for _, e := range res.Errors {
				failed += e.Count
			}
			if failed != int64(tt.k) || res.OK != tt.requests-int64(tt.k) {
				t.Errorf("%d failed, %d ok: want the %d refused counted as errors (shed or not), the rest ok", failed, res.OK, tt.k)
			}
			if len(at) > tt.k {
				gap := at[tt.k].Sub(at[0])
				if gap < tt.minGap || (tt.maxGap > 0 && gap > tt.maxGap) {
					bound := "no bound"
					if tt.maxGap > 0 {
						bound = tt.maxGap.String()
					}
					t.Errorf("request %d arrived %v after the first; want at least %v, at most %s", tt.k+1, gap, tt.minGap, bound)
				}
			}
			if tt.maxWall > 0 && wall > tt.maxWall {
				t.Errorf("the run took %v, want under %v", wall, tt.maxWall)
			}
			if tt.waited != (res.RetryAfterWait > 0.9) {
				t.Errorf("waited %.3fs for Retry-After; want a wait: %v", res.RetryAfterWait, tt.waited)
			}
			var b strings.Builder
			if err := res.WriteText(&b); err != nil {
				t.Fatal(err)
			}
			if said := strings.Contains(b.String(), "shed        "); said != (tt.shed > 0) {
				t.Errorf("report says shed: %v, want %v:\n%s", said, tt.shed > 0, b.String())
			}
		})
	}
}

// A closed loop whose last connection waits out a Retry-After to the
// run's end ran for the whole --duration, and its throughput is over
// that: Elapsed stopped at the last answer, so 10 OKs and then a 429
// asking for 10 s, in a 1.5 s run, read as thousands of requests a second
// where 10 in 1.5 s were served. A run that stops at --requests still
// ends at its last answer: the wait of a connection that another's last
// request halted is not stretched to --duration.
func TestRetryAfterWaitInElapsed(t *testing.T) {
	var n atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if n.Add(1) <= 10 {
			w.Write([]byte("ok"))
			return
		}
		w.Header().Set("Retry-After", "10")
		w.WriteHeader(429)
	}))
	t.Cleanup(srv.Close)
	res, err := Run(context.Background(), Config{Server: srv.URL, Function: "f", Input: []byte("x"), Concurrency: 1, Duration: 1500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if res.OK != 10 || res.Shed != 1 || res.Stopped != "duration" {
		t.Fatalf("ok %d shed %d stopped %q; want 10 ok, 1 shed, by duration", res.OK, res.Shed, res.Stopped)
	}
	if res.Elapsed < 1.45 || res.Elapsed > 5 || res.Throughput > 10/1.45 {
		t.Fatalf("elapsed %.4fs, throughput %.1f/s: want the 1.5 s the loop ran and 10 served in it", res.Elapsed, res.Throughput)
	}

	s := startShedServer(t, 1, 503, "30")
	res, err = Run(context.Background(), Config{Server: s.url, Function: "f", Input: []byte("x"), Concurrency: 2, Requests: 2, Duration: 20 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if res.Stopped != "requests" || res.Elapsed > 5 {
		t.Fatalf("stopped by %q after %.3fs: want --requests, at the last answer", res.Stopped, res.Elapsed)
	}
}
