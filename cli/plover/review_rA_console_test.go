package main_test

// Review rA (bug hunt, read-only): the console's output pane against a
// function that prints much, long or deceptive lines, in a real headless
// Chromium against a real `plover serve`. Each case fails on the code it
// was written against; see the report for the fixes.

import (
	"context"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/plover-run/plover/bundle"
	"github.com/plover-run/plover/funclog"
)

func TestReviewRAConsoleOutputPane(t *testing.T) {
	if testing.Short() {
		t.Skip("builds binaries, starts a server and a browser")
	}
	chrome := chromiumPath()
	if chrome == "" {
		t.Skip("chromium not found")
	}
	bin := buildPlover(t)
	srv := startIsoServer(t, bin, t.TempDir(), nil)
	c := &http.Client{Timeout: 60 * time.Second}
	fn := srv.url + "/v1/functions/"
	dirs := map[string]string{}
	deploy := func(name, kernel string, grid int) {
		t.Helper()
		if dirs[name] == "" {
			dirs[name], _ = outputBundle(t, name, kernel, grid, 1)
		}
		dir := dirs[name]
		if r := secDo(t, c, "PUT", fn+name, "", bundle.MediaType, packDir(t, dir)); r.code != 201 {
			t.Fatalf("deploy %s: %d %s", name, r.code, r.body)
		}
	}
	invoke := func(name string, in []byte) {
		t.Helper()
		if r := secDo(t, c, "POST", fn+name+"/invoke", "", "application/octet-stream", in); r.code != 200 {
			t.Fatalf("invoke %s: %d %.200s", name, r.code, r.body)
		}
	}
	deploy("flood", "flood", 1500) // 1500 short lines, a 10000-byte line, "flood done"
	deploy("bigline", "flood", 1)  // one short line, the 10000-byte line, "flood done"
	deploy("talker", "say", 1)     // "say: <input>"

	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(chrome), chromedp.NoSandbox,
		chromedp.WindowSize(1280, 900), chromedp.Flag("disable-dev-shm-usage", true))
	actx, cancel := chromedp.NewExecAllocator(context.Background(), opts...)
	defer cancel()
	browser, cancel := chromedp.NewContext(actx)
	defer cancel()
	if _, err := chromedp.Run(browser, chromedp.Navigate("about:blank")); err != nil {
		t.Fatalf("start chromium %s: %v", chrome, err)
	}
	do := func(what string, steps ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		ctx, cancel := context.WithTimeout(browser, 60*time.Second)
		defer cancel()
		if err := chromedp.Do(ctx, steps...); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	evalInt := func(expr string) int {
		t.Helper()
		v, err := chromedp.Run(browser, chromedp.Evaluate[int](expr))
		if err != nil {
			t.Fatalf("evaluate %s: %v", expr, err)
		}
		return v
	}
	open := func(name string) {
		t.Helper()
		do("open "+name+"'s page", chromedp.Navigate("about:blank"), // a fresh page, not a same-document hop
			chromedp.Navigate(srv.url+"/ui/#/functions/"+name),
			chromedp.WaitVisible(chromedp.CSS(`#versions tr.current`)))
	}
	poll := func(expr string) chromedp.Action[chromedp.Void] { return chromedp.Poll[chromedp.Void](expr) }

	// The server keeps a function's last RingLines lines; the page keeps
	// every line it was ever sent, one text node each, and scrolls (a
	// layout) per line: a function that prints for an hour fills the
	// tab's memory. Bounded, it would hold some fixed number of lines
	// (here: no more than twice what the server itself keeps).
	t.Run("output pane is bounded", func(t *testing.T) {
		open("flood")
		limit := 2 * funclog.RingLines
		lines := `document.getElementById("logs").childNodes.length`
		for i := 1; i <= 8; i++ {
			invoke("flood", []byte("x"))
			// Wait until this run's last line arrived (or was dropped for a
			// slow reader: then the next runs add more).
			ctx, cancel := context.WithTimeout(browser, 8*time.Second)
			chromedp.Do(ctx, poll(`(document.getElementById("logs").textContent.match(/flood done/g) || []).length >= `+strconv.Itoa(i)))
			cancel()
			if n := evalInt(lines); n > limit {
				t.Fatalf("after %d runs of 1502 lines the output pane holds %d lines (text nodes), past %d: it never lets go of one "+
					"(and %d lines sent were missed by the page with no note of it: it ignores \"dropped\")", i, n, limit, i*1502-n)
			}
		}
	})

	// A line cut at api.LogLineMax carries its cut byte count
	// ("truncated"); plover logs shows "[N more bytes cut]" and the README
	// says the rest is counted. The page drops the count: a cut line looks
	// whole. (It drops "dropped", the lines a slow reader missed, alike.)
	t.Run("a cut line is marked", func(t *testing.T) {
		open("bigline")
		invoke("bigline", []byte("x"))
		do("the long line arrives", poll(`document.getElementById("logs").textContent.includes("flood done")`))
		text, err := chromedp.Run(browser, chromedp.TextContent(chromedp.CSS("#logs")))
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(text, strings.Repeat("y", 4096)) {
			t.Fatalf("the long line is not there: %.300q", text)
		}
		if !strings.Contains(text, "5904") {
			t.Errorf("a line of 10000 bytes shows as its first 4096 with no mark that 5904 were cut:\n...%.120q", text[strings.LastIndex(text, "y")-20:])
		}
	})

	// plover logs escapes a tenant's bidi overrides (and control and
	// format characters) "since they are a tenant's bytes on an
	// operator's terminal and could rewrite or reorder what it shows"
	// (README). The page shows them raw, and the browser applies them: a
	// function prints "report-\u202egpj.exe" and the operator reads
	// "report-exe.jpg". (U+2028, which the CLI escapes too, Chromium draws
	// as a space: no forged line there.)
	t.Run("output is shown in the order printed", func(t *testing.T) {
		open("talker")
		invoke("talker", []byte("report-\u202egpj.exe"))
		do("the line arrives", poll(`document.getElementById("logs").textContent.includes("gpj.exe")`))
		// The left edges of the printed "g" and of the last "e": in the
		// order printed, the "g" comes first.
		order := evalInt(`(() => {
			const n = [...document.getElementById("logs").childNodes].find((n) => n.data.includes("say: report-"));
			const left = (i) => { const r = document.createRange(); r.setStart(n, i); r.setEnd(n, i + 1); return r.getBoundingClientRect().left; };
			const g = n.data.indexOf("gpj.exe"), e = g + "gpj.exe".length - 1;
			return left(g) < left(e) ? 1 : -1;
		})()`)
		if order != 1 {
			t.Errorf("the function printed %q and the page shows it reversed (%q): a tenant's bidi override reorders what the operator reads", "report-\u202egpj.exe", "report-exe.jpg")
		}
	})

	// The stream ends when the function is deleted (funclog.Forget) or the
	// server drains; the page then neither says so nor follows again: the
	// rest of the page refreshes, the output pane stays silent for good,
	// and the operator reads a function that prints nothing.
	t.Run("output resumes after a redeploy", func(t *testing.T) {
		open("talker")
		invoke("talker", []byte("before the redeploy"))
		do("the first line arrives", poll(`document.getElementById("logs").textContent.includes("say: before the redeploy")`))
		if r := secDo(t, c, "DELETE", fn+"talker", "", "", nil); r.code != 200 {
			t.Fatalf("delete: %d %s", r.code, r.body)
		}
		deploy("talker", "say", 1)
		invoke("talker", []byte("after the redeploy"))
		ctx, cancel := context.WithTimeout(browser, 15*time.Second)
		defer cancel()
		if err := chromedp.Do(ctx, poll(`document.getElementById("logs").textContent.includes("say: after the redeploy") || document.getElementById("logs").textContent.includes("stream ended")`)); err != nil {
			text, _ := chromedp.Run(browser, chromedp.TextContent(chromedp.CSS("#logs")))
			t.Errorf("15 s after a delete and redeploy the page's output pane neither shows the new line nor says its stream ended (%v):\n%s", err, text)
		}
	})
}
