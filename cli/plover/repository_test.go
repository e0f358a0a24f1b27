package main_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/plover-run/plover/api"
	"github.com/plover-run/plover/fileutil"
	"github.com/plover-run/plover/internal/testkit"
)

// copyBundle copies a bundle directory's files into dir, renaming its
// function when name is not "" (its manifest's name field rewritten).
func copyBundle(t *testing.T, from, dir, name string) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	ents, err := os.ReadDir(from)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if err := fileutil.LinkOrCopy(filepath.Join(from, e.Name()), filepath.Join(dir, e.Name())); err != nil {
			t.Fatal(err)
		}
	}
	if name != "" {
		b, _ := os.ReadFile(filepath.Join(from, "plover.json"))
		var m map[string]any
		if err := json.Unmarshal(b, &m); err != nil {
			t.Fatal(err)
		}
		m["name"] = name
		b, _ = json.Marshal(m)
		os.Remove(filepath.Join(dir, "plover.json")) // a link to the sample's
		if err := os.WriteFile(filepath.Join(dir, "plover.json"), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// repoIndex is the server's repository index as "name/version STATE"
// lines (and the reasons, by name/version).
func repoIndex(t *testing.T, url, token string) (string, map[string]string) {
	t.Helper()
	r := secDo(t, http.DefaultClient, http.MethodPost, url+"/v2/repository/index", token, "application/json", nil)
	if r.code != 200 {
		t.Fatalf("index: %d %s", r.code, r.body)
	}
	var ms []api.RepositoryModel
	if err := json.Unmarshal([]byte(r.body), &ms); err != nil {
		t.Fatalf("index %q: %v", r.body, err)
	}
	var b strings.Builder
	reasons := map[string]string{}
	for _, m := range ms {
		b.WriteString(m.Name + "/" + m.Version + " " + m.State + "\n")
		reasons[m.Name+"/"+m.Version] = m.Reason
	}
	return b.String(), reasons
}

// waitIndex waits until the index has every line of want (never a fixed
// sleep: the server's own pace).
func waitIndex(t *testing.T, url, token string, within time.Duration, want ...string) map[string]string {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		got, reasons := repoIndex(t, url, token)
		ok := true
		for _, w := range want {
			ok = ok && strings.Contains(got, w+"\n")
		}
		if ok {
			return reasons
		}
		if time.Now().After(deadline) {
			t.Fatalf("index within %s lacks %q:\n%s", within, want, got)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// invokeAs posts in to a function's /v1 invoke.
func invokeAs(t *testing.T, url, token, fn string, in []byte) secResp {
	t.Helper()
	return secDo(t, http.DefaultClient, http.MethodPost, url+"/v1/functions/"+fn+"/invoke", token, "application/octet-stream", in)
}

// TestModelRepository serves a repository directory from a real plover
// serve: layouts, a broken bundle beside good ones, polling (a new
// version folder, a removed folder), the repository API with its scopes.
func TestModelRepository(t *testing.T) {
	if testing.Short() {
		t.Skip("builds binaries and starts a server")
	}
	bin := buildPlover(t)
	vecadd, softmax := sampleDir(t, "vecadd-host"), sampleDir(t, "softmax-host")
	in, _ := os.ReadFile(filepath.Join(testkit.Root(), "build", "samples", "vecadd-input.bin"))
	want, _ := os.ReadFile(filepath.Join(testkit.Root(), "build", "samples", "vecadd-expected.bin"))
	dir := t.TempDir()
	models := filepath.Join(dir, "models")
	copyBundle(t, vecadd, filepath.Join(models, "vecadd", "1"), "")
	copyBundle(t, vecadd, filepath.Join(models, "vecadd", "2"), "")
	copyBundle(t, softmax, filepath.Join(models, "softmax"), "")
	copyBundle(t, vecadd, filepath.Join(models, "cnn"), "") // names vecadd
	os.MkdirAll(filepath.Join(models, "broken"), 0o755)
	os.WriteFile(filepath.Join(models, "broken", "plover.json"), []byte(`{"name": "broken"`), 0o644)
	authFile := filepath.Join(dir, "tokens")
	toks := writeAuthFile(t, authFile, [][3]string{{"root", "admin", "*"}, {"dash", "read", "*"}, {"ops", "deploy", "*"}})
	poll := 300 * time.Millisecond
	srv := startServer(t, bin, "--auth-file", authFile, "--repository", models,
		"--repository-poll", poll.String(), "--repository-settle", poll.String())
	root, read := toks["root"], toks["dash"]

	reasons := waitIndex(t, srv.url, read, 20*time.Second, "vecadd/1 READY", "vecadd/2 READY", "softmax/1 READY", "cnn/1 UNAVAILABLE", "broken/1 UNAVAILABLE")
	if r := reasons["cnn/1"]; r != `models/cnn: plover.json names "vecadd"` {
		t.Errorf("cnn's reason: %q", r)
	}
	if r := reasons["broken/1"]; !strings.HasPrefix(r, "models/broken: ") || !strings.Contains(r, "plover.json") {
		t.Errorf("broken's reason: %q", r)
	}
	if r := invokeAs(t, srv.url, root, "vecadd", in); r.code != 200 || r.body != string(want) {
		t.Fatalf("vecadd from the repository: %d (%d bytes, want %d)", r.code, len(r.body), len(want))
	}
	// {"ready": true} lists only ready versions.
	r := secDo(t, http.DefaultClient, http.MethodPost, srv.url+"/v2/repository/index", read, "application/json", []byte(`{"ready": true}`))
	if r.code != 200 || strings.Contains(r.body, "UNAVAILABLE") || !strings.Contains(r.body, `"softmax"`) {
		t.Errorf("index of the ready ones: %d %s", r.code, r.body)
	}

	// Scopes: the index needs read; load and unload admin.
	for _, c := range []struct {
		path, token string
		code        int
	}{
		{"/v2/repository/index", "", 401},
		{"/v2/repository/models/vecadd/load", read, 403},
		{"/v2/repository/models/vecadd/unload", toks["ops"], 403},
		{"/v2/repository/models/nope/load", root, 404},
		{"/v2/repository/models/broken/load", root, 400},
	} {
		if r := secDo(t, http.DefaultClient, http.MethodPost, srv.url+c.path, c.token, "", nil); r.code != c.code {
			t.Errorf("POST %s: %d %s, want %d", c.path, r.code, r.body, c.code)
		}
	}

	// Unload stops serving it, through polls, until a load.
	if r := secDo(t, http.DefaultClient, http.MethodPost, srv.url+"/v2/repository/models/vecadd/unload", root, "", nil); r.code != 200 {
		t.Fatalf("unload: %d %s", r.code, r.body)
	}
	if r := invokeAs(t, srv.url, root, "vecadd", in); r.code != 404 {
		t.Fatalf("an unloaded model answered %d", r.code)
	}
	time.Sleep(3 * poll) // polls that must not bring it back
	waitIndex(t, srv.url, read, 0, "vecadd/ UNAVAILABLE")
	if r := secDo(t, http.DefaultClient, http.MethodPost, srv.url+"/v2/repository/models/vecadd/load", root, "", nil); r.code != 200 {
		t.Fatalf("load: %d %s", r.code, r.body)
	}
	if r := invokeAs(t, srv.url, root, "vecadd", in); r.code != 200 {
		t.Fatalf("vecadd after its load: %d %s", r.code, r.body)
	}

	// A new version folder becomes current within two polls (and the
	// settle time); a removed folder's function goes.
	copyBundle(t, vecadd, filepath.Join(models, "vecadd", "3"), "")
	os.RemoveAll(filepath.Join(models, "softmax"))
	waitIndex(t, srv.url, read, 10*time.Second, "vecadd/3 READY")
	var rec api.Record
	if r := secDo(t, http.DefaultClient, http.MethodGet, srv.url+"/v1/functions/vecadd/versions", read, "", nil); r.code != 200 || json.Unmarshal([]byte(r.body), &rec) != nil {
		t.Fatalf("versions: %d %s", r.code, r.body)
	}
	if cur, _ := rec.Find(rec.Current); cur.Label != "3" {
		t.Errorf("current version %s has label %q, want 3", rec.Current, cur.Label)
	}
	// /v2 runs the version a path names by its folder (or id), current
	// or not; metadata and ready answer for it.
	v1, _ := rec.Find("1")
	hdr := fmt.Sprintf(`{"inputs":[{"name":"INPUT0","datatype":"UINT8","shape":[%d],"parameters":{"binary_data_size":%d}}],"outputs":[{"name":"OUTPUT0","parameters":{"binary_data":true}}]}`, len(in), len(in))
	for _, ref := range []string{"1", v1.ID} {
		req, _ := http.NewRequest(http.MethodPost, srv.url+"/v2/models/vecadd/versions/"+ref+"/infer", bytes.NewReader(append([]byte(hdr), in...)))
		req.Header.Set("Authorization", "Bearer "+root)
		req.Header.Set("Inference-Header-Content-Length", fmt.Sprint(len(hdr)))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || resp.Header.Get("X-Plover-Version") != v1.ID || !bytes.HasSuffix(body, want) {
			t.Errorf("v2 infer of version %s: %d, ran %q (want %s)", ref, resp.StatusCode, resp.Header.Get("X-Plover-Version"), v1.ID)
		}
	}
	for ref, code := range map[string]int{"1": 200, "1/ready": 200, "3": 200, "9": 404, "9/ready": 404} {
		if r := secDo(t, http.DefaultClient, http.MethodGet, srv.url+"/v2/models/vecadd/versions/"+ref, read, "", nil); r.code != code {
			t.Errorf("GET versions/%s: %d %s, want %d", ref, r.code, r.body, code)
		}
	}

	deadline := time.Now().Add(10 * time.Second)
	for invokeAs(t, srv.url, root, "softmax", make([]byte, 1024)).code != 404 {
		if time.Now().After(deadline) {
			t.Fatal("softmax still answers 10 s after its folder was removed")
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestModelRepositoryOneBundle: --repository naming one bundle directory
// (KServe's /mnt/models), served under its manifest's name or
// --repository-name.
func TestModelRepositoryOneBundle(t *testing.T) {
	if testing.Short() {
		t.Skip("builds binaries and starts servers")
	}
	bin := buildPlover(t)
	vecadd := sampleDir(t, "vecadd-host")
	in, _ := os.ReadFile(filepath.Join(testkit.Root(), "build", "samples", "vecadd-input.bin"))
	for _, c := range []struct{ as, name string }{{"", "vecadd"}, {"sum", "sum"}} {
		mnt := filepath.Join(t.TempDir(), "models")
		copyBundle(t, vecadd, mnt, "")
		args := []string{"--repository", mnt}
		if c.as != "" {
			args = append(args, "--repository-name", c.as)
		}
		srv := startServer(t, bin, args...)
		waitIndex(t, srv.url, "", 20*time.Second, c.name+"/1 READY")
		if r := invokeAs(t, srv.url, "", c.name, in); r.code != 200 || !bytes.Equal([]byte(r.body)[:16], mustRead(t, "vecadd-expected.bin")[:16]) {
			t.Fatalf("%s: %d", c.name, r.code)
		}
	}
}

func mustRead(t *testing.T, sample string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(testkit.Root(), "build", "samples", sample))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestModelRepositoryPipeline: a pipeline in a repository is deployed
// after the functions its steps name, one of them pinned to a version
// folder by its number, and runs that version while another is current.
func TestModelRepositoryPipeline(t *testing.T) {
	if testing.Short() {
		t.Skip("builds binaries and starts a server")
	}
	bin := buildPlover(t)
	models := filepath.Join(t.TempDir(), "models")
	copyBundle(t, sampleDir(t, "digits-normalize-host"), filepath.Join(models, "digits-normalize"), "")
	copyBundle(t, sampleDir(t, "digits-top1-host"), filepath.Join(models, "digits-top1"), "")
	copyBundle(t, sampleDir(t, "cnn-host"), filepath.Join(models, "cnn", "1"), "")
	copyBundle(t, sampleDir(t, "cnn-host"), filepath.Join(models, "cnn", "2"), "")
	// "a-digits" sorts first: only the functions-first order deploys it.
	os.MkdirAll(filepath.Join(models, "a-digits"), 0o755)
	os.WriteFile(filepath.Join(models, "a-digits", "plover.json"),
		[]byte(`{"name": "a-digits", "kind": "pipeline", "steps": ["digits-normalize", {"function": "cnn", "version": "1"}, "digits-top1"]}`), 0o644)
	srv := startServer(t, bin, "--repository", models)
	waitIndex(t, srv.url, "", 20*time.Second, "a-digits/1 READY", "cnn/1 READY", "cnn/2 READY")
	var rec api.Record
	if r := secDo(t, http.DefaultClient, http.MethodGet, srv.url+"/v1/functions/cnn/versions", "", "", nil); r.code != 200 || json.Unmarshal([]byte(r.body), &rec) != nil {
		t.Fatalf("cnn's versions: %d %s", r.code, r.body)
	}
	v1, _ := rec.Find("1")
	r := invokeAs(t, srv.url, "", "a-digits", make([]byte, 784))
	// Its step's timing names the version that ran: folder 1's.
	if r.code != 200 || !strings.Contains(r.hdr.Get("Server-Timing"), v1.ID[:8]) {
		t.Fatalf("the pipeline: %d %s (Server-Timing %q)", r.code, r.body, r.hdr.Get("Server-Timing"))
	}
	if cur, _ := rec.Find(rec.Current); cur.Label != "2" || v1.ID == rec.Current {
		t.Fatalf("cnn's current version is %+v", cur)
	}
}

// TestModelRepositoryReadiness: a server over a repository says ready
// (/readyz) only once the folders it found at start are deployed, so that
// a balancer or KServe sends nothing for a model still being copied or
// deployed; it answers meanwhile. A flag that would be ignored is refused.
func TestModelRepositoryReadiness(t *testing.T) {
	if testing.Short() {
		t.Skip("builds binaries and starts a server")
	}
	bin := buildPlover(t)
	models := filepath.Join(t.TempDir(), "models")
	copyBundle(t, sampleDir(t, "vecadd-host"), filepath.Join(models, "vecadd", "1"), "")
	now := time.Now()
	filepath.Walk(models, func(p string, _ os.FileInfo, err error) error { // a copy just made: it settles first
		if err == nil {
			os.Chtimes(p, now, now)
		}
		return err
	})
	srv := startServer(t, bin, "--repository", models, "--repository-settle", "1s")
	if r := secDo(t, http.DefaultClient, "GET", srv.url+"/readyz", "", "", nil); r.code != 503 {
		t.Fatalf("readyz while the repository's only folder settles: %d %s", r.code, r.body)
	}
	deadline := time.Now().Add(30 * time.Second)
	for secDo(t, http.DefaultClient, "GET", srv.url+"/readyz", "", "", nil).code != 200 {
		if time.Now().After(deadline) {
			t.Fatal("not ready 30 s after start")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if got, _ := repoIndex(t, srv.url, ""); !strings.Contains(got, "vecadd/1 READY") {
		t.Fatalf("ready before the repository was deployed: index %q", got)
	}

	for _, args := range [][]string{
		{"--repository-poll", "5s"},
		{"--repository", models, "--repository-poll", "-1s"},
		{"--repository", models, "--repository-settle", "0s"},
	} {
		out, err := exec.Command(bin, append([]string{"serve", "--listen", "127.0.0.1:0", "--data", t.TempDir(), "--device", "host"}, args...)...).CombinedOutput()
		if err == nil || !strings.Contains(string(out), args[len(args)-2]) {
			t.Errorf("plover serve %v: %v, %s; want a refusal naming %s", args, err, out, args[len(args)-2])
		}
	}
}
