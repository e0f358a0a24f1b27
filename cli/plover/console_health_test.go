package main_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/chromedp/cdproto/fetch"
	"github.com/chromedp/chromedp"

	"github.com/plover-run/plover/bundle"
)

// TestConsoleShowsAnUnhealthyNode: a device fault makes /healthz answer
// 503 with its usual body, the device's error in it. The overview shows
// the node unhealthy, with the error, and its scheduler flows go on being
// drawn; before, the page took the 503 for a failed read: it kept the
// last "status: ok" it drew and never drew the flows again. The browser
// answers /healthz itself (Fetch interception): the host device has no
// fault to give.
func TestConsoleShowsAnUnhealthyNode(t *testing.T) {
	if testing.Short() {
		t.Skip("builds binaries, starts a server and a browser")
	}
	b := startBrowser(t)
	bin := buildPlover(t)
	srv := startIsoServer(t, bin, t.TempDir(), nil)
	talker, _ := outputBundle(t, "talker", "say", 1, 1)
	c := &http.Client{Timeout: 60 * time.Second}
	if r := secDo(t, c, "PUT", srv.url+"/v1/functions/talker", "", bundle.MediaType, packDir(t, talker)); r.code != 201 {
		t.Fatalf("deploy talker: %d %s", r.code, r.body)
	}
	sick := []byte(`{"status":"unhealthy","devices":[{"device":"gpu0","healthy":false,"error":"CUDA_ERROR_ILLEGAL_ADDRESS (sticky: restart the server)"}]}`)
	paused := chromedp.Events(b.ctx, fetch.RequestPaused)
	go func() {
		for ev, err := range paused {
			if err != nil {
				return
			}
			chromedp.Call(b.ctx, fetch.FulfillRequest, fetch.FulfillRequestParams{RequestID: ev.RequestID, ResponseCode: 503,
				ResponseHeaders: []*fetch.HeaderEntry{{Name: "Content-Type", Value: "application/json"}}, Body: sick})
		}
	}()
	if _, err := chromedp.Call(b.ctx, fetch.Enable, fetch.EnableParams{Patterns: []*fetch.RequestPattern{{URLPattern: "*/healthz"}}}); err != nil {
		t.Fatal(err)
	}
	b.do(30*time.Second, "the overview of a node whose device failed",
		chromedp.Navigate(srv.url+"/ui/#/"),
		poll(`document.getElementById("health").textContent.includes("status: unhealthy") && document.getElementById("health").textContent.includes("CUDA_ERROR_ILLEGAL_ADDRESS")`),
		poll(`document.querySelector('#health-status.error') !== null && document.querySelector('tr[data-flow="talker"]') !== null`))
	if st := b.text("#status"); st != "" {
		t.Errorf("the status line says %q: an unhealthy node read as a failed read", st)
	}
}
