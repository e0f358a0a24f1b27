package main_test

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

// TestConsoleOutputPane: a function's output on its console page, in a
// real headless Chromium against a real `plover serve`, for functions that
// print much, long or deceptive lines: the pane keeps a bounded number of
// lines, marks a line the server cut, shows a tenant's bidi and control
// characters escaped as `plover logs` does, and says when its stream ends
// and follows again.
func TestConsoleOutputPane(t *testing.T) {
	if testing.Short() {
		t.Skip("builds binaries, starts a server and a browser")
	}
	b := startBrowser(t)
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
		if r := secDo(t, c, "PUT", fn+name, "", bundle.MediaType, packDir(t, dirs[name])); r.code != 201 {
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

	open := func(name string) {
		t.Helper()
		b.do(60*time.Second, "open "+name+"'s page", chromedp.Navigate("about:blank"), // a fresh page, not a same-document hop
			chromedp.Navigate(srv.url+"/ui/#/functions/"+name),
			chromedp.WaitVisible(chromedp.CSS(`#versions tr.current`)))
	}
	const logs = `document.getElementById("logs")`

	// The server keeps a function's last RingLines lines; the page keeps
	// twice that, one text node each, however long the function prints
	// (it kept every line it was ever sent, and scrolled, a layout, per
	// line: a function printing for an hour filled the tab's memory).
	t.Run("output pane is bounded", func(t *testing.T) {
		open("flood")
		limit := 2 * funclog.RingLines
		for i := 1; i <= 8; i++ {
			evaluate[bool](b, `(window.lastSeen = `+logs+`.lastChild, true)`)
			invoke("flood", []byte("x"))
			// This run's last line is a new last node (unless a slow
			// page missed it: then the next runs add more, and say so).
			ctx, cancel := context.WithTimeout(b.ctx, 8*time.Second)
			chromedp.Do(ctx, poll(logs+`.lastChild !== window.lastSeen && `+logs+`.lastChild.data.includes("flood done")`))
			cancel()
			if n := evaluate[int](b, logs+`.childNodes.length`); n > limit {
				t.Fatalf("after %d runs of 1502 lines the output pane holds %d lines (text nodes), past %d", i, n, limit)
			}
		}
		if n := evaluate[int](b, logs+`.childNodes.length`); n < limit {
			t.Errorf("after 8 runs of 1502 lines the output pane holds %d lines, want the last %d", n, limit)
		}
	})

	// A reader scrolled up to read keeps what is read where it was while
	// lines come and older ones are dropped above it (the pane scrolled to
	// its end on every batch); one at the end stays at the end.
	t.Run("a reader scrolled up keeps their place", func(t *testing.T) {
		open("flood")
		// A full pane, so that each batch drops lines above the reader. A
		// run's lines may not all come (a page that reads slowly misses
		// some): runs until it is full.
		limit := 2 * funclog.RingLines
		for i := 0; evaluate[int](b, logs+`.childNodes.length`) < limit; i++ {
			if i == 8 {
				t.Fatalf("after 8 runs of 1502 lines the pane holds %d, not %d", evaluate[int](b, logs+`.childNodes.length`), limit)
			}
			invoke("flood", []byte("x"))
			ctx, cancel := context.WithTimeout(b.ctx, 8*time.Second)
			chromedp.Do(ctx, poll(logs+`.childNodes.length >= `+strconv.Itoa(limit)))
			cancel()
		}
		// The line at the top of the pane's view, a little above its end,
		// and how far below the pane's top it shows.
		evaluate[bool](b, `(() => {
			const pre = `+logs+`;
			window.topOf = (n) => { const r = document.createRange(); r.selectNodeContents(n); return r.getBoundingClientRect().top - pre.getBoundingClientRect().top; };
			pre.scrollTop = pre.scrollHeight - pre.clientHeight - 300;
			window.reading = [...pre.childNodes].find((n) => topOf(n) >= 0);
			window.readingAt = topOf(window.reading);
			window.lastSeen = pre.lastChild;
			return true;
		})()`)
		invoke("flood", []byte("x"))
		b.do(30*time.Second, "the run's lines", poll(logs+`.lastChild !== window.lastSeen`))
		if moved := evaluate[float64](b, `window.reading.isConnected ? topOf(window.reading) - window.readingAt : 1e9`); moved < -2 || moved > 2 {
			t.Errorf("the line read moved %v px while lines came and older ones were dropped (1e9: dropped itself)", moved)
		}
		evaluate[bool](b, `(`+logs+`.scrollTop = `+logs+`.scrollHeight, window.lastSeen = `+logs+`.lastChild, true)`)
		invoke("flood", []byte("x"))
		b.do(30*time.Second, "the next run's lines", poll(logs+`.lastChild !== window.lastSeen`))
		if below := evaluate[float64](b, logs+`.scrollHeight - `+logs+`.scrollTop - `+logs+`.clientHeight`); below > 8 {
			t.Errorf("a reader at the end of the pane was left %v px above it when lines came", below)
		}
	})

	// A line cut at api.LogLineMax carries its cut byte count
	// ("truncated"): the page shows it as plover logs does.
	t.Run("a cut line is marked", func(t *testing.T) {
		open("bigline")
		invoke("bigline", []byte("x"))
		b.do(60*time.Second, "the long line arrives", poll(logs+`.textContent.includes("flood done")`))
		text := b.text("#logs")
		if !strings.Contains(text, strings.Repeat("y", 4096)+" [5904 more bytes cut]") {
			t.Errorf("a line of 10000 bytes shows as its first 4096 with no mark that 5904 were cut:\n...%.120q", text[strings.LastIndex(text, "y")-20:])
		}
	})

	// plover logs escapes a tenant's bidi overrides, control and format
	// characters (README); the page does alike: a function printing
	// "report-\u202egpj.exe" must not be read as "report-exe.jpg".
	t.Run("output is shown in the order printed", func(t *testing.T) {
		open("talker")
		invoke("talker", []byte("report-\u202egpj.exe\x1b[2J"))
		b.do(60*time.Second, "the line arrives", poll(logs+`.textContent.includes("gpj.exe")`))
		if text := b.text("#logs"); !strings.Contains(text, `say: report-\u202egpj.exe\x1b[2J`) {
			t.Errorf("the line is not shown escaped as plover logs shows it:\n%q", text)
		}
		// The left edges of the printed "g" and of the last "e": in the
		// order printed, the "g" comes first.
		order := evaluate[int](b, `(() => {
			const n = [...`+logs+`.childNodes].find((n) => n.data.includes("say: report-"));
			const left = (i) => { const r = document.createRange(); r.setStart(n, i); r.setEnd(n, i + 1); return r.getBoundingClientRect().left; };
			const g = n.data.indexOf("gpj.exe"), e = g + "gpj.exe".length - 1;
			return left(g) < left(e) ? 1 : -1;
		})()`)
		if order != 1 {
			t.Errorf("the function printed %q and the page shows it reversed (%q): a tenant's bidi override reorders what the operator reads", "report-\u202egpj.exe", "report-exe.jpg")
		}
	})

	// The stream ends when the function is deleted (funclog.Forget) or the
	// server drains: the page says so and follows again, from the last
	// line it showed, and so shows what the function deployed again under
	// the name prints.
	t.Run("output resumes after a redeploy", func(t *testing.T) {
		open("talker")
		invoke("talker", []byte("before the redeploy"))
		b.do(60*time.Second, "the first line arrives", poll(logs+`.textContent.includes("say: before the redeploy")`))
		if r := secDo(t, c, "DELETE", fn+"talker", "", "", nil); r.code != 200 {
			t.Fatalf("delete: %d %s", r.code, r.body)
		}
		b.do(15*time.Second, "the page saying its stream ended", poll(logs+`.textContent.includes("[output stream ended]")`))
		// Its summary and versions are gone, said so, and come back with it.
		b.do(15*time.Second, "the page saying the function is gone",
			poll(`document.getElementById("summary").textContent.includes("function talker not found (deleted?)") && document.querySelector("#versions tr") === null`))
		deploy("talker", "say", 1)
		b.do(15*time.Second, "the page showing it again", chromedp.WaitVisible(chromedp.CSS(`#versions tr.current`)))
		invoke("talker", []byte("after the redeploy"))
		b.do(45*time.Second, "the redeployed function's line", poll(logs+`.textContent.includes("say: after the redeploy")`))
		if n := strings.Count(b.text("#logs"), "say: before the redeploy"); n != 1 {
			t.Errorf("the line before the redeploy is shown %d times, want once", n)
		}
	})
}
