package api_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/getkin/kin-openapi/routers/gorillamux"

	"github.com/plover-run/plover/api"
	"github.com/plover-run/plover/auth"
	"github.com/plover-run/plover/bundle"
	"github.com/plover-run/plover/device"
	"github.com/plover-run/plover/engine"
	"github.com/plover-run/plover/errdefs"
	"github.com/plover-run/plover/httpapi"
	"github.com/plover-run/plover/internal/testkit"
)

// The bundle is binary; the filter must know to read it as such.
func init() {
	openapi3filter.RegisterBodyDecoder(bundle.MediaType, openapi3filter.FileBodyDecoder)
	openapi3filter.RegisterBodyDecoder("application/zstd", openapi3filter.FileBodyDecoder)
	openapi3filter.RegisterBodyDecoder("application/x-ndjson", openapi3filter.FileBodyDecoder)
	// The console's static files (GET /ui/...) are bytes to the spec.
	openapi3filter.RegisterBodyDecoder("text/html", openapi3filter.FileBodyDecoder)
	openapi3filter.RegisterBodyDecoder("text/javascript", openapi3filter.FileBodyDecoder)
	openapi3filter.RegisterBodyDecoder("text/css", openapi3filter.FileBodyDecoder)
}

// loadSpec loads and validates api/openapi.yaml.
func loadSpec(t *testing.T) *openapi3.T {
	t.Helper()
	loader := openapi3.NewLoader()
	doc, err := loader.LoadFromFile("openapi.yaml")
	if err != nil {
		t.Fatalf("load openapi.yaml: %v", err)
	}
	if err := doc.Validate(loader.Context); err != nil {
		t.Fatalf("openapi.yaml is not a valid OpenAPI document: %v", err)
	}
	if !doc.IsOpenAPI31OrLater() {
		t.Fatalf("openapi.yaml: want OpenAPI 3.1, have %s", doc.OpenAPI)
	}
	return doc
}

func TestSpecValid(t *testing.T) { loadSpec(t) }

// tokens is a table of a read-only token and an invoke token for "echo".
func tokens(t *testing.T) (tab *auth.Table, reader, invoker string) {
	t.Helper()
	reader, err := auth.NewToken()
	if err != nil {
		t.Fatal(err)
	}
	invoker, err = auth.NewToken()
	if err != nil {
		t.Fatal(err)
	}
	lines := auth.Line("reader", auth.Read, auth.Hash(reader), nil, auth.Limits{}) + "\n" +
		auth.Line("app", auth.Invoke, auth.Hash(invoker), []string{"echo"}, auth.Limits{}) + "\n"
	tab, err = auth.Parse(strings.NewReader(lines), "tokens")
	if err != nil {
		t.Fatal(err)
	}
	return tab, reader, invoker
}

// exchange is one real request and what it must get.
type exchange struct {
	name    string
	method  string
	url     func() string // evaluated when the step runs: later steps use earlier answers
	ctype   string
	header  map[string]string
	body    func() []byte
	status  int
	badReq  bool // the spec must refuse the request too (it is meant to be invalid)
	after   func(t *testing.T, h http.Header, body []byte)
	noRoute bool // the path is one the spec (rightly) lacks
}

func str(s string) func() string { return func() string { return s } }
func raw(b string) func() []byte { return func() []byte { return []byte(b) } }

// TestServerMatchesSpec sends real requests to a running server, every route
// with its success and usual errors, and validates each request and
// response (status, headers, body) against api/openapi.yaml. It then checks
// that every operation in the spec was exercised.
func TestServerMatchesSpec(t *testing.T) {
	doc := loadSpec(t)
	ctx := context.Background()

	// A device that says it keeps its functions' output (as worker
	// processes do), so that the logs route answers with its 200 shape.
	e := testkit.Engine(t, engine.Config{Devices: []device.Device{keepsOutput{device.NewHost(0)}}})
	echo := testkit.Deploy(t, e, testkit.BundleDir(t, testkit.Manifest("echo"), nil))
	other, _, _, err := bundle.PackBytes(testkit.BundleDir(t, testkit.Manifest("other"), nil))
	if err != nil {
		t.Fatal(err)
	}
	plain := testkit.Serve(t, e, httpapi.Options{Version: "test"})
	tab, reader, invoker := tokens(t)
	authed := testkit.ServeTokens(t, e, tab, httpapi.Options{Version: "test"})

	repo := testkit.Serve(t, e, httpapi.Options{Version: "test", Repository: fakeRepository{}})
	doc.Servers = openapi3.Servers{{URL: plain}, {URL: authed}, {URL: repo}}
	router, err := gorillamux.NewRouter(doc)
	if err != nil {
		t.Fatalf("router: %v", err)
	}

	var firstOther, secondOther string // version ids of "other", from its deploys
	ver8 := echo.Version[:8]
	P := func(p string) func() string { return str(plain + p) }
	A := func(p string) func() string { return str(authed + p) }
	R := func(p string) func() string { return str(repo + p) }
	versionOf := func(dst *string) func(*testing.T, http.Header, []byte) {
		return func(t *testing.T, _ http.Header, b []byte) {
			var fi struct{ Version string }
			if err := json.Unmarshal(b, &fi); err != nil || fi.Version == "" {
				t.Errorf("no version in %s", b)
			}
			*dst = fi.Version
		}
	}
	bearer := func(tok string) map[string]string { return map[string]string{"Authorization": "Bearer " + tok} }
	binHeader := `{"id":"b1","inputs":[{"name":"INPUT0","datatype":"UINT8","shape":[4],"parameters":{"binary_data_size":4}}],"parameters":{"binary_data_output":true}}`
	inferJSON := `{"id":"j1","inputs":[{"name":"INPUT0","datatype":"UINT8","shape":[3],"data":[1,2,3]}]}`

	steps := []exchange{
		// Probes and metrics.
		{name: "healthz", method: "GET", url: P("/healthz"), status: 200},
		{name: "readyz", method: "GET", url: P("/readyz"), status: 200},
		{name: "metrics", method: "GET", url: P("/metrics"), status: 200},
		{name: "healthz wrong method", method: "POST", url: P("/healthz"), status: 405},

		// Invoke, both body kinds and both JSON shapes, and its errors.
		{name: "invoke octet-stream", method: "POST", url: P("/v1/functions/echo/invoke"), ctype: "application/octet-stream",
			header: map[string]string{"X-Plover-Timeout-Ms": "5000"}, body: raw("hello"), status: 200,
			after: func(t *testing.T, h http.Header, b []byte) {
				if !bytes.HasPrefix(b, []byte("hello")) || h.Get("X-Plover-Start") != "cold" {
					t.Errorf("out %q, start %q", b, h.Get("X-Plover-Start"))
				}
			}},
		{name: "invoke JSON (Plover)", method: "POST", url: P("/v1/functions/echo/invoke"), ctype: "application/json",
			body: raw(`{"input":"aGVsbG8=","chain":[{"kernel":"echo","grid":1,"block":64}],"out_bytes":16,"timeout_ms":5000}`), status: 200},
		{name: "invoke JSON (PyPlover)", method: "POST", url: P("/v1/functions/echo/invoke"), ctype: "application/json",
			body: raw(`{"name":"echo","inputs":"aGVsbG8=","func_names":["echo"],"grid_sizes":[1],"block_sizes":[64],"output_size":8,"tmp_size":0}`), status: 200},
		{name: "invoke malformed JSON", method: "POST", url: P("/v1/functions/echo/invoke"), ctype: "application/json",
			body: raw(`{"input":`), status: 400, badReq: true},
		{name: "invoke mixed shapes", method: "POST", url: P("/v1/functions/echo/invoke"), ctype: "application/json",
			body: raw(`{"input":"aA==","inputs":"aA=="}`), status: 400, badReq: true},
		{name: "invoke unknown field", method: "POST", url: P("/v1/functions/echo/invoke"), ctype: "application/json",
			body: raw(`{"input":"aA==","nope":1}`), status: 400, badReq: true},
		{name: "invoke bad timeout header", method: "POST", url: P("/v1/functions/echo/invoke"), ctype: "application/octet-stream",
			header: map[string]string{"X-Plover-Timeout-Ms": "0"}, body: raw("x"), status: 400, badReq: true},
		{name: "invoke unknown function", method: "POST", url: P("/v1/functions/nope/invoke"), ctype: "application/octet-stream", body: raw("x"), status: 404},
		{name: "invoke unsupported type", method: "POST", url: P("/v1/functions/echo/invoke"), ctype: "text/plain", body: raw("x"), status: 415, badReq: true},
		{name: "invoke input too large", method: "POST", url: P("/v1/functions/echo/invoke"), ctype: "application/octet-stream",
			body: func() []byte { return make([]byte, 1<<16+1) }, status: 413},
		{name: "invoke invalid chain", method: "POST", url: P("/v1/functions/echo/invoke"), ctype: "application/json",
			body: raw(`{"input":"aA==","chain":[{"kernel":"no_such_kernel","grid":1,"block":1}]}`), status: 422},
		{name: "invoke wrong method", method: "GET", url: P("/v1/functions/echo/invoke"), status: 405},

		// Functions: list, show, deploy, versions, rollback, delete.
		{name: "list", method: "GET", url: P("/v1/functions"), status: 200},
		{name: "list wrong method", method: "POST", url: P("/v1/functions"), ctype: "application/json", body: raw("{}"), status: 405},
		{name: "show", method: "GET", url: P("/v1/functions/echo"), status: 200,
			after: func(t *testing.T, _ http.Header, b []byte) {
				if !bytes.Contains(b, []byte(`"manifest"`)) {
					t.Errorf("loaded function shows no manifest: %s", b)
				}
			}},
		{name: "show unknown", method: "GET", url: P("/v1/functions/nope"), status: 404},
		{name: "function wrong method", method: "POST", url: P("/v1/functions/echo"), status: 405},
		{name: "deploy", method: "PUT", url: P("/v1/functions/other"), ctype: bundle.MediaType,
			body: func() []byte { return other }, status: 201, after: versionOf(&firstOther)},
		{name: "deploy unchanged", method: "PUT", url: P("/v1/functions/other"), ctype: "application/octet-stream",
			body: func() []byte { return other }, status: 200,
			after: func(t *testing.T, _ http.Header, b []byte) {
				if !bytes.Contains(b, []byte(`"unchanged":true`)) {
					t.Errorf("want unchanged: %s", b)
				}
			}},
		{name: "deploy forced", method: "PUT", url: P("/v1/functions/other?force=true"), ctype: "application/zstd",
			body: func() []byte { return other }, status: 201, after: versionOf(&secondOther)},
		{name: "deploy unsupported type", method: "PUT", url: P("/v1/functions/other"), ctype: "text/plain",
			body: func() []byte { return other }, status: 415, badReq: true},
		{name: "deploy invalid bundle", method: "PUT", url: P("/v1/functions/other"), ctype: bundle.MediaType,
			body: raw("not a bundle"), status: 422},
		{name: "deploy under another name", method: "PUT", url: P("/v1/functions/third"), ctype: bundle.MediaType,
			body: func() []byte { return other }, status: 422},
		{name: "versions", method: "GET", url: P("/v1/functions/other/versions"), status: 200,
			after: func(t *testing.T, _ http.Header, b []byte) {
				var rec struct {
					Current  string
					Versions []struct{ ID string }
				}
				if json.Unmarshal(b, &rec) != nil || len(rec.Versions) != 2 || rec.Current != secondOther {
					t.Errorf("record: %s", b)
				}
			}},
		{name: "versions unknown", method: "GET", url: P("/v1/functions/nope/versions"), status: 404},
		{name: "logs", method: "GET", url: P("/v1/functions/echo/logs"), status: 200},
		{name: "logs since", method: "GET", url: P("/v1/functions/echo/logs?since=5m&follow=false"), status: 200},
		{name: "logs bad since", method: "GET", url: P("/v1/functions/echo/logs?since=yesterday"), status: 400},
		{name: "logs unknown", method: "GET", url: P("/v1/functions/nope/logs"), status: 404},
		{name: "logs wrong method", method: "DELETE", url: P("/v1/functions/echo/logs"), status: 405},
		{name: "versions wrong method", method: "DELETE", url: P("/v1/functions/other/versions"), status: 405},
		{name: "rollback", method: "POST", url: P("/v1/functions/other/rollback"), ctype: "application/json",
			body: func() []byte { return []byte(`{"version":"` + firstOther[:8] + `"}`) }, status: 200,
			after: func(t *testing.T, _ http.Header, b []byte) {
				if !bytes.Contains(b, []byte(firstOther)) {
					t.Errorf("rolled back to the wrong version: %s", b)
				}
			}},
		{name: "rollback bad body", method: "POST", url: P("/v1/functions/other/rollback"), ctype: "application/json",
			body: raw(`{"versio":"x"}`), status: 400, badReq: true},
		{name: "rollback unknown version", method: "POST", url: P("/v1/functions/other/rollback"), ctype: "application/json",
			body: raw(`{"version":"zzzzzzzzzzzz"}`), status: 404},
		{name: "rollback wrong method", method: "GET", url: P("/v1/functions/other/rollback"), status: 405},
		{name: "delete", method: "DELETE", url: P("/v1/functions/other"), status: 200},
		{name: "delete again", method: "DELETE", url: P("/v1/functions/other"), status: 404},
		{name: "gc", method: "POST", url: P("/v1/gc?grace=0s"), status: 200},
		{name: "gc default grace", method: "POST", url: P("/v1/gc"), status: 200},
		{name: "gc bad grace", method: "POST", url: P("/v1/gc?grace=soon"), status: 400, badReq: true},
		{name: "gc wrong method", method: "GET", url: P("/v1/gc"), status: 405},
		{name: "no route", method: "GET", url: P("/v1/nothing"), status: 404, noRoute: true},
		{name: "no function subroute", method: "GET", url: P("/v1/functions/echo/nothing"), status: 404, noRoute: true},

		// Open Inference Protocol.
		{name: "v2 repository index", method: "POST", url: R("/v2/repository/index"), status: 200},
		{name: "v2 repository index ready", method: "POST", url: R("/v2/repository/index"), ctype: "application/json", body: raw(`{"ready": true}`), status: 200},
		{name: "v2 repository load", method: "POST", url: R("/v2/repository/models/echo/load"), status: 200},
		{name: "v2 repository load broken", method: "POST", url: R("/v2/repository/models/broken/load"), status: 400},
		{name: "v2 repository unload", method: "POST", url: R("/v2/repository/models/echo/unload"), status: 200},
		{name: "v2 repository unknown", method: "POST", url: R("/v2/repository/models/nope/unload"), status: 404},
		{name: "v2 no repository", method: "POST", url: P("/v2/repository/index"), status: 404},
		{name: "v2 server", method: "GET", url: P("/v2"), status: 200},
		{name: "v2 live", method: "GET", url: P("/v2/health/live"), status: 200},
		{name: "v2 ready", method: "GET", url: P("/v2/health/ready"), status: 200},
		{name: "v2 model", method: "GET", url: P("/v2/models/echo"), status: 200},
		{name: "v2 model version", method: "GET", url: P("/v2/models/echo/versions/" + ver8), status: 200},
		{name: "v2 model ready", method: "GET", url: P("/v2/models/echo/ready"), status: 200},
		{name: "v2 model version ready", method: "GET", url: P("/v2/models/echo/versions/" + echo.Version + "/ready"), status: 200},
		{name: "v2 unknown model", method: "GET", url: P("/v2/models/nope"), status: 404},
		{name: "v2 stale version", method: "GET", url: P("/v2/models/echo/versions/00000000dead"), status: 404},
		{name: "v2 infer JSON", method: "POST", url: P("/v2/models/echo/infer"), ctype: "application/json", body: raw(inferJSON), status: 200,
			after: func(t *testing.T, _ http.Header, b []byte) {
				if !bytes.Contains(b, []byte(`"data":[1,2,3,0`)) || !bytes.Contains(b, []byte(`"id":"j1"`)) {
					t.Errorf("infer: %s", b)
				}
			}},
		{name: "v2 infer binary", method: "POST", url: P("/v2/models/echo/versions/" + ver8 + "/infer"), ctype: "application/octet-stream",
			header: map[string]string{"Inference-Header-Content-Length": strconv.Itoa(len(binHeader))},
			body:   raw(binHeader + "\x01\x02\x03\x04"), status: 200,
			after: func(t *testing.T, h http.Header, b []byte) {
				n, err := strconv.Atoi(h.Get("Inference-Header-Content-Length"))
				if err != nil || n > len(b) || !bytes.HasPrefix(b[n:], []byte{1, 2, 3, 4}) || h.Get("Content-Type") != "application/octet-stream" {
					t.Errorf("binary infer: %v %q", h, b)
				}
			}},
		{name: "v2 infer wrong datatype", method: "POST", url: P("/v2/models/echo/infer"), ctype: "application/json",
			body: raw(`{"inputs":[{"name":"INPUT0","datatype":"FP32","shape":[1],"data":[1]}]}`), status: 400},
		{name: "v2 infer malformed JSON", method: "POST", url: P("/v2/models/echo/infer"), ctype: "application/json",
			body: raw(`{"inputs":`), status: 400, badReq: true},
		{name: "v2 infer unknown model", method: "POST", url: P("/v2/models/nope/infer"), ctype: "application/json", body: raw(inferJSON), status: 404},
		{name: "v2 infer wrong method", method: "GET", url: P("/v2/models/echo/infer"), status: 405},
		{name: "v2 server wrong method", method: "DELETE", url: P("/v2"), status: 405},
		{name: "v2 no route", method: "GET", url: P("/v2/models/echo/bogus"), status: 404, noRoute: true},

		// Authentication.
		{name: "auth: probe open", method: "GET", url: A("/healthz"), status: 200},
		{name: "auth: readyz open", method: "GET", url: A("/readyz"), status: 200},
		{name: "auth: console open", method: "GET", url: A("/ui/"), status: 200},
		{name: "auth: console file open", method: "GET", url: A("/ui/app.js"), status: 200},
		{name: "auth: console no file", method: "GET", url: A("/ui/nothing.js"), status: 404},
		{name: "auth: v2 open", method: "GET", url: A("/v2/health/ready"), status: 200},
		{name: "auth: no token", method: "GET", url: A("/v1/functions"), status: 401},
		{name: "auth: unknown token", method: "GET", url: A("/metrics"), header: bearer("not-a-token"), status: 401},
		{name: "auth: read", method: "GET", url: A("/v1/functions/echo"), header: bearer(reader), status: 200},
		{name: "auth: read logs", method: "GET", url: A("/v1/functions/echo/logs"), header: bearer(reader), status: 200},
		{name: "auth: invoke cannot read logs", method: "GET", url: A("/v1/functions/echo/logs"), header: bearer(invoker), status: 403},
		{name: "auth: read cannot invoke", method: "POST", url: A("/v1/functions/echo/invoke"), header: bearer(reader),
			ctype: "application/octet-stream", body: raw("x"), status: 403},
		{name: "auth: invoke", method: "POST", url: A("/v1/functions/echo/invoke"), header: bearer(invoker),
			ctype: "application/octet-stream", body: raw("x"), status: 200},
		{name: "auth: invoke cannot gc", method: "POST", url: A("/v1/gc"), header: bearer(invoker), status: 403},
		{name: "auth: v2 metadata needs a token", method: "GET", url: A("/v2/models/echo"), status: 401},
		{name: "auth: v2 infer unknown token", method: "POST", url: A("/v2/models/echo/infer"), header: bearer("not-a-token"),
			ctype: "application/json", body: raw(inferJSON), status: 401},
		{name: "auth: v2 read cannot infer", method: "POST", url: A("/v2/models/echo/infer"), header: bearer(reader),
			ctype: "application/json", body: raw(inferJSON), status: 403},
		{name: "auth: v2 infer cannot read metadata", method: "GET", url: A("/v2/models/echo/ready"), header: bearer(invoker), status: 403},
		{name: "auth: v2 infer", method: "POST", url: A("/v2/models/echo/infer"), header: bearer(invoker),
			ctype: "application/json", body: raw(inferJSON), status: 200},
	}

	errSchema := doc.Components.Schemas["Error"].Value
	seen := map[string]bool{}
	var mismatches []string
	for _, st := range steps {
		var body []byte
		if st.body != nil {
			body = st.body()
		}
		url := st.url()
		req, err := http.NewRequest(st.method, url, bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		if st.ctype != "" {
			req.Header.Set("Content-Type", st.ctype)
		}
		for k, v := range st.header {
			req.Header.Set(k, v)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("%s: %v", st.name, err)
		}
		rb, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		fail := func(format string, args ...any) {
			mismatches = append(mismatches, fmt.Sprintf("%s (%s %s → %d): %s", st.name, st.method, strings.TrimPrefix(strings.TrimPrefix(url, plain), authed), resp.StatusCode, fmt.Sprintf(format, args...)))
		}
		if resp.StatusCode != st.status {
			fail("status %d, want %d; body %.300s", resp.StatusCode, st.status, rb)
			continue
		}
		if st.after != nil {
			st.after(t, resp.Header, rb)
		}

		// The same request again, for the validator (its body was read).
		vreq, _ := http.NewRequest(st.method, url, bytes.NewReader(body))
		vreq.Header = req.Header.Clone()
		route, params, err := router.FindRoute(vreq)
		switch {
		case errors.Is(err, routers.ErrMethodNotAllowed):
			// A method the path does not take: the spec has no operation
			// for it, so check the error object and Allow directly (under
			// /v2 the protocol's object, which has no code).
			if resp.StatusCode != 405 || resp.Header.Get("Allow") == "" {
				fail("method not in the spec but the server answered without 405 and Allow")
			}
			if strings.Contains(url, "/v2") {
				checkJSON(fail, doc.Components.Schemas["V2Error"].Value, rb, "")
			} else {
				checkJSON(fail, errSchema, rb, "method_not_allowed")
			}
			continue
		case errors.Is(err, routers.ErrPathNotFound):
			if !st.noRoute {
				fail("no route in the spec for this path")
				continue
			}
			schema := errSchema // the v2 routes answer in the protocol's error shape
			if strings.Contains(url, "/v2/") {
				schema = doc.Components.Schemas["V2Error"].Value
			}
			checkJSON(fail, schema, rb, "")
			continue
		case err != nil:
			fail("router: %v", err)
			continue
		case st.noRoute:
			fail("the spec has a route for a path the server does not know")
			continue
		}
		seen[route.Method+" "+route.Path] = true
		in := &openapi3filter.RequestValidationInput{Request: vreq, PathParams: params, Route: route,
			Options: &openapi3filter.Options{AuthenticationFunc: openapi3filter.NoopAuthenticationFunc, MultiError: true}}
		rerr := openapi3filter.ValidateRequest(ctx, in)
		switch {
		case st.badReq && rerr == nil:
			fail("the spec accepts a request the server refuses: body %.200s", rb)
		case !st.badReq && rerr != nil:
			fail("request does not match the spec: %v", rerr)
		}
		// Validate the response with the request's body unread: the
		// validator consumed it above.
		in.Request, _ = http.NewRequest(st.method, url, bytes.NewReader(body))
		in.Request.Header = req.Header.Clone()
		out := &openapi3filter.ResponseValidationInput{RequestValidationInput: in, Status: resp.StatusCode, Header: resp.Header,
			Options: &openapi3filter.Options{IncludeResponseStatus: true, MultiError: true}}
		out.SetBodyBytes(rb)
		if err := openapi3filter.ValidateResponse(ctx, out); err != nil {
			fail("response does not match the spec: %v; body %.300s", err, rb)
		}
	}

	var missing []string
	for path, item := range doc.Paths.Map() {
		for method := range item.Operations() {
			if !seen[method+" "+path] {
				missing = append(missing, method+" "+path)
			}
		}
	}
	sort.Strings(missing)
	for _, m := range missing {
		mismatches = append(mismatches, "operation never exercised: "+m)
	}
	if len(mismatches) > 0 {
		t.Errorf("%d mismatches between the server and api/openapi.yaml:\n  %s", len(mismatches), strings.Join(mismatches, "\n  "))
	}
	if os.Getenv("PLOVER_SPEC_VERBOSE") != "" {
		t.Logf("exercised %d operations in %d exchanges", len(seen), len(steps))
	}
}

// checkJSON validates b against schema and, when code is set, its error code.
func checkJSON(fail func(string, ...any), schema *openapi3.Schema, b []byte, code string) {
	var v any
	if err := json.Unmarshal(b, &v); err != nil {
		fail("body is not JSON: %v: %.200s", err, b)
		return
	}
	if err := schema.VisitJSON(v, openapi3.EnableJSONSchema2020()); err != nil {
		fail("body does not match the schema: %v: %.200s", err, b)
		return
	}
	if code != "" && !bytes.Contains(b, []byte(`"code":"`+code+`"`)) {
		fail("want error code %s: %.200s", code, b)
	}
}

// keepsOutput is a device whose functions' output the engine keeps (none
// arrives here: the bundle runs in this process).
type keepsOutput struct{ device.Device }

func (keepsOutput) KeepsOutput() bool { return true }

// fakeRepository answers the repository routes as a served model
// repository would (repository.Repository): echo loads, broken does not,
// nothing else is there.
type fakeRepository struct{}

func (fakeRepository) Index(_ context.Context, ready bool) []api.RepositoryModel {
	out := []api.RepositoryModel{{Name: "echo", Version: "1", State: "READY"}}
	if !ready {
		out = append(out, api.RepositoryModel{Name: "broken", Version: "1", State: "UNAVAILABLE", Reason: `models/broken: plover.json names "other"`})
	}
	return out
}

func (fakeRepository) Load(ctx context.Context, name string) error {
	switch name {
	case "echo":
		return nil
	case "broken":
		return errdefs.New(errdefs.KindBadRequest, nil, `load broken: models/broken: plover.json names "other"`)
	}
	return errdefs.New(errdefs.KindNotFound, nil, "model %s is not in the model repository", name)
}

func (r fakeRepository) Unload(ctx context.Context, name string) error {
	if name == "echo" {
		return nil
	}
	return r.Load(ctx, name)
}
