package main_test

import (
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/plover-run/plover/bundle"
	"github.com/plover-run/plover/internal/testkit"
)

// TestWorkerScopeTenantServes: plover serve --worker-scope tenant starts
// with worker processes and serves two tenants' functions; each version
// records the token that deployed it, which plover versions shows.
func TestWorkerScopeTenantServes(t *testing.T) {
	if testing.Short() {
		t.Skip("builds binaries and starts a server")
	}
	bin := buildPlover(t)
	authFile := filepath.Join(t.TempDir(), "tokens")
	toks := writeAuthFile(t, authFile, [][3]string{{"acme", "deploy,invoke", "*"}, {"globex", "deploy,invoke", "*"}})
	srv := startIsoServer(t, bin, t.TempDir(), nil, "--isolation", "process", "--worker-scope", "tenant", "--auth-file", authFile)
	c := &http.Client{Timeout: 30 * time.Second}
	fns := []struct{ name, tenant string }{{"a-one", "acme"}, {"a-two", "acme"}, {"b-one", "globex"}}
	for _, f := range fns {
		dir := testkit.BundleDir(t, testkit.Manifest(f.name), nil)
		if r := secDo(t, c, "PUT", srv.url+"/v1/functions/"+f.name, toks[f.tenant], bundle.MediaType, packDir(t, dir)); r.code != 201 {
			t.Fatalf("deploy %s as %s: %d %s", f.name, f.tenant, r.code, r.body)
		}
	}
	for _, f := range fns {
		r := secDo(t, c, "POST", srv.url+"/v1/functions/"+f.name+"/invoke", toks[f.tenant], "application/octet-stream", []byte(f.name))
		if r.code != 200 || !strings.HasPrefix(r.body, f.name) {
			t.Fatalf("invoke %s: %d %q", f.name, r.code, r.body)
		}
		out := run(t, bin, []string{"PLOVER_SERVER=" + srv.url, "PLOVER_TOKEN=" + toks[f.tenant]}, "versions", f.name)
		if !strings.Contains(out, "TENANT") || !strings.Contains(out, f.tenant) {
			t.Fatalf("plover versions %s does not name tenant %s:\n%s", f.name, f.tenant, out)
		}
	}
	if !strings.Contains(srv.log.String(), "worker_scope=tenant") {
		t.Fatalf("the server log does not say the worker scope:\n%s", srv.log.String())
	}
}
