package httpapi_test

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"io"
	"math"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/internal/testkit"
	"github.com/plover-run/plover/runtime"
	"github.com/plover-run/plover/runtime/httpapi"
)

func v2Do(t *testing.T, method, url string, hdr map[string]string, body []byte) (int, http.Header, []byte) {
	t.Helper()
	req, _ := http.NewRequest(method, url, bytes.NewReader(body))
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, b
}

type v2Out struct {
	ModelName    string `json:"model_name"`
	ModelVersion string `json:"model_version"`
	ID           string `json:"id"`
	Outputs      []struct {
		Name       string          `json:"name"`
		Datatype   string          `json:"datatype"`
		Shape      []int64         `json:"shape"`
		Data       []json.Number   `json:"data"`
		Parameters map[string]any  `json:"parameters"`
		Raw        json.RawMessage `json:"-"`
	} `json:"outputs"`
	Error string `json:"error"`
}

// The Open Inference Protocol routes against a served engine: health,
// metadata, inference with JSON data and with the binary extension, the
// raw-bytes default and declared tensors, and the protocol's error object.
func TestOpenInferenceProtocol(t *testing.T) {
	e := testkit.Engine(t, runtime.Config{})
	raw := testkit.Manifest("echo") // echo: out = input, zero-padded to out_bytes
	testkit.Deploy(t, e, testkit.BundleDir(t, raw, nil))
	typed := testkit.Manifest("typed")
	typed.OutBytes = 32
	typed.Tensors = &abi.Tensors{
		Inputs:  []abi.Tensor{{Name: "x", Datatype: "FP32", Shape: []int64{2, 2}}, {Name: "y", Datatype: "INT16", Shape: []int64{-1}}},
		Outputs: []abi.Tensor{{Name: "z", Datatype: "FP32", Shape: []int64{2, 2}}, {Name: "rest", Datatype: "INT16", Shape: []int64{-1}}},
	}
	fi := testkit.Deploy(t, e, testkit.BundleDir(t, typed, nil))
	url := testkit.Serve(t, e, httpapi.Options{})

	for _, p := range []string{"/v2", "/v2/health/live", "/v2/health/ready", "/v2/models/echo/ready", "/v2/models/typed/versions/" + fi.Version[:8] + "/ready"} {
		if code, _, b := v2Do(t, "GET", url+p, nil, nil); code != 200 {
			t.Errorf("GET %s: %d %s", p, code, b)
		}
	}
	code, _, b := v2Do(t, "GET", url+"/v2/models/typed", nil, nil)
	if code != 200 || !strings.Contains(string(b), `"name":"x","datatype":"FP32","shape":[2,2]`) || !strings.Contains(string(b), fi.Version) {
		t.Errorf("typed metadata: %d %s", code, b)
	}
	code, _, b = v2Do(t, "GET", url+"/v2/models/echo", nil, nil)
	if code != 200 || !strings.Contains(string(b), `"name":"INPUT0","datatype":"UINT8","shape":[-1]`) {
		t.Errorf("raw metadata: %d %s", code, b)
	}

	t.Run("raw bytes, JSON data", func(t *testing.T) {
		code, _, b := v2Do(t, "POST", url+"/v2/models/echo/infer", nil,
			[]byte(`{"id":"r1","inputs":[{"name":"INPUT0","datatype":"UINT8","shape":[3],"data":[7,8,9]}]}`))
		var out v2Out
		json.Unmarshal(b, &out)
		if code != 200 || out.ID != "r1" || len(out.Outputs) != 1 || out.Outputs[0].Name != "OUTPUT0" ||
			len(out.Outputs[0].Data) != int(raw.OutBytes) || out.Outputs[0].Data[0] != "7" || out.Outputs[0].Data[2] != "9" || out.Outputs[0].Data[3] != "0" {
			t.Fatalf("%d %s", code, b)
		}
	})

	t.Run("declared tensors, nested JSON data", func(t *testing.T) {
		code, _, b := v2Do(t, "POST", url+"/v2/models/typed/versions/"+fi.Version+"/infer", nil,
			[]byte(`{"inputs":[{"name":"y","datatype":"INT16","shape":[2],"data":[-3,300]},{"name":"x","datatype":"FP32","shape":[2,2],"data":[[1.5,2],[3,-4]]}]}`))
		var out v2Out
		json.Unmarshal(b, &out)
		if code != 200 || len(out.Outputs) != 2 {
			t.Fatalf("%d %s", code, b)
		}
		z, rest := out.Outputs[0], out.Outputs[1]
		if z.Name != "z" || strings.Join(numbers(z.Data), ",") != "1.5,2,3,-4" {
			t.Errorf("z = %+v", z)
		}
		// out is 32 bytes: 16 of z, then 16 = 8 INT16 of rest, y's first.
		if rest.Name != "rest" || len(rest.Shape) != 1 || rest.Shape[0] != 8 || rest.Data[0] != "-3" || rest.Data[1] != "300" || rest.Data[2] != "0" {
			t.Errorf("rest = %+v", rest)
		}
	})

	t.Run("binary extension both ways", func(t *testing.T) {
		x := make([]byte, 16)
		for i, f := range []float32{1, 2, 3, 4} {
			binary.LittleEndian.PutUint32(x[4*i:], math.Float32bits(f))
		}
		y := []byte{5, 0, 6, 0}
		header := []byte(`{"inputs":[{"name":"x","datatype":"FP32","shape":[2,2],"parameters":{"binary_data_size":16}},` +
			`{"name":"y","datatype":"INT16","shape":[2],"parameters":{"binary_data_size":4}}],"parameters":{"binary_data_output":true}}`)
		body := append(append(append([]byte{}, header...), x...), y...)
		code, hdr, b := v2Do(t, "POST", url+"/v2/models/typed/infer", map[string]string{"Inference-Header-Content-Length": strconv.Itoa(len(header)), "Content-Type": "application/octet-stream"}, body)
		n, err := strconv.Atoi(hdr.Get("Inference-Header-Content-Length"))
		if code != 200 || err != nil || n > len(b) {
			t.Fatalf("%d %v %s", code, hdr, b)
		}
		var out v2Out
		json.Unmarshal(b[:n], &out)
		tail := b[n:]
		if len(out.Outputs) != 2 || out.Outputs[0].Parameters["binary_data_size"] != float64(16) || len(tail) != 32 ||
			!bytes.Equal(tail[:16], x) || !bytes.Equal(tail[16:20], y) {
			t.Fatalf("header %s, tail %v", b[:n], tail)
		}
		if hdr.Get("Server-Timing") == "" {
			t.Error("no Server-Timing on a /v2 inference")
		}
	})

	for _, tt := range []struct {
		name, path, body string
		code             int
		want             string
	}{
		{"unknown model", "/v2/models/nope/infer", `{"inputs":[]}`, 404, "not found"},
		{"not the current version", "/v2/models/typed/versions/00000000/infer", `{"inputs":[]}`, 404, "is not its current version"},
		{"missing input", "/v2/models/typed/infer", `{"inputs":[{"name":"x","datatype":"FP32","shape":[2,2],"data":[1,2,3,4]}]}`, 400, `input "y" is missing`},
		{"unknown input", "/v2/models/echo/infer", `{"inputs":[{"name":"INPUT0","datatype":"UINT8","shape":[1],"data":[1]},{"name":"extra","datatype":"UINT8","shape":[1],"data":[1]}]}`, 400, `input "extra" is not one of the model's inputs`},
		{"wrong datatype", "/v2/models/echo/infer", `{"inputs":[{"name":"INPUT0","datatype":"FP32","shape":[1],"data":[1]}]}`, 400, "datatype FP32, the model takes UINT8"},
		{"wrong shape", "/v2/models/typed/infer", `{"inputs":[{"name":"x","datatype":"FP32","shape":[4],"data":[1,2,3,4]},{"name":"y","datatype":"INT16","shape":[1],"data":[1]}]}`, 400, "shape [4] has 1 dimensions"},
		{"element count", "/v2/models/echo/infer", `{"inputs":[{"name":"INPUT0","datatype":"UINT8","shape":[3],"data":[1,2]}]}`, 400, "data has 2 elements, the shape holds 3"},
		{"out of range", "/v2/models/echo/infer", `{"inputs":[{"name":"INPUT0","datatype":"UINT8","shape":[1],"data":[256]}]}`, 400, "256 is not a UINT8"},
		{"bad JSON", "/v2/models/echo/infer", `{"inputs":`, 400, "invalid JSON"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			code, _, b := v2Do(t, "POST", url+tt.path, nil, []byte(tt.body))
			var out v2Out
			if err := json.Unmarshal(b, &out); err != nil || code != tt.code || !strings.Contains(out.Error, tt.want) {
				t.Fatalf("%d %s, want %d and an error containing %q", code, b, tt.code, tt.want)
			}
		})
	}
}

func numbers(ns []json.Number) []string {
	var s []string
	for _, n := range ns {
		s = append(s, n.String())
	}
	return s
}
