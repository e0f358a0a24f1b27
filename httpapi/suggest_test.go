package httpapi_test

import (
	"bytes"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/auth"
	"github.com/plover-run/plover/bundle"
	"github.com/plover-run/plover/engine"
	"github.com/plover-run/plover/httpapi"
	"github.com/plover-run/plover/internal/testkit"
)

// A request naming no function is told the one within a typo of it, in the
// server's own message, on /v1 (invoke and the control routes), /v2, and a
// pipeline's deploy naming a step that is not there (422); and only a name
// the caller's token may see: a token limited to a-* that mistypes a-cnn
// is not told of b-cnn, another tenant's.
func TestDidYouMeanServed(t *testing.T) {
	e := testkit.Engine(t, engine.Config{})
	for _, n := range []string{"saxpy", "a-vec", "b-cnn"} {
		testkit.Deploy(t, e, testkit.BundleDir(t, testkit.Manifest(n), nil))
	}
	tab, toks := newTokens(t, tokenSpec{"ops", auth.Admin, nil}, tokenSpec{"tenant-a", auth.Invoke | auth.Deploy, []string{"a-*"}})
	url := testkit.ServeTokens(t, e, tab, httpapi.Options{})
	pipelineBundle := func(name, step string) []byte {
		dir := t.TempDir()
		b, _ := json.Marshal(map[string]any{"name": name, "kind": "pipeline", "steps": []string{step}})
		if err := os.WriteFile(filepath.Join(dir, abi.ManifestFile), b, 0o644); err != nil {
			t.Fatal(err)
		}
		bb, _, _, err := bundle.PackBytes(dir)
		if err != nil {
			t.Fatal(err)
		}
		return bb
	}
	const mean = ` (did you mean "%s"?)`
	for _, tc := range []struct {
		name, token, method, path string
		body                      []byte
		status                    int
		suggest                   string // "": none
	}{
		{"invoke", "ops", "POST", "/v1/functions/saxpi/invoke", []byte("x"), 404, "saxpy"},
		{"describe", "ops", "GET", "/v1/functions/saxpi", nil, 404, "saxpy"},
		{"versions", "ops", "GET", "/v1/functions/saxpi/versions", nil, 404, "saxpy"},
		{"logs", "ops", "GET", "/v1/functions/saxpi/logs", nil, 404, "saxpy"},
		{"delete", "ops", "DELETE", "/v1/functions/saxpi", nil, 404, "saxpy"},
		{"name that cannot be", "ops", "POST", "/v1/functions/Saxpy/invoke", []byte("x"), 404, "saxpy"},
		{"v2 infer", "ops", "POST", "/v2/models/saxpi/infer", []byte(`{"inputs":[]}`), 404, "saxpy"},
		{"v2 metadata", "ops", "GET", "/v2/models/saxpi", nil, 404, "saxpy"},
		{"nothing near", "ops", "POST", "/v1/functions/zzzzzz/invoke", []byte("x"), 404, ""},
		{"pipeline step", "ops", "PUT", "/v1/functions/pipe", pipelineBundle("pipe", "saxpi"), 422, "saxpy"},
		{"tenant's own", "tenant-a", "POST", "/v1/functions/a-vex/invoke", []byte("x"), 404, "a-vec"},
		{"another tenant's", "tenant-a", "POST", "/v1/functions/a-cnn/invoke", []byte("x"), 404, ""},
		{"admin sees all", "ops", "POST", "/v1/functions/a-cnn/invoke", []byte("x"), 404, "b-cnn"},
		{"tenant's step", "tenant-a", "PUT", "/v1/functions/a-pipe", pipelineBundle("a-pipe", "a-vex"), 422, "a-vec"},
		{"another tenant's step", "tenant-a", "PUT", "/v1/functions/a-pipe", pipelineBundle("a-pipe", "a-cnn"), 422, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req, _ := http.NewRequest(tc.method, url+tc.path, bytes.NewReader(tc.body))
			req.Header.Set("Authorization", "Bearer "+toks[tc.token])
			switch {
			case tc.method == "PUT":
				req.Header.Set("Content-Type", bundle.MediaType)
			case strings.HasPrefix(tc.path, "/v2/"):
				req.Header.Set("Content-Type", "application/json")
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			var v1 struct{ Error struct{ Message string } }
			var v2 struct{ Error string }
			var raw bytes.Buffer
			raw.ReadFrom(resp.Body)
			msg := ""
			if json.Unmarshal(raw.Bytes(), &v1) == nil && v1.Error.Message != "" {
				msg = v1.Error.Message
			} else if json.Unmarshal(raw.Bytes(), &v2) == nil {
				msg = v2.Error
			}
			want := ""
			if tc.suggest != "" {
				want = strings.Replace(mean, "%s", tc.suggest, 1)
			}
			if resp.StatusCode != tc.status || (want != "" && !strings.HasSuffix(msg, want)) || (want == "" && strings.Contains(msg, "did you mean")) ||
				strings.Count(msg, "did you mean") > 1 {
				t.Fatalf("%d %q; want %d ending %q", resp.StatusCode, msg, tc.status, want)
			}
		})
	}
}

// A name no function can have (longer than any may be) is refused 404
// quoting its head only, with no did-you-mean and at the cost of a few
// copies of it: not a table of len(name) ints for each function name.
func TestLongFunctionNameRefusedInBoundedMemory(t *testing.T) {
	e := testkit.Engine(t, engine.Config{})
	for _, c := range "abcdefgh" {
		testkit.Deploy(t, e, testkit.BundleDir(t, testkit.Manifest(strings.Repeat(string(c), abi.MaxNameLen)), nil))
	}
	url := testkit.Serve(t, e, httpapi.Options{})
	name := strings.Repeat("a", 3800) // the request line and headers may be 4 KiB
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	resp, body := testkit.Post(t, "POST", url+"/v1/functions/"+name+"/invoke", "application/octet-stream", []byte("x"))
	runtime.ReadMemStats(&after)
	msg := string(body)
	if resp.StatusCode != 404 || !strings.Contains(msg, `\"`+name[:64]+`\"...`) || len(msg) > 512 || strings.Contains(msg, "did you mean") {
		t.Errorf("%d %.300q; want 404 quoting the name's first 64 bytes, no suggestion", resp.StatusCode, msg)
	}
	n := after.TotalAlloc - before.TotalAlloc
	t.Logf("a 3800-byte name: %d KiB allocated", n>>10)
	if n > 2<<20 {
		t.Errorf("a 3800-byte name allocated %d KiB", n>>10)
	}
}
