package main_test

import (
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/plover-run/plover/bundle"
	"github.com/plover-run/plover/internal/testkit"
)

// TestConsoleGlobLimitedToken: the console signed in with a read token of
// functions talk*, on a node that serves another tenant's function too.
// Its overview lists talker with its latency (from /metrics, cut to the
// token's series) and the node's health with each device's memory (a
// node-wide series), and not other; talker's page draws its latency
// chart; its pipelines page shows talk-pipe, which runs talker and then
// other, with its second step unnamed. Nothing it asks for fails. plover ls with the token lists talker
// alone.
func TestConsoleGlobLimitedToken(t *testing.T) {
	if testing.Short() {
		t.Skip("builds binaries, starts a server and a browser")
	}
	b := startBrowser(t)
	bin := buildPlover(t)
	authFile := filepath.Join(t.TempDir(), "tokens")
	toks := writeAuthFile(t, authFile, [][3]string{{"root", "admin", "*"}, {"tenant", "read", "talk*"}})
	srv := startIsoServer(t, bin, t.TempDir(), nil, "--auth-file", authFile)
	c := &http.Client{Timeout: 60 * time.Second}
	for _, name := range []string{"talker", "other"} {
		dir, _ := outputBundle(t, name, "say", 1, 1)
		if r := secDo(t, c, "PUT", srv.url+"/v1/functions/"+name, toks["root"], bundle.MediaType, packDir(t, dir)); r.code != 201 {
			t.Fatalf("deploy %s: %d %s", name, r.code, r.body)
		}
		if r := secDo(t, c, "POST", srv.url+"/v1/functions/"+name+"/invoke", toks["root"], "application/octet-stream", []byte("hi")); r.code != 200 {
			t.Fatalf("invoke %s: %d %.200s", name, r.code, r.body)
		}
	}
	// talk-pipe runs talker, then other: offered to the tenant by the
	// admin, its second step shown in its place, unnamed.
	if r := secDo(t, c, "PUT", srv.url+"/v1/functions/talk-pipe", toks["root"], bundle.MediaType, packDir(t, testkit.PipelineDir(t, "talk-pipe", "talker", "other"))); r.code != 201 {
		t.Fatalf("deploy talk-pipe: %d %s", r.code, r.body)
	}
	if r := secDo(t, c, "POST", srv.url+"/v1/functions/talk-pipe/invoke", toks["root"], "application/octet-stream", []byte("hi")); r.code != 200 {
		t.Fatalf("invoke talk-pipe: %d %.200s", r.code, r.body)
	}
	env := []string{"PLOVER_SERVER=" + srv.url, "PLOVER_TOKEN=" + toks["tenant"]}
	if out := run(t, bin, env, "ls"); !strings.Contains(out, "talker") || strings.Contains(out, "other") {
		t.Errorf("plover ls as the tenant:\n%s\nwant talker and not other", out)
	}
	b.do(30*time.Second, "talker's page as the tenant",
		chromedp.Navigate(srv.url+"/ui/#/functions/talker?token="+toks["tenant"]),
		chromedp.WaitVisible(chromedp.CSS(`#versions tr.current`)),
		poll(`/last ([2-9]|[1-9][0-9]+) samples/.test(document.getElementById("chart").getAttribute("aria-label"))`))
	if st := b.text("#status"); st != "" {
		t.Errorf("talker's page: the status line says %q, want nothing", st)
	}
	b.do(30*time.Second, "the overview as the tenant",
		chromedp.Navigate(srv.url+"/ui/#/"),
		chromedp.WaitVisible(chromedp.CSS(`tr[data-function="talker"]`)),
		poll(`document.querySelector('tr[data-function="talker"] td.p50').textContent !== "–"`),
		poll(`document.getElementById("health").textContent.includes("status: ok") && document.getElementById("health").textContent.includes("mem_total_bytes")`))
	if evaluate[bool](b, `document.querySelector('[data-function="other"], [data-flow="other"]') !== null`) {
		t.Error("the overview shows other, another tenant's function")
	}
	if st := b.text("#status"); st != "" {
		t.Errorf("the overview's status line says %q, want nothing", st)
	}
	b.do(30*time.Second, "the pipelines page as the tenant",
		chromedp.Navigate(srv.url+"/ui/#/pipelines"),
		poll(`document.querySelector('section[data-pipeline="talk-pipe"] tr[data-step="0"] td.runs') !== null && document.querySelector('section[data-pipeline="talk-pipe"] tr[data-step="0"] td.runs').textContent === "1"`))
	if steps := b.text(`section[data-pipeline="talk-pipe"] tbody`); strings.Contains(steps, "other") || !strings.Contains(steps, "talker") ||
		b.text(`section[data-pipeline="talk-pipe"] tr[data-step="1"] td:nth-child(2)`) != "–" {
		t.Errorf("talk-pipe's steps as the tenant: %q, want talker and step 2 unnamed (–)", steps)
	}
	if st := b.text("#status"); st != "" {
		t.Errorf("the pipelines page's status line says %q, want nothing", st)
	}
}
