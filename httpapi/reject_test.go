package httpapi_test

import (
	"strings"
	"testing"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/engine"
	"github.com/plover-run/plover/httpapi"
	"github.com/plover-run/plover/internal/testkit"
)

// A function that refuses its input (plover_reject, ABI 2.2) answers 422
// invalid_input with its own message, on /v1 and /v2: the client's fault,
// not a 500. Its good input still runs.
func TestRefusedInputIs422(t *testing.T) {
	e := testkit.Engine(t, engine.Config{})
	m := testkit.Manifest("picky")
	m.Chain = []abi.Launch{{Kernel: "refuse", Grid: 1, Block: 1}}
	testkit.Deploy(t, e, testkit.BundleDir(t, m, nil))
	url := testkit.Serve(t, e, httpapi.Options{})
	for _, tc := range []struct {
		name, path, ctype string
		body              string
		code              int
		want              string
	}{
		{"v1 refused", "/v1/functions/picky/invoke", "application/octet-stream", "", 422, `"code":"invalid_input","message":"function picky refused its input: input must not be empty (got 0 bytes)"`},
		{"v2 refused", "/v2/models/picky/infer", "application/json", `{"inputs":[{"name":"INPUT0","datatype":"UINT8","shape":[0],"data":[]}]}`, 422, `{"error":"function picky refused its input: input must not be empty (got 0 bytes)"}`},
		{"v1 accepted", "/v1/functions/picky/invoke", "application/octet-stream", "ok", 200, "ok"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, body := testkit.Post(t, "POST", url+tc.path, tc.ctype, []byte(tc.body))
			if resp.StatusCode != tc.code || !strings.Contains(string(body), tc.want) {
				t.Fatalf("%d %s; want %d with %s", resp.StatusCode, body, tc.code, tc.want)
			}
		})
	}
}
