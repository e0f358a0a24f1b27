package main_test

import (
	"bytes"
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/api"
	"github.com/plover-run/plover/bundle"
	"github.com/plover-run/plover/internal/testkit"
	"github.com/plover-run/plover/samples/cnn/model"
)

// runErr runs plover and returns its combined output and error.
func runErr(bin string, env []string, args ...string) (string, error) {
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// pipelineDir writes a pipeline's bundle directory: plover.json alone.
func pipelineDir(t *testing.T, name string, steps ...any) string {
	t.Helper()
	return testkit.PipelineDir(t, name, steps...)
}

// chainFn is a test-kernels function running chain (echo first: out is
// the input, zero-padded to 256 bytes).
func chainFn(t *testing.T, name string, kernels ...string) string {
	m := testkit.Manifest(name)
	for _, k := range kernels {
		m.Chain = append(m.Chain, abi.Launch{Kernel: k, Grid: 1, Block: 1})
	}
	return testkit.BundleDir(t, m, nil)
}

type pipeResp struct {
	code int
	body []byte
	hdr  http.Header
}

func pipeInvoke(t *testing.T, url, name string, in []byte, hdr ...string) pipeResp {
	t.Helper()
	req, _ := http.NewRequest("POST", url+"/v1/functions/"+name+"/invoke", bytes.NewReader(in))
	req.Header.Set("Content-Type", "application/octet-stream")
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := (&http.Client{Timeout: 30 * time.Second}).Do(req)
	if err != nil {
		t.Fatalf("invoke %s: %v", name, err)
	}
	defer resp.Body.Close()
	var b bytes.Buffer
	b.ReadFrom(resp.Body)
	return pipeResp{resp.StatusCode, b.Bytes(), resp.Header}
}

// ok invokes and fails the test unless it answered 200.
func (r pipeResp) ok(t *testing.T, what string) []byte {
	t.Helper()
	if r.code != 200 {
		t.Fatalf("%s: %d %s", what, r.code, r.body)
	}
	return r.body
}

// TestPipelinesServed runs pipelines through a real plover serve with
// worker processes: composition against separate invocations byte for
// byte (sequence, parallel, nested), pinned versions across a redeploy,
// the deploy refusals, a failing, a timing-out and a crashing step, the
// delete guard, Server-Timing per step and the /v2 route.
func TestPipelinesServed(t *testing.T) {
	if testing.Short() {
		t.Skip("builds binaries and starts a server")
	}
	bin := buildPlover(t)
	srv := startServer(t, bin)
	env := []string{"PLOVER_SERVER=" + srv.url}
	deploy := func(dir string) string { return run(t, bin, env, "deploy", dir, "--json") }
	deployFails := func(dir string) string {
		t.Helper()
		out, err := runErr(bin, env, "deploy", dir)
		if err == nil {
			t.Fatalf("deploy %s succeeded: %s", dir, out)
		}
		return out
	}
	deploy(chainFn(t, "p-echo"))
	deploy(chainFn(t, "p-add", "add_one"))
	deploy(chainFn(t, "p-add2", "add_one", "add_one"))
	in := []byte("pipelines keep their intermediate buffers in the server")

	// Separate invocations from the client, each output sent back as the
	// next input: what a pipeline replaces.
	sep := func(fns ...string) []byte {
		x := in
		for _, f := range fns {
			x = pipeInvoke(t, srv.url, f, x).ok(t, f)
		}
		return x
	}

	t.Run("sequence", func(t *testing.T) {
		deploy(pipelineDir(t, "seq", "p-echo", "p-add", "p-add2"))
		r := pipeInvoke(t, srv.url, "seq", in)
		got := r.ok(t, "seq")
		if want := sep("p-echo", "p-add", "p-add2"); !bytes.Equal(got, want) || got[0] != in[0]+3 {
			t.Fatalf("seq = %q, separate invocations %q", got, want)
		}
		st := r.hdr.Get("Server-Timing")
		for _, w := range []string{`step0;desc="p-echo `, `step1;desc="p-add `, `step2;desc="p-add2 `, "total;dur="} {
			if !strings.Contains(st, w) {
				t.Errorf("Server-Timing %q lacks %q", st, w)
			}
		}
	})
	t.Run("parallel", func(t *testing.T) {
		deploy(pipelineDir(t, "par", "p-echo", map[string]any{"parallel": []string{"p-add", "p-add2"}}))
		got := pipeInvoke(t, srv.url, "par", in).ok(t, "par")
		want := append(sep("p-echo", "p-add"), sep("p-echo", "p-add2")...)
		if !bytes.Equal(got, want) {
			t.Fatalf("par = %q, want %q", got, want)
		}
	})
	t.Run("nested", func(t *testing.T) {
		deploy(pipelineDir(t, "nest", "seq", "p-add"))
		got := pipeInvoke(t, srv.url, "nest", in).ok(t, "nest")
		if want := sep("p-echo", "p-add", "p-add2", "p-add"); !bytes.Equal(got, want) {
			t.Fatalf("nest = %q, want %q", got, want)
		}
	})
	t.Run("pinned version stays pinned across a redeploy", func(t *testing.T) {
		var v1 struct{ Version string }
		json.Unmarshal([]byte(deploy(chainFn(t, "p-var", "add_one"))), &v1)
		deploy(pipelineDir(t, "pinned", "p-echo", map[string]string{"function": "p-var", "version": v1.Version[:8]}))
		deploy(pipelineDir(t, "floating", "p-echo", "p-var"))
		before := pipeInvoke(t, srv.url, "pinned", in).ok(t, "pinned")
		deploy(chainFn(t, "p-var", "add_one", "add_one", "add_one"))
		after := pipeInvoke(t, srv.url, "pinned", in)
		if !bytes.Equal(after.ok(t, "pinned"), before) || before[0] != in[0]+1 {
			t.Fatalf("pinned pipeline changed with a redeploy: %q then %q", before, after.body)
		}
		if st := after.hdr.Get("Server-Timing"); !strings.Contains(st, `p-var `) || !strings.Contains(st, v1.Version[:8]) {
			t.Errorf("Server-Timing %q does not name the pinned version %s", st, v1.Version[:8])
		}
		if got := pipeInvoke(t, srv.url, "floating", in).ok(t, "floating"); got[0] != in[0]+3 {
			t.Fatalf("an unpinned step did not follow the redeploy: %q", got)
		}
	})
	t.Run("deploy refusals", func(t *testing.T) {
		for _, tc := range []struct {
			name string
			dir  string
			want string
		}{
			{"missing function", pipelineDir(t, "bad", "p-echo", "nope"), `steps[1]: function "nope" is not deployed`},
			{"missing version", pipelineDir(t, "bad", map[string]string{"function": "p-echo", "version": "00000000"}), `steps[0]: function p-echo has no version "00000000"`},
			{"cycle", pipelineDir(t, "seq", "p-echo", "nest"), "seq -> nest -> seq is a cycle"},
			{"empty", pipelineDir(t, "bad"), "steps: a pipeline must name at least one step"},
		} {
			if out := deployFails(tc.dir); !strings.Contains(out, tc.want) {
				t.Errorf("%s: %s, want %q", tc.name, out, tc.want)
			}
		}
	})
	t.Run("failing step", func(t *testing.T) {
		deploy(chainFn(t, "p-fail", "fail"))
		deploy(pipelineDir(t, "fails", "p-echo", "p-fail"))
		r := pipeInvoke(t, srv.url, "fails", in)
		if r.code != 500 || !strings.Contains(string(r.body), "kernel_failed") || !strings.Contains(string(r.body), "pipeline fails: step 1 (p-fail)") {
			t.Fatalf("failing step: %d %s", r.code, r.body)
		}
	})
	t.Run("timing-out step", func(t *testing.T) {
		deploy(testkit.BundleDir(t, testkit.Slow("p-slow", 2000), nil))
		deploy(pipelineDir(t, "slowpipe", "p-echo", "p-slow", "p-add"))
		r := pipeInvoke(t, srv.url, "slowpipe", in, "X-Plover-Timeout-Ms", "300")
		if r.code != 504 || !strings.Contains(string(r.body), "step 1 (p-slow)") {
			t.Fatalf("timing-out step: %d %s", r.code, r.body)
		}
	})
	t.Run("crashing step", func(t *testing.T) {
		dir := t.TempDir()
		testkit.BuildLib(t, testkit.HostileSource(), dir, "hostile.so")
		m := testkit.Manifest("p-segv")
		m.Library, m.Chain = "hostile.so", []abi.Launch{{Kernel: "segv", Grid: 1, Block: 1}}
		testkit.WriteManifest(t, dir, m)
		deploy(dir)
		deploy(pipelineDir(t, "crashes", "p-echo", "p-segv"))
		r := pipeInvoke(t, srv.url, "crashes", in)
		if r.code != 500 || !strings.Contains(string(r.body), "worker_crashed") || !strings.Contains(string(r.body), "step 1 (p-segv)") {
			t.Fatalf("crashing step: %d %s", r.code, r.body)
		}
		if got := pipeInvoke(t, srv.url, "seq", in).ok(t, "seq after a crash"); got[0] != in[0]+3 {
			t.Fatalf("seq after a crash: %q", got)
		}
	})
	t.Run("v2 route", func(t *testing.T) {
		body := `{"id": "r1", "inputs": [{"name": "INPUT0", "datatype": "UINT8", "shape": [3], "data": [1, 2, 3]}]}`
		resp, err := http.Post(srv.url+"/v2/models/seq/infer", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var out struct {
			ID      string `json:"id"`
			Outputs []struct {
				Data []int `json:"data"`
			} `json:"outputs"`
		}
		if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || resp.StatusCode != 200 || len(out.Outputs) != 1 {
			t.Fatalf("v2 infer: %d %v %+v", resp.StatusCode, err, out)
		}
		if d := out.Outputs[0].Data; out.ID != "r1" || len(d) != 256 || d[0] != 4 || d[2] != 6 || d[3] != 3 {
			t.Fatalf("v2 infer: id %q, data %v", out.ID, d[:min(8, len(d))])
		}
	})
	t.Run("delete guard", func(t *testing.T) {
		out, err := runErr(bin, env, "rm", "p-add2")
		// nest runs it through seq, its current version's step.
		if err == nil || !strings.Contains(out, "409") || !strings.Contains(out, "pipelines nest, par, seq") {
			t.Fatalf("rm of a function pipelines use: %v %s", err, out)
		}
		run(t, bin, env, "rm", "p-add2", "--force")
		r := pipeInvoke(t, srv.url, "seq", in)
		if r.code != 404 || !strings.Contains(string(r.body), "pipeline seq: step 2 (p-add2)") {
			t.Fatalf("seq without p-add2: %d %s", r.code, r.body)
		}
	})
	t.Run("plover ls", func(t *testing.T) {
		out := run(t, bin, env, "ls", "-o", "wide") // the steps: the short view says "pipeline"
		if !strings.Contains(out, "pipeline: p-echo > p-add > p-add2") || !strings.Contains(out, "host") {
			t.Fatalf("plover ls:\n%s", out)
		}
		var fi api.FunctionInfo
		resp, err := http.Get(srv.url + "/v1/functions/par")
		if err != nil {
			t.Fatal(err)
		}
		json.NewDecoder(resp.Body).Decode(&fi)
		resp.Body.Close()
		if fi.Kind != abi.KindPipeline || len(fi.Steps) != 2 || len(fi.Steps[1].Parallel) != 2 {
			t.Fatalf("show par: %+v", fi)
		}
	})
}

// TestPipelineAuth: deploying a pipeline needs invoke on every function
// it names; invoking it needs invoke on the pipeline only.
func TestPipelineAuth(t *testing.T) {
	if testing.Short() {
		t.Skip("builds binaries and starts a server")
	}
	bin := buildPlover(t)
	authFile := filepath.Join(t.TempDir(), "tokens")
	toks := writeAuthFile(t, authFile, [][3]string{
		{"root", "admin", "*"},
		{"builder", "deploy,invoke", "pipe-*,fn-open"},
		{"app", "invoke", "pipe-*"},
	})
	srv := startIsoServer(t, bin, t.TempDir(), nil, "--auth-file", authFile)
	c := &http.Client{Timeout: 20 * time.Second}
	put := func(tok, name, dir string) secResp {
		return secDo(t, c, "PUT", srv.url+"/v1/functions/"+name, tok, bundle.MediaType, packDir(t, dir))
	}
	for _, n := range []string{"fn-open", "fn-secret"} {
		if r := put(toks["root"], n, chainFn(t, n, "add_one")); r.code != 201 {
			t.Fatalf("deploy %s: %d %s", n, r.code, r.body)
		}
	}
	if r := put(toks["builder"], "pipe-a", pipelineDir(t, "pipe-a", "fn-open", "fn-secret")); r.code != 403 || !strings.Contains(r.body, "steps[1]") || !strings.Contains(r.body, "fn-secret") {
		t.Fatalf("pipeline naming a function its deployer may not invoke: %d %s", r.code, r.body)
	}
	if r := put(toks["builder"], "pipe-b", pipelineDir(t, "pipe-b", "fn-open", "fn-open")); r.code != 201 {
		t.Fatalf("pipeline of invocable functions: %d %s", r.code, r.body)
	}
	// A pipeline root deployed may run fn-secret for app, who may invoke
	// the pipeline but not the function.
	if r := put(toks["root"], "pipe-c", pipelineDir(t, "pipe-c", "fn-secret")); r.code != 201 {
		t.Fatalf("root's pipeline: %d %s", r.code, r.body)
	}
	inv := func(name string) secResp {
		return secDo(t, c, "POST", srv.url+"/v1/functions/"+name+"/invoke", toks["app"], "application/octet-stream", []byte{1})
	}
	if r := inv("pipe-c"); r.code != 200 || r.body[0] != 2 {
		t.Fatalf("app invoking pipe-c: %d %q", r.code, r.body)
	}
	if r := inv("fn-secret"); r.code != 403 {
		t.Fatalf("app invoking fn-secret: %d %s", r.code, r.body)
	}
	// A rollback is checked as a deploy: builder may not bring back a
	// version naming fn-secret (root deploys one, then another).
	var v1 api.FunctionInfo
	r := put(toks["root"], "pipe-d", pipelineDir(t, "pipe-d", "fn-secret"))
	json.Unmarshal([]byte(r.body), &v1)
	put(toks["root"], "pipe-d", pipelineDir(t, "pipe-d", "fn-open"))
	rb := secDo(t, c, "POST", srv.url+"/v1/functions/pipe-d/rollback", toks["builder"], "application/json", []byte(`{"version":"`+v1.Version+`"}`))
	if rb.code != 403 || !strings.Contains(rb.body, "fn-secret") {
		t.Fatalf("builder rolling pipe-d back to a version naming fn-secret: %d %s", rb.code, rb.body)
	}
}

// TestPipelineTwoNodes: two servers on one MinIO bucket; a pipeline
// deployed through one runs on the other.
func TestPipelineTwoNodes(t *testing.T) {
	if testing.Short() {
		t.Skip("builds binaries, starts MinIO and two servers")
	}
	bin := buildPlover(t)
	_, store := minioStore(t, "pipes")
	a := startServer(t, bin, "--store", store, "--poll", "100ms")
	b := startServer(t, bin, "--store", store, "--poll", "100ms")
	envA := []string{"PLOVER_SERVER=" + a.url}
	run(t, bin, envA, "deploy", chainFn(t, "n-add", "add_one"))
	run(t, bin, envA, "deploy", pipelineDir(t, "n-pipe", "n-add", "n-add"))
	in := []byte{10, 20}
	got := pipeInvoke(t, b.url, "n-pipe", in).ok(t, "n-pipe on node b")
	if got[0] != 12 || got[1] != 22 {
		t.Fatalf("node b: %v", got[:2])
	}
	out := run(t, bin, []string{"PLOVER_SERVER=" + b.url}, "ls", "-o", "wide")
	if !strings.Contains(out, "pipeline: n-add > n-add") {
		t.Fatalf("node b's plover ls:\n%s", out)
	}
}

// A deploy straight to the store checks the pipelines that run what it
// deploys as a server does: a nested pipeline deployed again past its
// runner's limit is refused naming that pipeline, unless forced.
func TestDeployToTheStoreChecksThePipelinesRunningIt(t *testing.T) {
	if testing.Short() {
		t.Skip("builds binaries")
	}
	bin := buildPlover(t)
	env := []string{"PLOVER_STORE=file://" + t.TempDir()}
	steps := func(n int, name string) []any {
		out := make([]any, n)
		for i := range out {
			out[i] = name
		}
		return out
	}
	run(t, bin, env, "deploy", chainFn(t, "f"))
	idOf := func(out string) string {
		t.Helper()
		m := regexp.MustCompile(`deployed inner version (\S+)`).FindStringSubmatch(out)
		if m == nil {
			t.Fatalf("no version id in:\n%s", out)
		}
		return m[1]
	}
	narrow := idOf(run(t, bin, env, "deploy", pipelineDir(t, "inner", steps(16, "f")...)))
	run(t, bin, env, "deploy", pipelineDir(t, "outer", steps(16, "inner")...)) // 256 functions
	more := pipelineDir(t, "inner", steps(17, "f")...)
	out, err := runErr(bin, env, "deploy", more)
	if err == nil || !strings.Contains(out, "pipeline outer runs inner") || !strings.Contains(out, "more than 256 functions") {
		t.Fatalf("deploy of inner past outer's limit: %v\n%s", err, out)
	}
	if out := run(t, bin, env, "versions", "inner"); strings.Count(out, "\n") > 2 {
		t.Fatalf("a refused deploy made a version:\n%s", out)
	}
	// Forced, the deploy lands and says which pipeline it breaks (--force
	// also deploys equal bytes again: its user need not know of outer).
	const warned = "warning: deployed with force: pipeline outer runs inner"
	out = run(t, bin, env, "deploy", more, "--force")
	if !strings.Contains(out, warned) {
		t.Errorf("a forced deploy to the store past outer's limit said nothing of outer:\n%s", out)
	}
	wide := idOf(out)
	// A rollback is checked so too, and never refused for them: it lands
	// and says what it breaks.
	const rolled = "warning: rolled back: pipeline outer runs inner"
	rollback := func(env []string) {
		t.Helper()
		if out := run(t, bin, env, "rollback", "inner", narrow); strings.Contains(out, "warning") {
			t.Errorf("a rollback within outer's limit warned:\n%s", out)
		}
		if out := run(t, bin, env, "rollback", "inner", wide); !strings.Contains(out, rolled) {
			t.Errorf("a rollback past outer's limit (%v) said nothing of outer:\n%s", env, out)
		}
	}
	rollback(env)
	srv := startServer(t, bin, "--store", strings.TrimPrefix(env[0], "PLOVER_STORE="))
	served := []string{"PLOVER_SERVER=" + srv.url}
	run(t, bin, served, "deploy", pipelineDir(t, "inner", steps(16, "f")...)) // outer within again
	if out := run(t, bin, served, "deploy", more, "--force"); !strings.Contains(out, warned) {
		t.Errorf("a forced deploy through a server past outer's limit said nothing of outer:\n%s", out)
	}
	rollback(served)
}

// TestDigitsPipelineServed: the digits sample (normalize on the host, the
// CNN, top-1) through a real server, on real held-out MNIST digits: the
// pipeline's answer equals the three functions invoked in turn, byte for
// byte, and the Go reference model's label.
func TestDigitsPipelineServed(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the samples and starts a server")
	}
	bin := buildPlover(t)
	srv := startServer(t, bin)
	deployDigits(t, bin, []string{"PLOVER_SERVER=" + srv.url})
	params, held := cnnReference(t)
	for i := 0; i < len(held); i += 10 {
		d := &held[i]
		got := pipeInvoke(t, srv.url, "digits", d.Pixels[:]).ok(t, "digits")
		x := d.Pixels[:]
		for _, f := range []string{"digits-normalize", "cnn", "digits-top1"} {
			x = pipeInvoke(t, srv.url, f, x).ok(t, f)
		}
		if !bytes.Equal(got, x) || len(got) != 8 {
			t.Fatalf("digit %d: pipeline %x, the functions in turn %x", i, got, x)
		}
		if label, want := int(got[0]), model.Argmax(params.Scores(d.Image())); label != want {
			t.Fatalf("digit %d: label %d, the reference model says %d", i, label, want)
		}
	}
}

// deployDigits builds the digits sample's functions (normalize, the CNN,
// top1) and deploys them and the digits pipeline with plover deploy.
func deployDigits(t *testing.T, bin string, env []string) {
	t.Helper()
	root := testkit.Root()
	sample := func(src, manifest string, extra ...string) string {
		dir := t.TempDir()
		m, err := bundle.ReadManifest(filepath.Join(root, filepath.Dir(manifest)))
		if err != nil {
			t.Fatal(err)
		}
		testkit.BuildLib(t, filepath.Join(root, src), dir, m.Library)
		for _, f := range append([]string{manifest}, extra...) {
			b, err := os.ReadFile(filepath.Join(root, f))
			if err != nil {
				t.Fatal(err)
			}
			os.WriteFile(filepath.Join(dir, filepath.Base(f)), b, 0o644)
		}
		return dir
	}
	for _, dir := range []string{
		sample("samples/digits-pipeline/normalize/normalize.cu", "samples/digits-pipeline/normalize/plover.json"),
		sample("samples/cnn/cnn.cu", "samples/cnn/plover.json", "samples/cnn/weights.bin"),
		sample("samples/digits-pipeline/top1/top1.cu", "samples/digits-pipeline/top1/plover.json"),
		filepath.Join(root, "samples", "digits-pipeline"),
	} {
		run(t, bin, env, "deploy", dir)
	}
}

// A real server holds each pipeline request's outputs in
// --max-pipeline-memory while it runs (plover_pipeline_memory_bytes): a
// request needing the whole budget runs alone; beside it, one needing
// part waits and gets its 504 at its deadline, naming the flag, and one
// needing the whole waits out of the budget's line (in it, it held up every
// later request) and runs once the first has answered; the budget is whole
// again after both.
func TestPipelinesHoldTheirOutputsInTheServersBudget(t *testing.T) {
	if testing.Short() {
		t.Skip("builds binaries and starts a server")
	}
	bin := buildPlover(t)
	srv := startServer(t, bin, "--max-pipeline-memory", "1")
	env := []string{"PLOVER_SERVER=" + srv.url}
	m := testkit.Slow("big-slow", 2000)
	m.OutBytes = 1 << 20 // the whole budget
	run(t, bin, env, "deploy", testkit.BundleDir(t, m, nil))
	run(t, bin, env, "deploy", pipelineDir(t, "held", "big-slow"))
	run(t, bin, env, "deploy", testkit.BundleDir(t, testkit.Manifest("echo"), nil))
	run(t, bin, env, "deploy", pipelineDir(t, "part", "echo"))
	held := func() float64 { return metric(t, srv.url, "plover_pipeline_memory_bytes") }
	if got := held(); got != 0 {
		t.Fatalf("plover_pipeline_memory_bytes %v before any request", got)
	}
	first := make(chan pipeResp, 1)
	go func() { first <- pipeInvoke(t, srv.url, "held", []byte("abcdefgh")) }()
	for end := time.Now().Add(20 * time.Second); held() != 1<<20; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("plover_pipeline_memory_bytes %v while a request needing 1 MiB runs", held())
		}
	}
	r := pipeInvoke(t, srv.url, "part", []byte("abcdefgh"), "X-Plover-Timeout-Ms", "200")
	if r.code != 504 || !strings.Contains(string(r.body), "--max-pipeline-memory") {
		t.Errorf("part, beside a request holding the whole budget: %d %s, want a 504 naming --max-pipeline-memory", r.code, r.body)
	}
	second := pipeInvoke(t, srv.url, "held", []byte("abcdefgh"), "X-Plover-Timeout-Ms", "20000")
	(<-first).ok(t, "the request holding the budget")
	second.ok(t, "a second request needing the whole budget, after the first")
	if got := held(); got != 0 {
		t.Errorf("plover_pipeline_memory_bytes %v after the requests", got)
	}
}
