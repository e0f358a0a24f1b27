package httpapi_test

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/auth"
	"github.com/plover-run/plover/engine"
	"github.com/plover-run/plover/httpapi"
	"github.com/plover-run/plover/internal/testkit"
)

// A pipeline's answer names to its caller only the steps whose functions
// its token may use: a-pipe runs a-vec then b-secret (another tenant's,
// offered through the pipeline), and a token limited to a-* reads b-secret's
// step by its place and time alone, in Server-Timing and in the JSON
// answer; an admin token reads both. Before, the answer named b-secret,
// its version and whether it ran cold (a review's probe).
func TestAPipelinesAnswerNamesOnlyStepsItsCallerSees(t *testing.T) {
	e := testkit.Engine(t, engine.Config{})
	for _, n := range []string{"a-vec", "b-secret"} {
		testkit.Deploy(t, e, testkit.BundleDir(t, testkit.Manifest(n), nil))
	}
	testkit.Deploy(t, e, testkit.PipelineDir(t, "a-pipe", "a-vec", "b-secret"))
	failing := testkit.Manifest("b-fails")
	failing.Chain = []abi.Launch{{Kernel: "fail", Grid: 1, Block: 1}}
	testkit.Deploy(t, e, testkit.BundleDir(t, failing, nil))
	testkit.Deploy(t, e, testkit.PipelineDir(t, "a-failing", "a-vec", "b-fails"))
	small := testkit.Manifest("b-small")
	small.MaxInputBytes = 4
	testkit.Deploy(t, e, testkit.BundleDir(t, small, nil))
	testkit.Deploy(t, e, testkit.PipelineDir(t, "a-front", "b-small", "a-vec"))
	tab, toks := newTokens(t, tokenSpec{"ops", auth.Admin, nil}, tokenSpec{"tenant-a", auth.Invoke, []string{"a-*"}})
	url := testkit.ServeTokens(t, e, tab, httpapi.Options{})
	// An input over a hidden first step's max_input_bytes: the 413 and
	// its bound, not the step's name.
	for _, tc := range []struct {
		token, path, contentType, body string
		secret                         bool
	}{
		{"tenant-a", "/v1/functions/a-front/invoke", "application/octet-stream", "abcdefgh", false},
		{"tenant-a", "/v2/models/a-front/infer", "application/json", `{"inputs":[{"name":"INPUT0","datatype":"UINT8","shape":[8],"data":[1,2,3,4,5,6,7,8]}]}`, false},
		{"ops", "/v1/functions/a-front/invoke", "application/octet-stream", "abcdefgh", true},
		{"ops", "/v2/models/a-front/infer", "application/json", `{"inputs":[{"name":"INPUT0","datatype":"UINT8","shape":[8],"data":[1,2,3,4,5,6,7,8]}]}`, true},
	} {
		code, out := postAs(t, url+tc.path, toks[tc.token], tc.contentType, tc.body)
		if code != 413 {
			t.Errorf("%s %s: %d %s, want 413", tc.token, tc.path, code, out)
		}
		named := strings.Contains(string(out), "b-small")
		if named != tc.secret || !strings.Contains(string(out), "step 0") || !strings.Contains(string(out), "max_input_bytes") {
			t.Errorf("%s %s: %s: names the step %v, want %v, and says step 0's max_input_bytes", tc.token, tc.path, out, named, tc.secret)
		}
	}
	// A hidden step's failure: its status, not its name nor its
	// function's words.
	for _, tc := range []struct {
		token, path string
		secret      bool
	}{
		{"tenant-a", "/v1/functions/a-failing/invoke", false},
		{"tenant-a", "/v2/models/a-failing/infer", false},
		{"ops", "/v1/functions/a-failing/invoke", true},
	} {
		body := "abcdefgh"
		if strings.HasPrefix(tc.path, "/v2") {
			body = `{"inputs":[{"name":"INPUT0","datatype":"UINT8","shape":[8],"data":[1,2,3,4,5,6,7,8]}]}`
		}
		contentType := "application/octet-stream"
		if strings.HasPrefix(tc.path, "/v2") {
			contentType = "application/json"
		}
		code, out := postAs(t, url+tc.path, toks[tc.token], contentType, body)
		if code != 500 {
			t.Errorf("%s %s: %d %s, want the step's 500", tc.token, tc.path, code, out)
		}
		named := strings.Contains(string(out), "b-fails") || strings.Contains(string(out), "asked to fail")
		if named != tc.secret || !strings.Contains(string(out), "step 1") {
			t.Errorf("%s %s: %s: names the step or its error %v, want %v, and says step 1", tc.token, tc.path, out, named, tc.secret)
		}
	}
	for _, tc := range []struct {
		token, contentType, body string
		secret                   bool
	}{
		{"tenant-a", "application/octet-stream", "abcdefgh", false},
		{"tenant-a", "application/json", `{"input":"YWJjZGVmZ2g="}`, false},
		{"ops", "application/octet-stream", "abcdefgh", true},
		{"ops", "application/json", `{"input":"YWJjZGVmZ2g="}`, true},
	} {
		t.Run(tc.token+" "+tc.contentType, func(t *testing.T) {
			req, _ := http.NewRequest("POST", url+"/v1/functions/a-pipe/invoke", strings.NewReader(tc.body))
			req.Header.Set("Authorization", "Bearer "+toks[tc.token])
			req.Header.Set("Content-Type", tc.contentType)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 {
				t.Fatalf("%d: %s", resp.StatusCode, body)
			}
			st := resp.Header.Get("Server-Timing")
			if !strings.Contains(st, `step0;desc="a-vec `) {
				t.Errorf("Server-Timing does not name the caller's own step: %s", st)
			}
			if got := strings.Contains(st, "b-secret"); got != tc.secret {
				t.Errorf("Server-Timing names b-secret: %v, want %v: %s", got, tc.secret, st)
			}
			if !tc.secret && !strings.Contains(st, ", step1;dur=") {
				t.Errorf("Server-Timing has no nameless entry for the step it may not see: %s", st)
			}
			if tc.contentType != "application/json" {
				return
			}
			var out struct {
				Steps []map[string]any `json:"steps"`
			}
			if err := json.Unmarshal(body, &out); err != nil || len(out.Steps) != 2 {
				t.Fatalf("answer %s (%v): want two steps", body, err)
			}
			_, named := out.Steps[1]["function"]
			_, versioned := out.Steps[1]["version"]
			_, started := out.Steps[1]["start"]
			if named != tc.secret || versioned != tc.secret || started != tc.secret || out.Steps[1]["total_us"] == nil {
				t.Errorf("second step %v: function, version, start given %v, %v, %v, want %v, and its time", out.Steps[1], named, versioned, started, tc.secret)
			}
		})
	}
}

// postAs posts body of contentType to url with token and returns the
// answer's status and body.
func postAs(t *testing.T, url, token, contentType, body string) (int, []byte) {
	t.Helper()
	req, _ := http.NewRequest("POST", url, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", contentType)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, out
}
