package main_test

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/plover-run/plover/bundle"
	"github.com/plover-run/plover/internal/testkit"
)

// TestServeChecked: plover serve --checked (issue 37, item 1). An overrun
// within a buffer's padding fails its request with 500 kernel_failed
// naming the entry, the buffer and the bytes, and the worker serves the
// next request; one that reaches the guard page is stopped at the write,
// 500 worker_crashed with the same names; a well-behaved function beside
// them answers throughout.
func TestServeChecked(t *testing.T) {
	if testing.Short() {
		t.Skip("builds binaries and starts a server")
	}
	bin := buildPlover(t)
	srv := startIsoServer(t, bin, t.TempDir(), nil, "--checked")
	c := &http.Client{Timeout: 30 * time.Second}
	fn := srv.url + "/v1/functions/"
	for _, f := range []struct {
		name string
		grid int
	}{{"near", 8}, {"far", 300}, {"clean", 0}} {
		dir := t.TempDir()
		m := testkit.OverrunManifest(f.name, f.grid, 4000, 1000)
		if f.grid == 0 {
			m.Chain = m.Chain[:1]
		}
		testkit.BuildLib(t, testkit.OverrunSource(), dir, m.Library, "-std=c++17", "-Wall", "-Wextra")
		testkit.WriteManifest(t, dir, m)
		if r := secDo(t, c, "PUT", fn+f.name, "", bundle.MediaType, packDir(t, dir)); r.code != 201 {
			t.Fatalf("deploy %s: %d %s", f.name, r.code, r.body)
		}
	}
	invoke := func(name string) secResp {
		t.Helper()
		return secDo(t, c, "POST", fn+name+"/invoke", "", "application/octet-stream", []byte(strings.Repeat("x", 100)))
	}
	clean := func() {
		t.Helper()
		if r := invoke("clean"); r.code != 200 || len(r.body) != 4000 || r.body[0] != 'x' || r.body[3999] != 0xEE {
			t.Fatalf("clean: %d, %d bytes", r.code, len(r.body))
		}
	}
	clean()
	for i := 0; i < 2; i++ { // twice: its worker lives on
		r := invoke("near")
		if want := "entry overrun wrote past the end of out (4000 bytes this request): bytes 4000 to 4007 changed"; r.code != 500 ||
			!strings.Contains(string(r.body), "kernel_failed") || !strings.Contains(string(r.body), want) {
			t.Fatalf("near: %d %s, want 500 kernel_failed with %q", r.code, r.body, want)
		}
	}
	r := invoke("far")
	if want := "killed by signal SIGSEGV (segmentation fault): entry overrun wrote past the end of out, at byte 4096 (4000 bytes this request)"; r.code != 500 ||
		!strings.Contains(string(r.body), "worker_crashed") || !strings.Contains(string(r.body), want) {
		t.Fatalf("far: %d %s, want 500 worker_crashed with %q", r.code, r.body, want)
	}
	clean()
	// The far worker's death is logged when it happens; the near one's
	// worker never died.
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(srv.log.String(), `msg="worker died" function=far`) {
		if time.Now().After(deadline) {
			t.Fatalf("no worker died line for far:\n%s", srv.log.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	if strings.Contains(srv.log.String(), `msg="worker died" function=near`) {
		t.Fatalf("near's worker died:\n%s", srv.log.String())
	}
}
