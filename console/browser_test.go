package console_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"
	"github.com/valyala/fasthttp"

	"github.com/plover-run/plover/console"
)

// The console's page against a scripted API, in a real headless Chromium:
// what a real server seldom does on cue (answer 429 with Retry-After, fail
// twice in a row, hold a followed stream without a byte, warn of a
// rollback) is said here when the test needs it, and every request the page
// makes is recorded. cli/plover's TestConsole* drive it against a real
// plover serve.

// token is the one token the fake server takes.
const token = "good-token-0123456789"

// asked is a request the page made.
type asked struct {
	method, path, auth string
	at                 time.Time
}

// fake serves the console's files as plover serve does (console.Serve,
// its policy included) and the API by the test's handler, which runs
// after the token is checked (/healthz, open, is not).
type fake struct {
	t    *testing.T
	url  string
	api  http.HandlerFunc
	mu   sync.Mutex
	log  []asked
	news chan struct{} // a request came
}

func newFake(t *testing.T, api http.HandlerFunc) *fake {
	f := &fake{t: t, api: api, news: make(chan struct{}, 1)}
	srv := httptest.NewServer(http.HandlerFunc(f.serve))
	// Streams the page still holds would keep Close waiting.
	t.Cleanup(func() { srv.CloseClientConnections(); srv.Close() })
	f.url = srv.URL
	return f
}

func (f *fake) serve(w http.ResponseWriter, r *http.Request) {
	if console.Is([]byte(r.URL.Path)) {
		var ctx fasthttp.RequestCtx
		ctx.Request.Header.SetMethod(r.Method)
		ctx.Request.SetRequestURI(r.URL.RequestURI())
		console.Serve(&ctx)
		ctx.Response.Header.VisitAll(func(k, v []byte) { w.Header().Add(string(k), string(v)) })
		w.WriteHeader(ctx.Response.StatusCode())
		w.Write(ctx.Response.Body())
		return
	}
	if r.URL.Path == "/blank" { // a page of the origin without the console's policy
		w.Header().Set("Content-Type", "text/html")
		fmt.Fprint(w, "<!doctype html><title>blank</title>")
		return
	}
	f.mu.Lock()
	f.log = append(f.log, asked{r.Method, r.URL.Path, r.Header.Get("Authorization"), time.Now()})
	f.mu.Unlock()
	select {
	case f.news <- struct{}{}:
	default:
	}
	if r.URL.Path != "/healthz" && r.Header.Get("Authorization") != "Bearer "+token {
		w.Header().Set("WWW-Authenticate", `Bearer realm="plover"`)
		writeJSON(w, 401, map[string]any{"error": map[string]string{"code": "unauthenticated", "message": "the bearer token is not known to this server"}})
		return
	}
	f.api(w, r)
}

// asks is the requests the page made for path so far.
func (f *fake) asks(path string) []asked {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []asked
	for _, a := range f.log {
		if a.path == path {
			out = append(out, a)
		}
	}
	return out
}

// waitAsks waits, up to d, until the page has asked for path n times.
func (f *fake) waitAsks(path string, n int, d time.Duration) []asked {
	f.t.Helper()
	deadline := time.After(d)
	for {
		if a := f.asks(path); len(a) >= n {
			return a
		}
		select {
		case <-f.news:
		case <-deadline:
			f.t.Fatalf("the page asked for %s %d times in %v, want %d", path, len(f.asks(path)), d, n)
		}
	}
}

// healthz answers /healthz for one device as plover serve does: its name,
// target and health to anyone; to the token (a read token's detail) its
// memory (1000 B, 600 free, 400 used), detail's fields besides, and while
// it is unhealthy (503) its error, "device lost".
func healthz(w http.ResponseWriter, r *http.Request, name, target string, healthy bool, detail map[string]any) {
	dev := map[string]any{"name": name, "target": target, "healthy": healthy}
	status, code := "ok", 200
	if !healthy {
		status, code = "unhealthy", 503
	}
	if r.Header.Get("Authorization") == "Bearer "+token {
		dev["mem_total_bytes"], dev["mem_free_bytes"], dev["mem_used_bytes"] = 1000, 600, 400
		for k, v := range detail {
			dev[k] = v
		}
		if !healthy {
			dev["error"] = "device lost"
		}
	}
	writeJSON(w, code, map[string]any{"status": status, "devices": []any{dev}})
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	json.NewEncoder(w).Encode(v)
}

// browser is a headless Chromium for the test (skipped without one unless
// PLOVER_REQUIRE_CHROMIUM=1, as cli/plover's console tests); tab opens a
// page in it that accepts every dialog (a token link's confirm).
type browser struct {
	t   *testing.T
	ctx context.Context
}

func startBrowser(t *testing.T) *browser {
	t.Helper()
	if testing.Short() {
		t.Skip("starts a browser")
	}
	var chrome string
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "headless-shell"} {
		if p, err := exec.LookPath(name); err == nil {
			chrome = p
			break
		}
	}
	if chrome == "" {
		if os.Getenv("PLOVER_REQUIRE_CHROMIUM") == "1" {
			t.Fatal("chromium not found, and PLOVER_REQUIRE_CHROMIUM=1 (bash scripts/install-chromium.sh installs Debian's)")
		}
		t.Skipf("\n\n*** SKIPPING %s: chromium not found (bash scripts/install-chromium.sh installs Debian's; PLOVER_REQUIRE_CHROMIUM=1 makes this a failure) ***\n\n", t.Name())
	}
	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(chrome), chromedp.NoSandbox,
		chromedp.WindowSize(1280, 900), chromedp.Flag("disable-dev-shm-usage", true))
	actx, cancel := chromedp.NewExecAllocator(context.Background(), opts...)
	t.Cleanup(cancel)
	ctx, cancel := chromedp.NewContext(actx)
	t.Cleanup(cancel)
	if _, err := chromedp.Run(ctx, chromedp.Navigate("about:blank")); err != nil {
		t.Fatalf("start chromium %s: %v", chrome, err)
	}
	return &browser{t: t, ctx: ctx}
}

// tab opens a tab for t, closed as t ends (its page polling no more);
// before each document it loads, it runs script (none when "").
func (b *browser) tab(t *testing.T, script string) *browser {
	t.Helper()
	ctx, cancel := chromedp.NewContext(b.ctx)
	t.Cleanup(cancel)
	tb := &browser{t: t, ctx: ctx}
	if _, err := chromedp.Run(ctx, chromedp.Navigate("about:blank")); err != nil {
		t.Fatalf("open a tab: %v", err)
	}
	go func() {
		for ev, err := range chromedp.Events(ctx, page.JavascriptDialogOpening) {
			if err != nil {
				return
			}
			_ = ev
			chromedp.Call(ctx, page.HandleJavaScriptDialog, page.HandleJavaScriptDialogParams{Accept: true})
		}
	}()
	if script != "" {
		if _, err := chromedp.Call(ctx, page.AddScriptToEvaluateOnNewDocument, page.AddScriptToEvaluateOnNewDocumentParams{Source: script}); err != nil {
			t.Fatalf("add a script to the tab: %v", err)
		}
	}
	return tb
}

// do runs steps within d, failing the test with what it was doing and the
// page.
func (b *browser) do(d time.Duration, what string, steps ...chromedp.Action[chromedp.Void]) {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, d)
	defer cancel()
	if err := chromedp.Do(ctx, steps...); err != nil {
		page, _ := chromedp.Run(b.ctx, chromedp.Evaluate[string](`location.href + "\n" + document.body.outerHTML`))
		b.t.Fatalf("%s: %v\npage: %.4000s", what, err, page)
	}
}

// eval is what expr evaluates to in the page (a promise's value).
func eval[T any](b *browser, expr string) T {
	b.t.Helper()
	v, err := chromedp.Run(b.ctx, chromedp.Evaluate[T](expr, chromedp.EvalAwaitPromise))
	if err != nil {
		b.t.Fatalf("evaluate %s: %v", expr, err)
	}
	return v
}

func poll(expr string) chromedp.Action[chromedp.Void] { return chromedp.Poll[chromedp.Void](expr) }

// TestPollsSpareTheTokensRate: the overview's refresh, whose every request
// counts against its token's rate (--limits rate=...). /healthz is asked
// without the token (it is open, and uncounted so), each device's memory
// read from /metrics instead and its error from /healthz with the token
// only while a device is unhealthy; a 429's Retry-After is waited for and
// failures in a row wait longer each; a hidden tab asks nothing and asks
// again once shown.
func TestPollsSpareTheTokensRate(t *testing.T) {
	b := startBrowser(t)
	var mu sync.Mutex
	healthy := true
	var plan []int // the next answers' statuses for /v1/functions
	f := newFake(t, func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		switch r.URL.Path {
		case "/v1/functions":
			code := 200
			if len(plan) > 0 {
				code, plan = plan[0], plan[1:]
			}
			switch code {
			case 429:
				w.Header().Set("Retry-After", "5")
				writeJSON(w, 429, map[string]any{"error": map[string]string{"code": "rate_limited", "message": "token over its rate"}})
			case 200:
				writeJSON(w, 200, map[string]any{"functions": []map[string]any{{"name": "f", "version": "v1"}}})
			default:
				writeJSON(w, code, map[string]any{"error": map[string]string{"code": "unavailable", "message": "store unavailable"}})
			}
		case "/metrics":
			fmt.Fprint(w, "plover_device_memory_bytes{device=\"cpu0\",kind=\"total\"} 1000\n"+
				"plover_device_memory_bytes{device=\"cpu0\",kind=\"free\"} 600\n"+
				"plover_device_memory_bytes{device=\"cpu0\",kind=\"used\"} 400\n")
		case "/healthz":
			healthz(w, r, "cpu0", "host", healthy, nil)
		default:
			http.NotFound(w, r)
		}
	})
	p := b.tab(t, "")
	p.do(30*time.Second, "the overview with the node's devices",
		chromedp.Navigate(f.url+"/ui/#/?token="+token),
		poll(`document.getElementById("health").textContent.includes("mem_total_bytes: 1000") && document.getElementById("health").textContent.includes("status: ok")`))
	f.waitAsks("/healthz", 2, 10*time.Second)
	for _, a := range f.asks("/healthz") {
		if a.auth != "" {
			t.Errorf("the page sent its token to /healthz (%q), where each request costs one of its rate: /healthz answers without one", a.auth)
			break
		}
	}

	// A device unhealthy: its error, which only a token's /healthz has.
	mu.Lock()
	healthy = false
	mu.Unlock()
	p.do(10*time.Second, "an unhealthy device's error",
		poll(`document.getElementById("health").textContent.includes("status: unhealthy") && document.getElementById("health").textContent.includes("error: device lost")`))
	mu.Lock()
	healthy = true
	mu.Unlock()
	p.do(10*time.Second, "healthy again", poll(`document.getElementById("health").textContent.includes("status: ok")`))

	// A 429 with Retry-After: 5 (the poll's own pause is 2 s, a first
	// failure's 4 s), then a 500 (a second failure in a row: 8 s), then
	// answers again.
	mu.Lock()
	before := len(f.asks("/v1/functions"))
	plan = []int{429, 500}
	mu.Unlock()
	asks := f.waitAsks("/v1/functions", before+3, 30*time.Second)
	p.do(10*time.Second, "the status line cleared once answered", poll(`document.getElementById("status").textContent === ""`))
	if gap := asks[before+1].at.Sub(asks[before].at); gap < 5*time.Second {
		t.Errorf("after a 429 with Retry-After: 5 the page asked again in %v", gap)
	}
	if gap := asks[before+2].at.Sub(asks[before+1].at); gap < 8*time.Second {
		t.Errorf("after a second failure in a row the page asked again in %v, want 8 s or more", gap)
	}

	// Hidden: nothing asked (but a refresh under way as it hid). There is
	// no event for a request not made: the page is watched for a while,
	// three of its refreshes' pauses.
	hide := func(hidden bool) {
		eval[bool](p, fmt.Sprintf(`(Object.defineProperty(document, "hidden", {value: %v, configurable: true}), document.dispatchEvent(new Event("visibilitychange")), true)`, hidden))
	}
	hide(true)
	n := len(f.asks("/v1/functions"))
	time.Sleep(6 * time.Second)
	if m := len(f.asks("/v1/functions")); m > n+1 {
		t.Errorf("a hidden page asked for /v1/functions %d times in 6 s", m-n)
	}
	// Shown: it asks again, though its next refresh came and went while
	// it was hidden.
	hide(false)
	f.waitAsks("/v1/functions", len(f.asks("/v1/functions"))+1, 10*time.Second)
}

// vid is version i's id: 64 times its digit.
func vid(i int) string { return strings.Repeat(fmt.Sprint(i), 64) }

// fn is a function f's routes, with versions vid(0) .. vid(n-1), vid(1)
// current: a rollback to vid(0) warns, as one past a pipeline running the
// function does; an invoke answers "output bytes"; each followed stream
// sends one line ("hello-N", the Nth stream) and then nothing, not even
// the server's keep-alive: stalled.
type fn struct {
	mu                  sync.Mutex
	current, n, streams int
}

func (s *fn) serve(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	cur, n := s.current, s.n
	s.mu.Unlock()
	switch r.URL.Path {
	case "/v1/functions/f":
		writeJSON(w, 200, map[string]any{"name": "f", "version": vid(cur), "versions": n})
	case "/v1/functions/f/versions":
		var vs []map[string]any
		for i := range n {
			vs = append(vs, map[string]any{"id": vid(i), "created": fmt.Sprintf("2025-01-0%dT00:00:00Z", i+1), "size": 1})
		}
		writeJSON(w, 200, map[string]any{"current": vid(cur), "versions": vs})
	case "/metrics":
	case "/v1/functions/forbidden": // a token without the read scope
		writeJSON(w, 403, map[string]any{"error": map[string]string{"code": "forbidden", "message": `token "inv" lacks the "read" scope`}})
	case "/v1/functions/f/rollback":
		var body struct{ Version string }
		json.NewDecoder(r.Body).Decode(&body)
		fi := map[string]any{"name": "f", "version": body.Version}
		s.mu.Lock()
		s.current = int(body.Version[0] - '0')
		if s.current == 0 {
			fi["warnings"] = []string{`rolled back: pipeline outer runs f <b id="injected">past its limit</b>`}
		}
		s.mu.Unlock()
		writeJSON(w, 200, fi)
	case "/v1/functions/f/invoke":
		w.Header().Set("Content-Type", "application/octet-stream")
		fmt.Fprint(w, "output bytes")
	case "/v1/functions/f/logs":
		s.mu.Lock()
		s.streams++
		n := s.streams
		s.mu.Unlock()
		w.Header().Set("Content-Type", "application/x-ndjson")
		json.NewEncoder(w).Encode(map[string]any{"time": fmt.Sprintf("2025-01-01T00:00:%02dZ", n), "stream": "stdout", "pid": 1, "line": fmt.Sprintf("hello-%d", n)})
		w.(http.Flusher).Flush()
		<-r.Context().Done()
	default:
		http.NotFound(w, r)
	}
}

// TestFunctionPage: a function's page against fn.
func TestFunctionPage(t *testing.T) {
	b := startBrowser(t)
	st := &fn{current: 1, n: 2}
	f := newFake(t, st.serve)
	open := func(p *browser) {
		t.Helper()
		p.do(30*time.Second, "f's page",
			chromedp.Navigate(f.url+"/ui/#/functions/f?token="+token),
			chromedp.WaitVisible(chromedp.CSS(`#versions tr.current`)))
	}
	const logs = `document.getElementById("logs").textContent`

	// A rollback's warnings (what it breaks) are shown as text, and stay
	// through the refreshes until the next rollback.
	t.Run("rollback warnings", func(t *testing.T) {
		p := b.tab(t, "")
		open(p)
		v0 := vid(0)
		p.do(10*time.Second, "rollback to v0",
			chromedp.Click(chromedp.CSS(`button.rollback[data-version="`+v0+`"]:not([aria-disabled])`)),
			poll(`document.getElementById("rollback-warnings").textContent.includes("pipeline outer runs f")`),
			chromedp.WaitVisible(chromedp.CSS(`tr.current[data-version="`+v0+`"]`)))
		if got := eval[string](p, `document.getElementById("rollback-warnings").textContent`); !strings.Contains(got, `warning: rolled back: pipeline outer runs f <b id="injected">past its limit</b>`) ||
			!strings.Contains(got, "Rolled back to "+v0[:12]) {
			t.Errorf("the rollback's warnings show as %q", got)
		}
		if eval[bool](p, `document.getElementById("injected") !== null`) {
			t.Error("a warning's HTML became an element")
		}
		// Two refreshes, and the one after them has drawn.
		f.waitAsks("/v1/functions/f", len(f.asks("/v1/functions/f"))+3, 15*time.Second)
		if got := eval[string](p, `document.getElementById("rollback-warnings").textContent`); !strings.Contains(got, "pipeline outer runs f") {
			t.Errorf("two refreshes after the rollback its warnings show as %q", got)
		}
		p.do(10*time.Second, "rollback to v1, which warns of nothing",
			chromedp.Click(chromedp.CSS(`button.rollback[data-version="`+vid(1)+`"]:not([aria-disabled])`)),
			chromedp.WaitVisible(chromedp.CSS(`tr.current[data-version="`+vid(1)+`"]`)),
			poll(`document.getElementById("rollback-warnings").textContent === ""`))
	})

	// A rollback button takes no click until it and the page have been in
	// view a moment: another site's tab opened under a double-click must
	// not land the second click on it. The page's focus (what such a tab
	// gets) starts the wait again; a click within it is said, not sent.
	t.Run("a click as the page comes into view", func(t *testing.T) {
		p := b.tab(t, "")
		open(p)
		btn := `document.querySelector('button.rollback[data-version="` + vid(0) + `"]')`
		p.do(10*time.Second, "the button settles", poll(btn+` !== null && !`+btn+`.hasAttribute("aria-disabled")`))
		before := len(f.asks("/v1/functions/f/rollback"))
		if !eval[bool](p, `(() => { window.dispatchEvent(new Event("focus")); `+btn+`.click(); return `+btn+`.getAttribute("aria-disabled") === "true"; })()`) {
			t.Fatal("the button took no wait after the page's focus")
		}
		if got := eval[string](p, `document.getElementById("rollback-error").textContent`); !strings.Contains(got, "Not rolled back") {
			t.Errorf("a click as the page came into view says %q, want it not taken", got)
		}
		p.do(10*time.Second, "the button settles again", poll(`!`+btn+`.hasAttribute("aria-disabled")`))
		if n := len(f.asks("/v1/functions/f/rollback")); n != before {
			t.Errorf("%d rollbacks asked for by a click as the page came into view", n-before)
		}
	})

	// The versions are asked for again only when they changed (the
	// current version, their count), not each refresh: each request
	// counts against the token's rate.
	t.Run("versions asked when changed", func(t *testing.T) {
		p := b.tab(t, "")
		refreshes, versions := len(f.asks("/v1/functions/f")), len(f.asks("/v1/functions/f/versions"))
		open(p)
		f.waitAsks("/v1/functions/f", refreshes+4, 15*time.Second)
		if n := len(f.asks("/v1/functions/f/versions")) - versions; n != 1 {
			t.Errorf("over 4 refreshes of an unchanged function the page asked for its versions %d times, want once", n)
		}
		st.mu.Lock()
		st.n = 3 // deployed elsewhere, not made current
		st.mu.Unlock()
		p.do(10*time.Second, "a version deployed elsewhere", chromedp.WaitVisible(chromedp.CSS(`#versions tr[data-version="`+vid(2)+`"]`)))
	})

	// Signing out revokes the last output's blob: URL, which held the
	// previous token's bytes for anyone on the tab. Read back from another
	// page of the origin without the console's policy (connect-src 'self'
	// keeps the console's own from fetching blob: URLs).
	t.Run("sign-out revokes the output", func(t *testing.T) {
		p := b.tab(t, "")
		open(p)
		p.do(10*time.Second, "invoke",
			chromedp.Click(chromedp.CSS(`#invoke button[type="submit"]`)),
			chromedp.WaitVisible(chromedp.CSS("#invoke-download")))
		href := eval[string](p, `document.getElementById("invoke-download").href`)
		other := b.tab(t, "")
		other.do(10*time.Second, "a page of the origin", chromedp.Navigate(f.url+"/blank"))
		read := `fetch(` + fmt.Sprintf("%q", href) + `).then((r) => r.text(), (e) => "failed: " + e)`
		if got := eval[string](other, read); got != "output bytes" {
			t.Fatalf("the output's blob URL before sign-out reads %q, want the output (the test cannot tell it revoked)", got)
		}
		p.do(10*time.Second, "sign out", chromedp.Click(chromedp.CSS("#signout")), chromedp.WaitVisible(chromedp.CSS("#signin")))
		if got := eval[string](other, read); !strings.HasPrefix(got, "failed: ") {
			t.Errorf("after sign-out the output's blob URL still reads %q", got)
		}
		if eval[bool](p, `document.getElementById("invoke-download") !== null`) {
			t.Error("after sign-out the page still offers the output")
		}
	})

	// A browser without AbortSignal.any (before 2024's): the output is
	// followed all the same.
	t.Run("no AbortSignal.any", func(t *testing.T) {
		p := b.tab(t, `delete AbortSignal.any;`)
		open(p)
		if eval[bool](p, `typeof AbortSignal.any === "function"`) {
			t.Fatal("the page has AbortSignal.any: the test would not see a browser without it")
		}
		p.do(10*time.Second, "the output followed", poll(logs+`.includes("stdout[1] | hello-")`))
		if got := eval[string](p, logs); strings.Contains(got, "ended") {
			t.Errorf("the output pane says %q", got)
		}
	})

	// A stream that sends nothing, not even the server's keep-alive: the
	// pane says it stalled and follows again. The page's 45 s is made
	// 1.5 s here (its own timers of that length, before it loads).
	t.Run("stalled stream", func(t *testing.T) {
		p := b.tab(t, `{ const st = window.setTimeout; window.setTimeout = (f, ms, ...a) => st(f, ms === 45000 ? 1500 : ms, ...a); }`)
		n := len(f.asks("/v1/functions/f/logs"))
		open(p)
		p.do(15*time.Second, "the stall said and the output followed again",
			poll(logs+`.includes("[output stream stalled: nothing from the server in 45 s; following again]")`),
			poll(`(`+logs+`.match(/\| hello-/g) || []).length >= 2`))
		if got := len(f.asks("/v1/functions/f/logs")); got < n+2 {
			t.Errorf("the page asked for the stream %d times, want it followed again", got-n)
		}
	})
}

// TestSignOutAndTokens: what a sign-out leaves on the page, and tokens no
// header can carry, against fn.
func TestSignOutAndTokens(t *testing.T) {
	b := startBrowser(t)
	f := newFake(t, (&fn{current: 1, n: 2}).serve)
	// Signing out clears the status line: the last view's errors and the
	// function they named are the last user's (they stayed beside the
	// form, "asking again" of a view that had ended).
	t.Run("sign-out clears the status", func(t *testing.T) {
		p := b.tab(t, "")
		p.do(30*time.Second, "a page the token may not read",
			chromedp.Navigate(f.url+"/ui/#/functions/forbidden?token="+token),
			poll(`document.getElementById("status").textContent.includes("lacks the")`))
		p.do(10*time.Second, "sign out", chromedp.Click(chromedp.CSS("#signout")), chromedp.WaitVisible(chromedp.CSS("#signin")))
		if got := eval[string](p, `document.getElementById("status").textContent`); got != "" {
			t.Errorf("after sign-out the status line reads %q", got)
		}
	})

	// A token no Authorization header can carry (typographic quotes
	// pasted with it) is refused where it is given, by a link or the
	// form: held, every request threw in the browser before it went out,
	// no 401 came to drop it, and the page showed it signed in for good.
	t.Run("an unsendable token is refused", func(t *testing.T) {
		p := b.tab(t, "")
		held := `sessionStorage.getItem("plover-token")`
		p.do(30*time.Second, "a link with a quoted token",
			chromedp.Navigate(f.url+"/ui/#/functions/f?token=%E2%80%9Cabc%E2%80%9D"),
			chromedp.WaitVisible(chromedp.CSS("#signin")),
			poll(`document.getElementById("signin-error").textContent.includes("not taken")`))
		if got := eval[any](p, held); got != nil {
			t.Errorf("the link's token is held: %v", got)
		}
		p.do(10*time.Second, "the form given the token with a space",
			chromedp.SetValue(chromedp.CSS("#token"), "abc def"),
			chromedp.Click(chromedp.CSS(`#signin button[type="submit"]`)),
			poll(`document.getElementById("signin-error").textContent.includes("printable ASCII")`))
		if got := eval[any](p, held); got != nil || eval[bool](p, `document.getElementById("signin").hidden`) {
			t.Errorf("the form's token is held (%v), or the form hidden", got)
		}
		// One held already (an older page's): dropped at the first request.
		p.do(10*time.Second, "a held token with a quote",
			chromedp.Evaluate[chromedp.Void](`sessionStorage.setItem("plover-token", "\u201cabc"); location.hash = "#/"`),
			poll(`document.getElementById("signin-error").textContent.includes("was dropped")`))
		if got := eval[any](p, held); got != nil {
			t.Errorf("the held token stays: %v", got)
		}
		// Signed in, a link's unsendable token is said on the status line
		// and forgotten: the next one at the form does not read it.
		p.do(10*time.Second, "signed in by the form, then a link with a quoted token",
			chromedp.SetValue(chromedp.CSS("#token"), token),
			chromedp.Click(chromedp.CSS(`#signin button[type="submit"]`)),
			chromedp.WaitVisible(chromedp.CSS("#signout")),
			chromedp.Evaluate[chromedp.Void](`location.hash = "#/functions/f?token=%E2%80%9Cx"`),
			poll(`document.getElementById("status").textContent.includes("not taken")`),
			chromedp.Click(chromedp.CSS("#signout")), chromedp.WaitVisible(chromedp.CSS("#signin")))
		if got := eval[string](p, `document.getElementById("signin-error").textContent`); strings.Contains(got, "not taken") || strings.Contains(got, "dropped") {
			t.Errorf("after sign-out the form says %q", got)
		}
	})
}
