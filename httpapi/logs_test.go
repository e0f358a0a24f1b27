package httpapi_test

import (
	"bufio"
	"context"
	"encoding/json"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/plover-run/plover/api"
	"github.com/plover-run/plover/frontdoor"
	"github.com/plover-run/plover/funclog"
	"github.com/plover-run/plover/httpapi"
	"github.com/plover-run/plover/internal/testkit"
)

// logAdmin serves only Logs, from a store the test fills; each follower it
// hands out is passed to followers too.
type logAdmin struct {
	httpapi.Admin // nil: the routes under test call only Logs
	store         *funclog.Store
	followers     chan *funclog.Follower
}

func (a logAdmin) Logs(_ context.Context, name string, since time.Time, follow bool) ([]api.LogLine, *funclog.Follower, error) {
	if !follow {
		return a.store.Lines(name, since), nil, nil
	}
	lines, f, err := a.store.Follow(name, since)
	if err != nil {
		return nil, nil, err
	}
	a.followers <- f
	return lines, f, nil
}

func logLine(text string) api.LogLine {
	return api.LogLine{Time: time.Now(), Stream: "stdout", PID: 42, Line: text}
}

// closedWithin drains f until its channel closes (the server stopped
// following), or fails after d.
func closedWithin(t *testing.T, f *funclog.Follower, d time.Duration, why string) {
	t.Helper()
	timeout := time.After(d)
	for {
		select {
		case _, ok := <-f.C:
			if !ok {
				return
			}
		case <-timeout:
			t.Fatalf("the server still follows after %s", why)
		}
	}
}

// GET /v1/functions/{name}/logs: the kept lines as NDJSON; with
// follow=true the headers come at once, then each new line as it is added,
// and the server stops following when the client goes or the server
// drains.
func TestLogsRoute(t *testing.T) {
	adm := logAdmin{store: funclog.New(nil), followers: make(chan *funclog.Follower, 4)}
	srv := httpapi.New(frontdoor.New(frontdoor.Config{}), adm, httpapi.Options{})
	url := testkit.ServeWith(t, srv) + "/v1/functions/f/logs"
	adm.store.Sink("f").Add(logLine("one"))
	adm.store.Sink("f").Add(logLine("two"))

	resp, body := testkit.Post(t, "GET", url, "", nil)
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "application/x-ndjson" {
		t.Fatalf("GET logs: %d %q %s", resp.StatusCode, resp.Header.Get("Content-Type"), body)
	}
	lines := strings.Split(strings.TrimSpace(string(body)), "\n")
	var l api.LogLine
	if len(lines) != 2 || json.Unmarshal([]byte(lines[1]), &l) != nil || l.Line != "two" || l.PID != 42 || l.Stream != "stdout" {
		t.Fatalf("GET logs: %s", body)
	}
	if resp, body := testkit.Post(t, "GET", url+"?since=1h&follow=false", "", nil); resp.StatusCode != 200 || strings.Count(string(body), "\n") != 2 {
		t.Fatalf("since 1h: %d %s", resp.StatusCode, body)
	}
	if resp, body := testkit.Post(t, "GET", url+"?since="+time.Now().Add(time.Hour).Format(time.RFC3339), "", nil); resp.StatusCode != 200 || len(body) != 0 {
		t.Fatalf("since an hour ahead: %d %s", resp.StatusCode, body)
	}
	if resp, _ := testkit.Post(t, "GET", url+"?since=-5m", "", nil); resp.StatusCode != 400 {
		t.Fatalf("since -5m: %d, want 400", resp.StatusCode)
	}

	follow := func() (*http.Response, *bufio.Scanner, *funclog.Follower) {
		t.Helper()
		c := &http.Client{Timeout: 20 * time.Second}
		resp, err := c.Get(url + "?follow=true&since=1h")
		if err != nil {
			t.Fatal(err)
		}
		return resp, bufio.NewScanner(resp.Body), <-adm.followers
	}
	resp, sc, f := follow()
	for _, want := range []string{"one", "two", "three"} {
		if want == "three" {
			adm.store.Sink("f").Add(logLine("three")) // after the backlog: as it comes
		}
		if !sc.Scan() || json.Unmarshal(sc.Bytes(), &l) != nil || l.Line != want {
			t.Fatalf("followed: %q, want %q (%v)", sc.Text(), want, sc.Err())
		}
	}
	resp.Body.Close() // the client goes
	closedWithin(t, f, 5*time.Second, "the client went")

	// A quiet function: the status comes at once all the same.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", strings.Replace(url, "/f/", "/quiet/", 1)+"?follow=true", nil)
	quiet, err := http.DefaultClient.Do(req)
	if err != nil || quiet.StatusCode != 200 {
		t.Fatalf("following a function that printed nothing: %v", err)
	}
	quiet.Body.Close()
	closedWithin(t, <-adm.followers, 5*time.Second, "the quiet function's client went")

	resp, sc, f = follow()
	srv.SetReady(false) // draining before a shutdown
	for sc.Scan() {
	}
	resp.Body.Close()
	closedWithin(t, f, 5*time.Second, "the server began to drain")
}

// A followed stream that stays quiet gets empty keep-alive lines, and a
// line that comes after a quiet spell longer than the write bound is
// still delivered (each burst is written under a fresh deadline, even when
// the encoder writes through its buffer before the flush: a long line).
func TestLogsFollowQuiet(t *testing.T) {
	for _, tc := range []struct {
		name             string
		write, keepAlive time.Duration
		quiet            time.Duration
		wantKeepAlive    bool
	}{
		{"keep-alive", 30 * time.Second, 1500 * time.Millisecond, 0, true},
		{"a long line after the write bound", time.Second, time.Hour, 2500 * time.Millisecond, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			defer httpapi.SetFollowTimes(tc.write, tc.keepAlive)()
			adm := logAdmin{store: funclog.New(nil), followers: make(chan *funclog.Follower, 1)}
			url := testkit.ServeWith(t, httpapi.New(frontdoor.New(frontdoor.Config{}), adm, httpapi.Options{})) + "/v1/functions/f/logs?follow=true"
			c := &http.Client{Timeout: 20 * time.Second}
			resp, err := c.Get(url)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			sc := bufio.NewScanner(resp.Body)
			sc.Buffer(make([]byte, 64<<10), 64<<10)
			<-adm.followers
			if tc.wantKeepAlive {
				// Said at the start, so that a client times the silence
				// of a stream whose lines leave no room for keep-alives.
				if got := resp.Header.Get("X-Plover-Keep-Alive"); got != tc.keepAlive.String() {
					t.Fatalf("X-Plover-Keep-Alive %q, want %q", got, tc.keepAlive)
				}
				if !sc.Scan() || len(sc.Bytes()) != 0 {
					t.Fatalf("a quiet stream: %q (%v), want an empty keep-alive line", sc.Text(), sc.Err())
				}
				return
			}
			time.Sleep(tc.quiet) // the quiet spell itself is what is tested
			long := strings.Repeat("x", 4000)
			adm.store.Sink("f").Add(logLine(long))
			var l api.LogLine
			if !sc.Scan() || json.Unmarshal(sc.Bytes(), &l) != nil || l.Line != long {
				t.Fatalf("after %v quiet: %.80q (%v), want the long line", tc.quiet, sc.Text(), sc.Err())
			}
		})
	}
}

// Shutdown alone (without SetReady(false) first) ends a followed stream
// rather than waiting for its context to run out.
func TestLogsFollowEndsAtShutdown(t *testing.T) {
	adm := logAdmin{store: funclog.New(nil), followers: make(chan *funclog.Follower, 1)}
	srv := httpapi.New(frontdoor.New(frontdoor.Config{}), adm, httpapi.Options{})
	url := testkit.ServeWith(t, srv) + "/v1/functions/f/logs?follow=true"
	resp, err := (&http.Client{Timeout: 20 * time.Second}).Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	f := <-adm.followers
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := srv.Shutdown(ctx); err != nil {
		t.Fatalf("Shutdown with a follower: %v", err)
	}
	closedWithin(t, f, 5*time.Second, "the server shut down")
	if srv.Ready() {
		t.Fatal("ready after Shutdown")
	}
}

// Bytes from the client after a followed stream's request end the stream
// as the client's going does: a request pipelined behind a stream that
// does not end could never be answered, and a browser's TLS close_notify
// (a reloaded page's) is such bytes, hiding the socket's end from a peek,
// so that the stream held its place among its token's streams until a
// keep-alive write failed (15-30 s): a page limited to one stream was
// refused its own after a reload. Here the bytes are a second request,
// the connection left open.
func TestLogsFollowEndsAtBytesFromItsClient(t *testing.T) {
	adm := logAdmin{store: funclog.New(nil), followers: make(chan *funclog.Follower, 1)}
	base := testkit.ServeWith(t, httpapi.New(frontdoor.New(frontdoor.Config{}), adm, httpapi.Options{}))
	c, err := net.Dial("tcp", strings.TrimPrefix(base, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	const get = "GET /v1/functions/f/logs?follow=true HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
	if _, err := c.Write([]byte(get)); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("follow: %v %v", resp, err)
	}
	f := <-adm.followers
	if _, err := c.Write([]byte(get)); err != nil {
		t.Fatal(err)
	}
	closedWithin(t, f, 5*time.Second, "its client sent bytes it can never be answered")
}
