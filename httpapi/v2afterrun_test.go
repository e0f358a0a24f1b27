package httpapi_test

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/plover-run/plover/engine"
	"github.com/plover-run/plover/httpapi"
	"github.com/plover-run/plover/internal/testkit"
)

// /v2 refuses a JSON answer of more than 16 MiB of outputs (400) after the
// model ran: the engine (or the pipeline's run) counted the request, a
// success. The front door took every transport 4xx for a refusal before
// the run and counted it again (plover ls: 2 requests, 1 client error,
// for one request), and /metrics filed it under _unknown (a 400 for a name
// with no series yet), though the model had answered.
func TestV2AnswerRefusedAfterTheRunCountsOnce(t *testing.T) {
	m := testkit.Manifest("echo")
	m.OutBytes = 16<<20 + 1 // echo's raw UINT8 output: over JSON's bound
	echo := testkit.BundleDir(t, m, nil)
	infer := []byte(`{"inputs":[{"name":"INPUT0","datatype":"UINT8","shape":[1],"data":[1]}]}`)
	for _, tc := range []struct{ name, model string }{
		{"function", "echo"},
		{"pipeline", "p"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := testkit.Engine(t, engine.Config{})
			testkit.Deploy(t, e, echo)
			testkit.Deploy(t, e, testkit.PipelineDir(t, "p", "echo"))
			reg := prometheus.NewRegistry()
			url := testkit.Serve(t, e, httpapi.Options{Registry: reg})
			if code, _, out := v2Do(t, "POST", url+"/v2/models/"+tc.model+"/infer", nil, infer); code != 400 {
				t.Fatalf("a JSON answer over 16 MiB: %d %.200s; want 400", code, out)
			}
			fi, err := e.Control().Function(t.Context(), tc.model)
			if err != nil || fi.Requests != 1 || fi.ClientErrors != 0 || fi.Errors != 0 {
				t.Errorf("%s: %d requests, %d client errors, %d errors (%v); want the one that ran, a success", tc.model, fi.Requests, fi.ClientErrors, fi.Errors, err)
			}
			if n, _ := testkit.Counter(t, reg, "plover_requests_total", map[string]string{"function": tc.model, "code": "400"}); n != 1 {
				t.Errorf("plover_requests_total{function=%q,code=400} = %v, want 1", tc.model, n)
			}
			if n, ok := testkit.Counter(t, reg, "plover_requests_total", map[string]string{"function": "_unknown"}); ok {
				t.Errorf("plover_requests_total{function=_unknown} = %v, want none", n)
			}
		})
	}
}
