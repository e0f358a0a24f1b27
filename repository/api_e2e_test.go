package repository_test

import (
	"encoding/json"
	"os"
	"strings"
	"testing"

	"github.com/plover-run/plover/engine"
	"github.com/plover-run/plover/httpapi"
	"github.com/plover-run/plover/internal/testkit"
	"github.com/plover-run/plover/repository"
)

// serveEmptyRepository serves a repository of no models on a real
// server, and returns its URL.
func serveEmptyRepository(t *testing.T) string {
	t.Helper()
	e := testkit.Engine(t, engine.Config{})
	r, err := repository.New(repository.Config{Dir: t.TempDir()}, e.Control())
	if err != nil {
		t.Fatal(err)
	}
	url := testkit.Serve(t, e, httpapi.Options{Repository: r})
	return url
}

// A body the repository routes cannot read is 400 naming the field and
// what it is: not encoding/json's words for Plover's own Go types
// ("cannot unmarshal array into Go value of type struct { Ready bool
// \"json:\\\"ready\\\"\"; ... }").
func TestRepositoryBodyErrorsNameTheField(t *testing.T) {
	url := serveEmptyRepository(t)
	for _, c := range []struct{ path, body, want string }{
		{"/v2/repository/index", `[1]`, "is an array, want a JSON object"},
		{"/v2/repository/index", `"ready"`, "is a string, want a JSON object"},
		{"/v2/repository/index", `{"ready": "yes"}`, `"ready" is a string, want true or false`},
		{"/v2/repository/index", `{"ready": {}}`, `"ready" is an object, want true or false`},
		{"/v2/repository/index", `{"repository_name": 1}`, `"repository_name" is a number, want a string`},
		{"/v2/repository/index", `{"ready": tru}`, "invalid JSON"},
		{"/v2/repository/models/cnn/load", `{"parameters": 1} x`, "invalid JSON"},
	} {
		resp, b := testkit.Post(t, "POST", url+c.path, "application/json", []byte(c.body))
		var out struct{ Error string }
		json.Unmarshal(b, &out)
		if resp.StatusCode != 400 || !strings.Contains(out.Error, c.want) || strings.Contains(out.Error, "Go ") {
			t.Errorf("POST %s %s: %d %s, want 400 saying %q", c.path, c.body, resp.StatusCode, b, c.want)
		}
	}
}

// A load that asks for what Plover cannot do (Triton's "config" override
// or a "file:PATH" content) is 400 naming the parameter: answering 200
// would tell the client its model loaded as it asked. Other parameters
// are left alone (the load goes on: 404 here, no such model).
func TestLoadRefusesOverrides(t *testing.T) {
	url := serveEmptyRepository(t)
	for _, c := range []struct {
		body string
		code int
		want string
	}{
		{`{"parameters": {"config": "{\"backend\": \"onnx\"}"}}`, 400, `load cnn: parameter "config": `},
		{`{"parameters": {"file:1/model.onnx": "AAAA"}}`, 400, `load cnn: parameter "file:1/model.onnx": `},
		{`{"parameters": 1}`, 400, `"parameters" is a number, want a JSON object`},
		{`{"parameters": {"priority": 1}}`, 404, `model "cnn" is not in the model repository`},
		{``, 404, `model "cnn" is not in the model repository`},
	} {
		resp, b := testkit.Post(t, "POST", url+"/v2/repository/models/cnn/load", "application/json", []byte(c.body))
		var out struct{ Error string }
		json.Unmarshal(b, &out)
		if resp.StatusCode != c.code || !strings.Contains(out.Error, c.want) || strings.Contains(out.Error, os.TempDir()) {
			t.Errorf("load %s: %d %s, want %d saying %q, and not the server's path", c.body, resp.StatusCode, b, c.code, c.want)
		}
	}
}
