package httpapi

import (
	"testing"

	"github.com/plover-run/plover/auth"
	"github.com/plover-run/plover/call"
)

// The scope a request needs follows the route its path takes: a model
// named "infer" is read, and only the infer action invokes.
func TestRequiredScope(t *testing.T) {
	for _, tc := range []struct {
		method, path string
		want         need
	}{
		{"GET", "/healthz", need{open: true, shows: true}}, // open to a probe, admitted with a token,
		{"GET", "/v2/health/ready", need{open: true}},
		{"POST", "/v2/models/cnn/infer", need{scope: auth.Invoke, fn: call.NameOf("cnn")}},
		{"POST", "/v2/models/cnn/versions/3f1c9a2e/infer", need{scope: auth.Invoke, fn: call.NameOf("cnn")}},
		{"GET", "/v2/models/cnn", need{scope: auth.Read}},
		{"GET", "/v2/models/infer", need{scope: auth.Read}},            // a model named infer
		{"GET", "/v2/models/x/versions/infer", need{scope: auth.Read}}, // version "infer" of x
		{"POST", "/v2/models/infer/infer", need{scope: auth.Invoke, fn: call.NameOf("infer")}},
		{"POST", "/v1/functions/cnn/invoke", need{scope: auth.Invoke, fn: call.NameOf("cnn")}},
		{"PUT", "/v1/functions/cnn", need{scope: auth.Deploy, fn: call.NameOf("cnn")}},
		{"POST", "/v1/functions/cnn/rollback", need{scope: auth.Deploy, fn: call.NameOf("cnn")}},
		{"GET", "/v1/functions/cnn", need{scope: auth.Read}},
		{"GET", "/v1/functions/cnn/logs", need{scope: auth.Read, fn: call.NameOf("cnn")}}, // its output: the token's functions only
		{"POST", "/v1/gc", need{scope: auth.Deploy}},
		{"POST", "/v2/repository/index", need{scope: auth.Read}},
		{"POST", "/v2/repository/models/cnn/load", need{scope: auth.Admin}},
		{"POST", "/v2/repository/models/cnn/unload", need{scope: auth.Admin}},
		{"POST", "/v2/repository/models/cnn/other", need{scope: auth.Read}}, // no such route: its 404
	} {
		if got := required([]byte(tc.method), []byte(tc.path)); got != tc.want {
			t.Errorf("%s %s: %+v, want %+v", tc.method, tc.path, got, tc.want)
		}
	}
}
