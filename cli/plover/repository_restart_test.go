package main_test

import (
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/plover-run/plover/internal/testkit"
)

// An unload outlives a restart over the same data directory, and so does
// a plover rm of a model the repository deployed: a restart deployed them
// again (the repository remembered unloads only in memory). A load ends
// the unload, for the next restart too.
func TestModelRepositoryUnloadOutlivesRestart(t *testing.T) {
	if testing.Short() {
		t.Skip("builds binaries and starts servers")
	}
	bin := buildPlover(t)
	models, data := filepath.Join(t.TempDir(), "models"), t.TempDir()
	for _, name := range []string{"cnn", "gone", "kept"} {
		copyBundle(t, testkit.BundleDir(t, testkit.Manifest(name), nil), filepath.Join(models, name, "1"), "")
	}
	old := time.Now().Add(-time.Minute) // at rest: deployed at once
	filepath.Walk(models, func(p string, _ os.FileInfo, err error) error { os.Chtimes(p, old, old); return err })
	start := func() *server {
		srv := startServer(t, bin, "--data", data, "--repository", models, "--repository-settle", "100ms")
		waitReady(t, srv.url)
		return srv
	}
	post := func(srv *server, method, path string) int {
		return secDo(t, http.DefaultClient, method, srv.url+path, "", "", nil).code
	}
	srv := start()
	waitIndex(t, srv.url, "", 0, "cnn/1 READY", "gone/1 READY", "kept/1 READY")
	if c, d := post(srv, "POST", "/v2/repository/models/cnn/unload"), post(srv, "DELETE", "/v1/functions/gone"); c != 200 || d/100 != 2 {
		t.Fatalf("unload cnn: %d; plover rm gone: %d", c, d)
	}
	waitIndex(t, srv.url, "", 0, "cnn/ UNAVAILABLE", "gone/ UNAVAILABLE", "kept/1 READY")
	stop(t, srv)

	srv = start()
	got, reasons := repoIndex(t, srv.url, "")
	if !strings.Contains(got, "cnn/ UNAVAILABLE\n") || !strings.Contains(got, "gone/ UNAVAILABLE\n") || !strings.Contains(got, "kept/1 READY\n") ||
		reasons["cnn/"] != "unloaded" || !strings.Contains(reasons["gone/"], "plover rm") {
		t.Errorf("after a restart, index:\n%s%q; want cnn and gone still unloaded, kept READY", got, reasons)
	}
	for _, name := range []string{"cnn", "gone"} {
		if code := invokeAs(t, srv.url, "", name, make([]byte, 12)).code; code != 404 {
			t.Errorf("after a restart, the unloaded %s answered %d", name, code)
		}
	}
	if c := post(srv, "POST", "/v2/repository/models/cnn/load"); c != 200 {
		t.Fatalf("load cnn: %d", c)
	}
	stop(t, srv)

	srv = start()
	waitIndex(t, srv.url, "", 0, "cnn/1 READY", "gone/ UNAVAILABLE")
}

// stop stops srv as an operator does (SIGINT) and waits for it to exit.
func stop(t *testing.T, srv *server) {
	t.Helper()
	srv.cmd.Process.Signal(os.Interrupt)
	done := make(chan error, 1)
	go func() { done <- srv.wait(10 * time.Second) }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("server exit: %v\n%s", err, srv.log)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("server did not stop on SIGINT")
	}
}
