package main

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

// countsServer answers invokes 200 and GET /v1/functions/{fn} with device
// and I/O seconds that grow a read by 1 for a function *-a, by 3 for one
// *-b (a's part of a split: 0.25), except a function's read number failOn
// (1: before the loads, 2: after), which it answers 503.
func countsServer(t *testing.T, failOn int) string {
	var mu sync.Mutex
	reads := map[string]int{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fn, ok := strings.CutPrefix(r.URL.Path, "/v1/functions/")
		if r.Method != http.MethodGet || !ok {
			w.Write([]byte("ok")) // an invoke; /metrics: nothing waiting
			return
		}
		mu.Lock()
		reads[fn]++
		n := reads[fn]
		mu.Unlock()
		if n == failOn {
			http.Error(w, `{"error":{"code":"unavailable","message":"stand-in"}}`, http.StatusServiceUnavailable)
			return
		}
		step := 1.0
		if strings.HasSuffix(fn, "-b") {
			step = 3
		}
		fmt.Fprintf(w, `{"name":%q,"device_seconds":%g,"io_seconds":%g}`, fn, step*float64(n), step*float64(n))
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

// A failed read of the counts around the shares' and the I/O split's
// loads fails the mode, naming it: taken as a zero, the split covered the
// server's lifetime (a failed first read) or went negative (a failed
// second), and the report said nothing.
func TestFairSplitsFailOnAFailedCountRead(t *testing.T) {
	o := &options{fairTime: 50 * time.Millisecond}
	in := []byte("x")
	shares := func(url string) (float64, error) {
		sh, err := shareSplit(context.Background(), o, url, "fair", in, 1)
		return sh.BilledA, err
	}
	ioPart := func(url string) (float64, error) {
		io, err := ioSplit(context.Background(), url, in, in, 1, 1, o.fairTime)
		return io.IOA, err
	}
	for _, tt := range []struct {
		name   string
		failOn int
		split  func(url string) (float64, error)
		want   string // the error; "": none, a's part 0.25
	}{
		{"shares", 0, shares, ""},
		{"shares, before", 1, shares, "shares: before: spin-a's counts: GET "},
		{"shares, after", 2, shares, "shares: after: spin-a's counts: GET "},
		{"I/O", 0, ioPart, ""},
		{"I/O, before", 1, ioPart, "I/O split: before: vecadd-a's counts: GET "},
		{"I/O, after", 2, ioPart, "I/O split: after: vecadd-a's counts: GET "},
	} {
		t.Run(tt.name, func(t *testing.T) {
			part, err := tt.split(countsServer(t, tt.failOn))
			if tt.want == "" {
				if err != nil || part != 0.25 {
					t.Fatalf("a's part %v, err %v; want 0.25", part, err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.want) || !strings.Contains(err.Error(), "503 Service Unavailable: {\"error\"") {
				t.Fatalf("a's part %v, err %v; want an error with %q and the server's answer", part, err, tt.want)
			}
		})
	}
}
