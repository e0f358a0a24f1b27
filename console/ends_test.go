package console_test

import (
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// What ends the page's requests and waits, in the browser (browser_test.go's
// fake and helpers): a view's end (sign-out, another route) ends its polls,
// asked or waiting their turn, and says nothing of them; a body that stalls
// after its headers ends its read; a tab shown again does not cut short a
// pause the server asked for.

// setHidden makes the page's tab hidden or shown, as the browser says it.
func setHidden(p *browser, hidden bool) {
	p.t.Helper()
	eval[bool](p, fmt.Sprintf(`(Object.defineProperty(document, "hidden", {value: %v, configurable: true}), document.dispatchEvent(new Event("visibilitychange")), true)`, hidden))
}

// statusLine is the page's status line.
const statusLine = `document.getElementById("status").textContent`

// TestViewsEndTheirPolls: a poll in flight as its view ends (the reviewer's
// repro: a function's record answering 503 after 3 s, Sign out clicked
// meanwhile) is cancelled, and neither it nor the one queued behind it
// (the overview's /metrics, behind /v1/functions in the page's chain of
// reads) goes on to the server with the token or writes the status line:
// the sign-in page showed the last user's function name and error, and a
// new view had its status overwritten by the old one's.
func TestViewsEndTheirPolls(t *testing.T) {
	b := startBrowser(t)
	var mu sync.Mutex
	hold := map[string]bool{} // paths whose next request is held 3 s, then 503
	holding, ended := make(chan struct{}, 1), make(chan string, 1)
	f := newFake(t, func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		held := hold[r.URL.Path]
		delete(hold, r.URL.Path)
		mu.Unlock()
		if held {
			holding <- struct{}{}
			select {
			case <-r.Context().Done():
				ended <- "cancelled"
				return
			case <-time.After(3 * time.Second):
				ended <- "answered"
				writeJSON(w, 503, map[string]any{"error": map[string]string{"code": "unavailable", "message": "secret-fn's store unavailable"}})
				return
			}
		}
		switch r.URL.Path {
		case "/v1/functions/secret-fn":
			writeJSON(w, 200, map[string]any{"name": "secret-fn", "version": vid(1), "versions": 1})
		case "/v1/functions/secret-fn/versions":
			writeJSON(w, 200, map[string]any{"current": vid(1), "versions": []any{}})
		case "/v1/functions":
			writeJSON(w, 200, map[string]any{"functions": []any{}})
		case "/metrics", "/healthz":
			writeJSON(w, 200, map[string]any{"status": "ok"})
		default:
			http.NotFound(w, r)
		}
	})
	// end opens route in a tab for t, does what ends the view while
	// path's next request is held, and reports that request cancelled and
	// the status line empty. It returns the tab and when the view's end
	// began.
	end := func(t *testing.T, route, path, what string, act chromedp.Action[chromedp.Void]) (p *browser, out time.Time) {
		t.Helper()
		p = b.tab(t, "")
		p.do(30*time.Second, route, chromedp.Navigate(f.url+"/ui/#"+route+"?token="+token), chromedp.WaitVisible(chromedp.CSS("h2")))
		mu.Lock()
		hold[path] = true
		mu.Unlock()
		select {
		case <-holding:
		case <-time.After(10 * time.Second):
			t.Fatalf("the page did not ask for %s in 10 s", path)
		}
		out = time.Now()
		p.do(10*time.Second, what, act)
		select {
		case how := <-ended:
			if how != "cancelled" {
				t.Fatalf("%s: the request in flight was answered, not cancelled; the status line then read %q", what, eval[string](p, statusLine))
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: the request in flight neither cancelled nor answered in 10 s", what)
		}
		if got := eval[string](p, statusLine); got != "" {
			t.Errorf("%s: the status line reads %q", what, got)
		}
		return p, out
	}

	t.Run("sign-out", func(t *testing.T) {
		end(t, "/functions/secret-fn", "/v1/functions/secret-fn", "sign out", chromedp.Click(chromedp.CSS("#signout")))
	})

	t.Run("sign-out with a read queued", func(t *testing.T) {
		p, out := end(t, "/", "/v1/functions", "sign out", chromedp.Click(chromedp.CSS("#signout")))
		// A request the page makes now is sent after any it queued before
		// (one read at a time, in turn): signed in with a token the server
		// refuses, its first poll is one.
		p.do(10*time.Second, "sign in as another",
			chromedp.SendKeys(chromedp.CSS("#token"), "other-token"),
			chromedp.Click(chromedp.CSS(`#signin button[type="submit"]`)),
			poll(`document.getElementById("signin-error").textContent.includes("not known")`))
		for _, path := range []string{"/v1/functions", "/metrics"} {
			for _, a := range f.asks(path) {
				if a.at.After(out) && a.auth == "Bearer "+token {
					t.Errorf("%s was asked with the signed-out token after sign-out", path)
				}
			}
		}
		if got := eval[string](p, statusLine); got != "" {
			t.Errorf("after sign-out the status line reads %q", got)
		}
	})

	t.Run("another route", func(t *testing.T) {
		p, _ := end(t, "/functions/secret-fn", "/v1/functions/secret-fn", "to the pipelines", chromedp.Click(chromedp.CSS(`nav a[href="#/pipelines"]`)))
		p.do(10*time.Second, "the pipelines", poll(`document.getElementById("pipelines").textContent.includes("No pipelines")`))
		if got := eval[string](p, statusLine); got != "" {
			t.Errorf("the pipelines' status line reads %q", got)
		}
	})
}

// TestStalledBodyEndsItsRead: an answer whose headers came and whose body
// then stopped (a proxy that holds it) left r.json() waiting for ever and
// the overview's refresh stopped without a word: the read's 15 s bound
// (1.5 s here) now holds until the body is read, the status line says so,
// and the page asks again. A followed output stream keeps the bound for its
// headers only: its body is watched for 45 s of quiet.
func TestStalledBodyEndsItsRead(t *testing.T) {
	b := startBrowser(t)
	var mu sync.Mutex
	stalls := 1
	st := &fn{current: 1, n: 1}
	f := newFake(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/healthz" {
			writeJSON(w, 200, map[string]any{"status": "ok", "devices": []any{}})
			return
		}
		if r.URL.Path != "/v1/functions" {
			st.serve(w, r)
			return
		}
		mu.Lock()
		stall := stalls > 0
		stalls--
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		if stall {
			fmt.Fprint(w, `{"functions": [`)
			w.(http.Flusher).Flush()
			<-r.Context().Done()
			return
		}
		fmt.Fprint(w, `{"functions": []}`)
	})
	const short = `{ const st = window.setTimeout; window.setTimeout = (f, ms, ...a) => st(f, ms === 15000 ? 1500 : ms, ...a); }`
	p := b.tab(t, short)
	p.do(30*time.Second, "the stalled read said",
		chromedp.Navigate(f.url+"/ui/#/?token="+token),
		poll(statusLine+`.includes("the answer stopped short of its end within 15 s")`))
	f.waitAsks("/v1/functions", 2, 15*time.Second)
	p.do(10*time.Second, "the status line cleared once answered", poll(statusLine+` === ""`))

	// The stream sends a line and then holds, for longer than the bound.
	n := len(f.asks("/v1/functions/f/logs"))
	eval[bool](p, `(location.hash = "#/functions/f", true)`)
	p.do(30*time.Second, "f's page",
		poll(`document.getElementById("logs").textContent.includes("| hello-")`))
	polls := len(f.asks("/v1/functions/f"))
	f.waitAsks("/v1/functions/f", polls+2, 15*time.Second) // 2 s apart: past the 1.5 s
	if got := eval[string](p, `document.getElementById("logs").textContent`); strings.Contains(got, "ended") || len(f.asks("/v1/functions/f/logs")) != n+1 {
		t.Errorf("the followed stream was cut at the read's bound: asked %d times, pane %q", len(f.asks("/v1/functions/f/logs"))-n, got)
	}
}

// TestShownTabKeepsThePause: the output stream refused with Retry-After:
// 60 waits the 60 s, though the tab is hidden and shown meanwhile: each
// time it was shown the page asked again at once (the reviewer's three
// cycles made 4 requests of 1).
func TestShownTabKeepsThePause(t *testing.T) {
	b := startBrowser(t)
	st := &fn{current: 1, n: 1}
	f := newFake(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/functions/f/logs" {
			w.Header().Set("Retry-After", "60")
			writeJSON(w, 429, map[string]any{"error": map[string]string{"code": "rate_limited", "message": "token over its rate"}})
			return
		}
		st.serve(w, r)
	})
	p := b.tab(t, "")
	p.do(30*time.Second, "the stream refused",
		chromedp.Navigate(f.url+"/ui/#/functions/f?token="+token),
		poll(`document.getElementById("logs").textContent.includes("[output stream ended: ")`))
	for range 3 {
		setHidden(p, true)
		setHidden(p, false)
	}
	// The page polls every 2 s, one read at a time in turn: a stream
	// asked for as the tab was shown went out before the second poll
	// after.
	f.waitAsks("/v1/functions/f", len(f.asks("/v1/functions/f"))+2, 15*time.Second)
	if n := len(f.asks("/v1/functions/f/logs")); n != 1 {
		t.Errorf("within the 60 s the server asked for, the page asked for the stream %d times, want once", n)
	}
}
