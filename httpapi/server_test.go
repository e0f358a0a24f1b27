package httpapi_test

import (
	"bufio"
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"math/rand"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/api"
	"github.com/plover-run/plover/bundle"
	"github.com/plover-run/plover/engine"
	"github.com/plover-run/plover/httpapi"
	"github.com/plover-run/plover/internal/testkit"
)

// setup serves an engine with functions "echo" (echo then sleep 1 ms, so
// concurrent requests overlap) and "failing".
func setup(t *testing.T) (string, *engine.Engine) {
	t.Helper()
	e := testkit.Engine(t, engine.Config{MaxInstances: 4})
	m := testkit.Manifest("echo")
	m.Chain = []abi.Launch{{Kernel: "echo", Grid: 1, Block: 64}, {Kernel: "sleep_ms", Grid: 1, Block: 1}}
	testkit.Deploy(t, e, testkit.BundleDir(t, m, nil))
	f := testkit.Manifest("failing")
	f.Chain = []abi.Launch{{Kernel: "fail", Grid: 1, Block: 1}}
	testkit.Deploy(t, e, testkit.BundleDir(t, f, nil))
	return testkit.Serve(t, e, httpapi.Options{MaxBodyBytes: 1 << 20}), e
}

func padded(in []byte, n int) []byte {
	return append(append([]byte{}, in...), make([]byte, n-len(in))...)
}

func TestRequestShapes(t *testing.T) {
	base, _ := setup(t)
	url := base + "/v1/functions/echo/invoke"
	in := []byte("hello plover")

	t.Run("octet-stream", func(t *testing.T) {
		resp, body := testkit.Post(t, "POST", url, "application/octet-stream", in)
		if resp.StatusCode != 200 || !bytes.Equal(body, padded(in, 256)) {
			t.Fatalf("%d %q", resp.StatusCode, body)
		}
		st := resp.Header.Get("Server-Timing")
		for _, k := range []string{"queue;dur=", "load;dur=", "copyin;dur=", "kernels;dur=", "copyout;dur=", "total;dur="} {
			if !strings.Contains(st, k) {
				t.Errorf("Server-Timing %q lacks %s", st, k)
			}
		}
		if s := resp.Header.Get("X-Plover-Start"); s != "cold" {
			t.Errorf("first request start %q, want cold", s)
		}
	})
	t.Run("json", func(t *testing.T) {
		req, _ := json.Marshal(map[string]any{"input": base64.StdEncoding.EncodeToString(in)})
		resp, body := testkit.Post(t, "POST", url, "application/json", req)
		var out struct {
			Output string           `json:"output"`
			Cold   bool             `json:"cold"`
			Start  string           `json:"start"`
			Timing map[string]int64 `json:"timing_us"`
		}
		if resp.StatusCode != 200 || json.Unmarshal(body, &out) != nil {
			t.Fatalf("%d %s", resp.StatusCode, body)
		}
		got, _ := base64.StdEncoding.DecodeString(out.Output)
		if !bytes.Equal(got, padded(in, 256)) || out.Cold || out.Start != "hot" {
			t.Fatalf("json response %+v", out)
		}
		if _, ok := out.Timing["kernels"]; !ok || len(out.Timing) != 6 {
			t.Fatalf("timing_us %v", out.Timing)
		}
	})
	t.Run("json chain override", func(t *testing.T) {
		req := fmt.Sprintf(`{"input":%q,"chain":[{"kernel":"echo","grid":1,"block":4},{"kernel":"add_one","grid":1,"block":1},{"kernel":"add_one","grid":1,"block":1}],"out_bytes":3}`,
			base64.StdEncoding.EncodeToString([]byte{1, 2, 3}))
		resp, body := testkit.Post(t, "POST", url, "application/json", []byte(req))
		var out struct{ Output []byte }
		if resp.StatusCode != 200 || json.Unmarshal(body, &out) != nil || !bytes.Equal(out.Output, []byte{3, 4, 5}) {
			t.Fatalf("%d %s", resp.StatusCode, body)
		}
	})
	t.Run("pyplover", func(t *testing.T) {
		req := fmt.Sprintf(`{"name":"echo","inputs":%q,"func_names":["echo","add_one"],"grid_sizes":[1,1],"block_sizes":[32,1],"output_size":4,"tmp_size":0}`,
			base64.StdEncoding.EncodeToString([]byte{7, 8}))
		resp, body := testkit.Post(t, "POST", url, "application/json", []byte(req))
		var out struct{ Output []byte }
		if resp.StatusCode != 200 || json.Unmarshal(body, &out) != nil || !bytes.Equal(out.Output, []byte{8, 9, 1, 1}) {
			t.Fatalf("%d %s", resp.StatusCode, body)
		}
	})
}

func TestErrorStatuses(t *testing.T) {
	base, e := setup(t)
	fn := base + "/v1/functions/"
	garbage := []byte("not a bundle")
	cudaDir := func() []byte {
		m := testkit.Manifest("echo")
		m.Target = abi.TargetCUDA
		b, _, _, err := bundle.PackBytes(testkit.BundleDir(t, m, nil))
		if err != nil {
			t.Fatal(err)
		}
		return b
	}()
	tests := []struct {
		name, method, path, ct string
		body                   []byte
		status                 int
		code, msg              string
	}{
		{"malformed json", "POST", "echo/invoke", "application/json", []byte(`{"input":`), 400, "bad_request", "invalid JSON"},
		{"unknown json field", "POST", "echo/invoke", "application/json", []byte(`{"inptu":"AA=="}`), 400, "bad_request", "inptu"},
		{"missing input", "POST", "echo/invoke", "application/json", []byte(`{}`), 400, "bad_request", "input: is required"},
		{"bad base64", "POST", "echo/invoke", "application/json", []byte(`{"input":"***"}`), 400, "bad_request", "input: is not valid base64"},
		{"mixed shapes", "POST", "echo/invoke", "application/json", []byte(`{"input":"AA==","inputs":"AA=="}`), 400, "bad_request", "mixes"},
		{"pyplover lengths", "POST", "echo/invoke", "application/json", []byte(`{"inputs":"AA==","func_names":["echo"],"grid_sizes":[1,2],"block_sizes":[1]}`), 400, "bad_request", "grid_sizes: has 2 entries"},
		{"pyplover name mismatch", "POST", "echo/invoke", "application/json", []byte(`{"name":"other","inputs":"AA=="}`), 400, "bad_request", "name:"},
		{"negative out_bytes", "POST", "echo/invoke", "application/json", []byte(`{"input":"AA==","out_bytes":-1}`), 400, "bad_request", "out_bytes"},
		{"unknown function", "POST", "nope/invoke", "application/octet-stream", nil, 404, "not_found", `"nope" not found`},
		{"unknown route", "GET", "echo/invoke/x", "", nil, 404, "not_found", "no route"},
		{"wrong method", "GET", "echo/invoke", "", nil, 405, "method_not_allowed", "use POST"},
		{"input over max", "POST", "echo/invoke", "application/octet-stream", make([]byte, 1<<16+1), 413, "too_large", "max_input_bytes"},
		{"wrong content type", "POST", "echo/invoke", "text/plain", []byte("x"), 415, "unsupported_media_type", "text/plain"},
		{"deploy wrong content type", "PUT", "echo", "text/plain", garbage, 415, "unsupported_media_type", bundle.MediaType},
		{"deploy garbage", "PUT", "echo", bundle.MediaType, garbage, 422, "invalid", "corrupt archive"},
		{"deploy wrong target", "PUT", "echo", bundle.MediaType, cudaDir, 422, "invalid", `built for "cuda"`},
		{"override unknown kernel", "POST", "echo/invoke", "application/json", []byte(`{"input":"AA==","chain":[{"kernel":"nope","grid":1,"block":1}]}`), 422, "invalid", `"nope"`},
		{"override libc", "POST", "echo/invoke", "application/json", []byte(`{"input":"AA==","chain":[{"kernel":"system","grid":1,"block":1}]}`), 422, "invalid", `"system"`},
		{"override out over max", "POST", "echo/invoke", "application/json", []byte(`{"input":"AA==","out_bytes":100000}`), 422, "invalid", "out_bytes"},
		// A PyPlover body's refusals name its own fields.
		{"pyplover out over max", "POST", "echo/invoke", "application/json", []byte(`{"inputs":"AA==","output_size":100000}`), 422, "invalid", "output_size: 100000 is over the manifest's out_bytes"},
		{"pyplover bad grid", "POST", "echo/invoke", "application/json", []byte(`{"inputs":"AA==","func_names":["echo","echo"],"grid_sizes":[1,0],"block_sizes":[1,1]}`), 422, "invalid", "grid_sizes[1]: 0 must be in"},
		{"pyplover unknown kernel", "POST", "echo/invoke", "application/json", []byte(`{"inputs":"AA==","func_names":["echo","nope"],"grid_sizes":[1,1],"block_sizes":[1,1]}`), 422, "invalid", `func_names[1]: function echo`},
		{"native bad grid", "POST", "echo/invoke", "application/json", []byte(`{"input":"AA==","chain":[{"kernel":"echo","grid":0,"block":1}]}`), 422, "invalid", "chain[0].grid: 0 must be in"},
		{"kernel failure", "POST", "failing/invoke", "application/octet-stream", []byte("x"), 500, "kernel_failed", "fail kernel was asked to fail"},
		{"delete unknown", "DELETE", "nope", "", nil, 404, "not_found", "not found"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp, body := testkit.Post(t, tt.method, fn+tt.path, tt.ct, tt.body)
			var eb struct {
				Error struct{ Code, Message string } `json:"error"`
			}
			if err := json.Unmarshal(body, &eb); err != nil {
				t.Fatalf("status %d, body is not a JSON error: %q", resp.StatusCode, body)
			}
			if resp.StatusCode != tt.status || eb.Error.Code != tt.code || !strings.Contains(eb.Error.Message, tt.msg) {
				t.Fatalf("got %d %s %q, want %d %s containing %q", resp.StatusCode, eb.Error.Code, eb.Error.Message, tt.status, tt.code, tt.msg)
			}
		})
	}
	// A body over the server's limit is refused from its Content-Length
	// once its first bytes arrive, without reading the rest (bodies are
	// streamed, so nothing is reserved for what was announced). Sent by
	// hand: a client still writing the body can see the connection close
	// before it reads the 413.
	big := testkit.Manifest("big") // takes more than the server's limit
	big.MaxInputBytes = 4 << 20
	testkit.Deploy(t, e, testkit.BundleDir(t, big, nil))
	conn, err := net.Dial("tcp", strings.TrimPrefix(base, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(conn, "POST /v1/functions/big/invoke HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/octet-stream\r\nContent-Length: %d\r\n\r\n", 2<<20)
	conn.Write(make([]byte, 16<<10))
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := io.ReadAll(resp.Body)
	conn.Close()
	if resp.StatusCode != 413 || !strings.Contains(string(raw), "over the limit of 1048576 bytes (plover serve --max-body)") {
		t.Fatalf("body over the server's limit: %d %s", resp.StatusCode, raw)
	}
	// None of that disturbed the server or the function.
	resp, body := testkit.Post(t, "POST", fn+"echo/invoke", "application/octet-stream", []byte("still ok"))
	if resp.StatusCode != 200 || !bytes.HasPrefix(body, []byte("still ok")) {
		t.Fatalf("after the errors: %d %q", resp.StatusCode, body)
	}
	// Counted apart: echo's 4xx answers (malformed requests the transport
	// refused before they ran, 413, 415, the engine's 422s) are client
	// errors; failing's kernel failure is an error (5xx), and with no
	// request succeeded it has no mean.
	for _, want := range []struct {
		name                           string
		requests, clientErrors, errors int64
		mean                           bool
	}{
		{"echo", 18, 17, 0, true},
		{"failing", 1, 0, 1, false},
	} {
		fi, err := e.Control().Function(t.Context(), want.name)
		if err != nil || fi.Requests != want.requests || fi.ClientErrors != want.clientErrors || fi.Errors != want.errors || (fi.MeanUs > 0) != want.mean {
			t.Errorf("%s: %d requests, %d client errors, %d errors, mean %d µs (%v); want %d, %d, %d, a mean %v",
				want.name, fi.Requests, fi.ClientErrors, fi.Errors, fi.MeanUs, err, want.requests, want.clientErrors, want.errors, want.mean)
		}
	}
}

func TestConcurrentInvokesAreNotMixed(t *testing.T) {
	base, e := setup(t)
	url := base + "/v1/functions/echo/invoke"
	const clients, perClient = 16, 40
	var wg sync.WaitGroup
	errs := make(chan error, clients)
	for c := 0; c < clients; c++ {
		wg.Add(1)
		go func(c int) {
			defer wg.Done()
			rng := rand.New(rand.NewSource(int64(c)))
			for i := 0; i < perClient; i++ {
				in := make([]byte, 1+rng.Intn(255))
				rng.Read(in)
				in[0] = byte(c)
				resp, err := http.Post(url, "application/octet-stream", bytes.NewReader(in))
				if err != nil {
					errs <- err
					return
				}
				var got bytes.Buffer
				got.ReadFrom(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 200 || !bytes.Equal(got.Bytes(), padded(in, 256)) {
					errs <- fmt.Errorf("client %d request %d: status %d, output differs from its input", c, i, resp.StatusCode)
					return
				}
			}
		}(c)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	fi, err := e.Control().Function(t.Context(), "echo")
	if err != nil {
		t.Fatal(err)
	}
	if fi.Requests != clients*perClient || fi.Errors != 0 {
		t.Fatalf("requests %d errors %d", fi.Requests, fi.Errors)
	}
	if fi.Idle < 2 || fi.Idle > 4 {
		t.Fatalf("%d instances after the load, want 2..4 (max_instances 4)", fi.Idle)
	}
}

func TestManagementEndpoints(t *testing.T) {
	base, _ := setup(t)
	resp, body := testkit.Post(t, "GET", base+"/healthz", "", nil)
	if resp.StatusCode != 200 || !strings.Contains(string(body), `"status":"ok"`) {
		t.Fatalf("healthz %d %s", resp.StatusCode, body)
	}
	resp, body = testkit.Post(t, "GET", base+"/v1/functions", "", nil)
	var list struct{ Functions []api.FunctionInfo }
	if resp.StatusCode != 200 || json.Unmarshal(body, &list) != nil || len(list.Functions) != 2 || list.Functions[0].Name != "echo" {
		t.Fatalf("list %d %s", resp.StatusCode, body)
	}
	resp, body = testkit.Post(t, "DELETE", base+"/v1/functions/failing", "", nil)
	if resp.StatusCode != 200 {
		t.Fatalf("delete %d %s", resp.StatusCode, body)
	}
	resp, _ = testkit.Post(t, "GET", base+"/v1/functions/failing", "", nil)
	if resp.StatusCode != 404 {
		t.Fatalf("get after delete: %d", resp.StatusCode)
	}
}

// A deploy answers 201 when it creates a version and 200, with
// "unchanged", when the bytes equal the current version's; ?force=true
// creates one anyway.
func TestDeployStatusUnchanged(t *testing.T) {
	base, _ := setup(t)
	b, _, _, err := bundle.PackBytes(testkit.BundleDir(t, testkit.Manifest("fresh"), nil))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		query     string
		status    int
		unchanged bool
	}{{"", 201, false}, {"", 200, true}, {"?force=true", 201, false}} {
		resp, body := testkit.Post(t, "PUT", base+"/v1/functions/fresh"+tc.query, bundle.MediaType, b)
		if resp.StatusCode != tc.status || strings.Contains(string(body), `"unchanged":true`) != tc.unchanged {
			t.Errorf("PUT%s: %d %s; want %d, unchanged %v", tc.query, resp.StatusCode, body, tc.status, tc.unchanged)
		}
	}
}

// A bundle sent without a length (chunked) and larger than --max-body is a
// 413 naming the flag, not a bundle cut at the limit and refused as
// damaged: the engine's own bundle limit is larger.
func TestDeployChunkedOverMaxBody(t *testing.T) {
	e := testkit.Engine(t, engine.Config{})
	url := testkit.Serve(t, e, httpapi.Options{MaxBodyBytes: 64 << 10})
	body := io.MultiReader(bytes.NewReader(make([]byte, 200<<10))) // no Len: sent chunked
	req, _ := http.NewRequest(http.MethodPut, url+"/v1/functions/big", body)
	req.Header.Set("Content-Type", bundle.MediaType)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 413 || !strings.Contains(string(b), "too_large") || !strings.Contains(string(b), "--max-body") {
		t.Fatalf("%d %s, want 413 too_large naming --max-body", resp.StatusCode, b)
	}
}
