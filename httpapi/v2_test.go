package httpapi_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"io"
	"math"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/bundle"
	"github.com/plover-run/plover/engine"
	"github.com/plover-run/plover/errdefs"
	"github.com/plover-run/plover/httpapi"
	"github.com/plover-run/plover/internal/testkit"
)

// v2Do sends one request with the headers hdr ("Host" names the request's
// host) and returns its status, headers and body.
func v2Do(t *testing.T, method, url string, hdr map[string]string, body []byte) (int, http.Header, []byte) {
	t.Helper()
	req, _ := http.NewRequest(method, url, bytes.NewReader(body))
	for k, v := range hdr {
		if k == "Host" {
			req.Host = v
		}
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
	e := testkit.Engine(t, engine.Config{})
	raw := testkit.Manifest("echo") // echo: out = input, zero-padded to out_bytes
	testkit.Deploy(t, e, testkit.BundleDir(t, raw, nil))
	typed := testkit.Typed("typed")
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

	// The outputs asked for are answered, in the request's order; one the
	// model does not have, or one asked for twice, is a 400 before the run
	// (as over gRPC: InvalidArgument).
	t.Run("requested outputs", func(t *testing.T) {
		in := `{"inputs":[{"name":"y","datatype":"INT16","shape":[2],"data":[-3,300]},{"name":"x","datatype":"FP32","shape":[2,2],"data":[[1.5,2],[3,-4]]}],`
		code, _, b := v2Do(t, "POST", url+"/v2/models/typed/infer", nil, []byte(in+`"outputs":[{"name":"rest"}]}`))
		var out v2Out
		json.Unmarshal(b, &out)
		if code != 200 || len(out.Outputs) != 1 || out.Outputs[0].Name != "rest" || out.Outputs[0].Data[1] != "300" {
			t.Fatalf("rest alone: %d %s", code, b)
		}
		header := []byte(in + `"outputs":[{"name":"rest","parameters":{"binary_data":true}},{"name":"z","parameters":{"binary_data":true}}]}`)
		code, hdr, b := v2Do(t, "POST", url+"/v2/models/typed/infer", map[string]string{"Inference-Header-Content-Length": strconv.Itoa(len(header)), "Content-Type": "application/octet-stream"}, header)
		n, err := strconv.Atoi(hdr.Get("Inference-Header-Content-Length"))
		if code != 200 || err != nil || n > len(b) {
			t.Fatalf("rest then z, binary: %d %v %s", code, hdr, b)
		}
		out = v2Out{}
		json.Unmarshal(b[:n], &out)
		z := make([]byte, 16)
		for i, f := range []float32{1.5, 2, 3, -4} {
			binary.LittleEndian.PutUint32(z[4*i:], math.Float32bits(f))
		}
		if tail := b[n:]; len(out.Outputs) != 2 || out.Outputs[0].Name != "rest" || out.Outputs[1].Name != "z" || len(tail) != 32 ||
			!bytes.Equal(tail[:4], []byte{0xfd, 0xff, 0x2c, 0x01}) || !bytes.Equal(tail[16:], z) {
			t.Fatalf("rest then z, binary: header %s, tail %v", b[:n], b[n:])
		}
		for _, tc := range []struct{ outputs, want string }{
			{`[{"name":"nope"}]`, `output \"nope\" is not one of the model's outputs (z, rest)`},
			{`[{"name":"z"},{"name":"z"}]`, `output \"z\" is asked for twice`},
		} {
			code, _, b := v2Do(t, "POST", url+"/v2/models/typed/infer", nil, []byte(in+`"outputs":`+tc.outputs+`}`))
			if code != 400 || !strings.Contains(string(b), tc.want) {
				t.Errorf("outputs %s: %d %s, want 400 saying %s", tc.outputs, code, b, tc.want)
			}
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
		{"an unknown version", "/v2/models/typed/versions/00000000/infer", `{"inputs":[]}`, 404, "has no version"},
		{"missing input", "/v2/models/typed/infer", `{"inputs":[{"name":"x","datatype":"FP32","shape":[2,2],"data":[1,2,3,4]}]}`, 400, `input "y" is missing`},
		{"unknown input", "/v2/models/echo/infer", `{"inputs":[{"name":"INPUT0","datatype":"UINT8","shape":[1],"data":[1]},{"name":"extra","datatype":"UINT8","shape":[1],"data":[1]}]}`, 400, `input "extra" is not one of the model's inputs`},
		{"no datatype", "/v2/models/echo/infer", `{"inputs":[{"name":"INPUT0","shape":[1],"data":[1]}]}`, 400, `input "INPUT0": no datatype given; the model takes UINT8`},
		{"wrong datatype", "/v2/models/echo/infer", `{"inputs":[{"name":"INPUT0","datatype":"FP32","shape":[1],"data":[1]}]}`, 400, "datatype FP32, the model takes UINT8"},
		{"wrong shape", "/v2/models/typed/infer", `{"inputs":[{"name":"x","datatype":"FP32","shape":[4],"data":[1,2,3,4]},{"name":"y","datatype":"INT16","shape":[1],"data":[1]}]}`, 400, "shape [4] has 1 dimensions"},
		{"element count", "/v2/models/echo/infer", `{"inputs":[{"name":"INPUT0","datatype":"UINT8","shape":[3],"data":[1,2]}]}`, 400, `input "INPUT0": inputs[0].data holds 2 elements, its shape holds 3`},
		{"out of range", "/v2/models/echo/infer", `{"inputs":[{"name":"INPUT0","datatype":"UINT8","shape":[1],"data":[256]}]}`, 400, "256 is not a UINT8"},
		{"bad JSON", "/v2/models/echo/infer", `{"inputs":`, 400, "invalid JSON"},
		// Inputs past the function's max_input_bytes (echo: 64 KiB) are a
		// 413 naming the input, in gRPC's words, before its data is read.
		{"over max_input_bytes", "/v2/models/echo/infer", `{"inputs":[{"name":"INPUT0","datatype":"UINT8","shape":[70000],"data":[0]}]}`, 413,
			`input "INPUT0" (shape [70000] of UINT8) brings the inputs to 70000 bytes; model echo takes at most 65536 (max_input_bytes)`},
		// A byte size past int64, given as the number it overflows to:
		// refused, not sliced with (which took the server down), as too
		// large, as one just under it is (it was a 400).
		{"byte size overflows", "/v2/models/typed/infer", `{"inputs":[{"name":"x","datatype":"FP32","shape":[2,2],"data":[1,2,3,4]},` +
			`{"name":"y","datatype":"INT16","shape":[4611686018427387904],"parameters":{"binary_data_size":-9223372036854775808}}]}`, 413, `input "y": shape [4611686018427387904] of INT16: its byte size overflows an int64`},
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

// Every error under /v2 is the protocol's {"error": "..."}, refusals made
// before routing (authentication, authorization, method, a smuggling-shaped
// request) included, with their status and headers; /v1 keeps Plover's.
func TestV2ErrorShape(t *testing.T) {
	e := testkit.Engine(t, engine.Config{})
	testkit.Deploy(t, e, testkit.BundleDir(t, testkit.Manifest("echo"), nil))
	tab, tok := benchTokens(t) // invoke, on "bench" only
	open := testkit.Serve(t, e, httpapi.Options{})
	authed := testkit.ServeTokens(t, e, tab, httpapi.Options{})
	bearer := map[string]string{"Authorization": "Bearer " + tok}
	infer := `{"inputs":[{"name":"INPUT0","datatype":"UINT8","shape":[1],"data":[1]}]}`

	for _, tt := range []struct {
		name, url, method, path string
		hdr                     map[string]string
		raw                     string // sent as is instead, on a connection of its own
		code                    int
		header, value           string // a header the response must carry
		want                    string // in the message
		plover                  bool   // Plover's error object, not the protocol's
	}{
		{name: "no token", url: authed, method: "POST", path: "/v2/models/echo/infer", code: 401,
			header: "WWW-Authenticate", value: `Bearer realm="plover"`, want: "needs a token"},
		{name: "unknown token", url: authed, method: "GET", path: "/v2/models/echo", hdr: map[string]string{"Authorization": "Bearer nope"}, code: 401,
			header: "WWW-Authenticate", value: `Bearer realm="plover"`, want: "not known"},
		{name: "token for another function", url: authed, method: "POST", path: "/v2/models/echo/infer", hdr: bearer, code: 403, want: "echo"},
		{name: "token without read", url: authed, method: "GET", path: "/v2/models/bench/ready", hdr: bearer, code: 403, want: "read"},
		{name: "infer by GET", url: open, method: "GET", path: "/v2/models/echo/infer", code: 405, header: "Allow", value: "POST", want: "use POST"},
		{name: "metadata by POST", url: open, method: "POST", path: "/v2/models/echo/versions/00000000", code: 405, header: "Allow", value: "GET"},
		{name: "server metadata by DELETE", url: open, method: "DELETE", path: "/v2", code: 405, header: "Allow", value: "GET"},
		{name: "health by POST, behind tokens", url: authed, method: "POST", path: "/v2/health/live", code: 405, header: "Allow", value: "GET"},
		{name: "both Content-Length and Transfer-Encoding", url: open, code: 400, want: "Transfer-Encoding",
			raw: "POST /v2/models/echo/infer HTTP/1.1\r\nHost: localhost\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"},
		{name: "/v1 keeps Plover's", url: authed, method: "GET", path: "/v1/functions", code: 401,
			header: "WWW-Authenticate", value: `Bearer realm="plover"`, plover: true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var code int
			var hdr http.Header
			var b []byte
			if tt.raw != "" {
				code, hdr, b = rawOnce(t, strings.TrimPrefix(tt.url, "http://"), tt.raw)
			} else {
				body := []byte(nil)
				if tt.method == "POST" {
					body = []byte(infer)
				}
				code, hdr, b = v2Do(t, tt.method, tt.url+tt.path, tt.hdr, body)
			}
			if code != tt.code || (tt.header != "" && hdr.Get(tt.header) != tt.value) {
				t.Fatalf("%d, %s: %q; want %d, %s: %q (%s)", code, tt.header, hdr.Get(tt.header), tt.code, tt.header, tt.value, b)
			}
			var v2 struct {
				Error *string `json:"error"`
			}
			var plover struct {
				Error *struct{ Code, Message string } `json:"error"`
			}
			dec := json.NewDecoder(bytes.NewReader(b))
			dec.DisallowUnknownFields()
			if tt.plover {
				if err := dec.Decode(&plover); err != nil || plover.Error == nil || plover.Error.Code == "" {
					t.Fatalf("want Plover's error object: %v: %s", err, b)
				}
				return
			}
			if err := dec.Decode(&v2); err != nil || v2.Error == nil || !strings.Contains(*v2.Error, tt.want) {
				t.Fatalf(`want {"error": "...%s..."}: %v: %s`, tt.want, err, b)
			}
			if ct := hdr.Get("Content-Type"); ct != "application/json" {
				t.Errorf("Content-Type %q", ct)
			}
		})
	}
}

// rawOnce writes raw on a fresh connection and reads one response.
func rawOnce(t *testing.T, addr, raw string) (int, http.Header, []byte) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := io.WriteString(c, raw); err != nil {
		t.Fatal(err)
	}
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, b
}

// The binary extension's bytes hold the binary inputs in the order the
// request lists them; the function gets its inputs back to back in declared
// order, whatever order the request lists them in and whichever of them
// come as JSON data. (echo answers with its input, zero-padded.)
func TestV2BinaryInputOrder(t *testing.T) {
	e := testkit.Engine(t, engine.Config{})
	m := testkit.Manifest("trio")
	m.OutBytes = 32
	m.Tensors = &abi.Tensors{
		Inputs: []abi.Tensor{{Name: "p", Datatype: "UINT8", Shape: []int64{3}}, {Name: "q", Datatype: "FP32", Shape: []int64{2}},
			{Name: "r", Datatype: "INT16", Shape: []int64{-1}}},
		Outputs: []abi.Tensor{{Name: "o", Datatype: "UINT8", Shape: []int64{-1}}},
	}
	testkit.Deploy(t, e, testkit.BundleDir(t, m, nil))
	url := testkit.Serve(t, e, httpapi.Options{})

	q := binary.LittleEndian.AppendUint32(nil, math.Float32bits(1.5))
	q = binary.LittleEndian.AppendUint32(q, math.Float32bits(-2))
	inputs := map[string]struct {
		datatype, shape, data string
		bytes                 []byte
	}{
		"p": {"UINT8", "[3]", "[1,2,3]", []byte{1, 2, 3}},
		"q": {"FP32", "[2]", "[1.5,-2]", q},
		"r": {"INT16", "[3]", "[-3,300,7]", []byte{0xfd, 0xff, 0x2c, 0x01, 7, 0}},
	}
	declared := append(append(append([]byte{}, inputs["p"].bytes...), inputs["q"].bytes...), inputs["r"].bytes...)

	for _, tt := range []struct {
		name   string
		order  []string // as the request lists them
		binary string   // the ones sent in binary
	}{
		{"declared order, all binary", []string{"p", "q", "r"}, "pqr"},
		{"reversed, all binary", []string{"r", "q", "p"}, "pqr"},
		{"rotated, all binary", []string{"q", "r", "p"}, "pqr"},
		{"two swapped, all binary", []string{"p", "r", "q"}, "pqr"},
		{"declared order, mixed", []string{"p", "q", "r"}, "pr"},
		{"reversed, mixed", []string{"r", "q", "p"}, "pr"},
		{"JSON listed first, binary out of order", []string{"q", "r", "p"}, "pr"},
		{"binary listed first, in order", []string{"p", "q", "r"}, "pq"},
		{"one binary", []string{"r", "p", "q"}, "q"},
		{"all JSON", []string{"r", "p", "q"}, ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var ins []string
			var bin []byte
			for _, n := range tt.order {
				in := inputs[n]
				js := `{"name":"` + n + `","datatype":"` + in.datatype + `","shape":` + in.shape
				if strings.Contains(tt.binary, n) {
					js += `,"parameters":{"binary_data_size":` + strconv.Itoa(len(in.bytes)) + `}}`
					bin = append(bin, in.bytes...)
				} else {
					js += `,"data":` + in.data + `}`
				}
				ins = append(ins, js)
			}
			header := []byte(`{"inputs":[` + strings.Join(ins, ",") + `],"parameters":{"binary_data_output":true}}`)
			code, hdr, b := v2Do(t, "POST", url+"/v2/models/trio/infer",
				map[string]string{"Inference-Header-Content-Length": strconv.Itoa(len(header)), "Content-Type": "application/octet-stream"},
				append(header, bin...))
			n, err := strconv.Atoi(hdr.Get("Inference-Header-Content-Length"))
			if code != 200 || err != nil || n > len(b) {
				t.Fatalf("%d %v %s", code, hdr, b)
			}
			want := append(append([]byte{}, declared...), make([]byte, int(m.OutBytes)-len(declared))...)
			if got := b[n:]; !bytes.Equal(got, want) {
				t.Fatalf("the function got %v, want %v (p, q, r in declared order)", got, want)
			}
		})
	}
}

// A shape whose byte size overflows is refused at deploy, naming the
// field: deployed, /v2 cut its output at a negative length, and the
// handler's panic ended the server for every tenant.
func TestV2TensorShapeOverflowRefused(t *testing.T) {
	e := testkit.Engine(t, engine.Config{})
	lib, err := os.ReadFile(testkit.BuildLib(t, testkit.KernelsSource(), t.TempDir(), "kernels.so"))
	if err != nil {
		t.Fatal(err)
	}
	// 2^61+1 FP32s: 2^63+4 bytes, negative in an int64. Packed by hand:
	// plover deploy would refuse it.
	b := testkit.RawBundle(t, [2]string{"plover.json", `{"name":"huge","abi":2,"target":"host","library":"kernels.so","max_input_bytes":16,"out_bytes":16,` +
		`"chain":[{"kernel":"echo","grid":1,"block":16}],"tensors":{"inputs":[{"name":"x","datatype":"UINT8","shape":[16]}],` +
		`"outputs":[{"name":"y","datatype":"FP32","shape":[2305843009213693953]}]}}`}, [2]string{"kernels.so", string(lib)})
	_, err = e.Control().Deploy(context.Background(), "huge", bytes.NewReader(b), false)
	if err == nil {
		url := testkit.Serve(t, e, httpapi.Options{})
		code, _, body := v2Do(t, "POST", url+"/v2/models/huge/infer", nil, []byte(`{"inputs":[{"name":"x","datatype":"UINT8","shape":[16],"data":[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16]}]}`))
		t.Fatalf("deployed; /v2 answered %d %s", code, body)
	}
	if errdefs.KindOf(err) != errdefs.KindInvalid || !strings.Contains(err.Error(), "tensors.outputs[0].shape: [2305843009213693953] of FP32 takes more than 1073741824 bytes") {
		t.Fatalf("deploy: %v (kind %v), want 422 naming tensors.outputs[0].shape", err, errdefs.KindOf(err))
	}
}

// An output with NaN or an infinity, asked for as JSON data, is the
// protocol's error object with a 500 naming it and the binary extension
// (JSON has no numbers for those values), counted as a 500; asked for in
// binary it is a response. The function echoes the input's bytes: output y
// is its first 8 (two FP32), w the next 8 (one FP64).
func TestV2NonFiniteOutputs(t *testing.T) {
	e := testkit.Engine(t, engine.Config{})
	m := testkit.Manifest("floats")
	m.OutBytes = 16
	m.Tensors = &abi.Tensors{
		Inputs:  []abi.Tensor{{Name: "x", Datatype: "UINT8", Shape: []int64{16}}},
		Outputs: []abi.Tensor{{Name: "y", Datatype: "FP32", Shape: []int64{2}}, {Name: "w", Datatype: "FP64", Shape: []int64{1}}},
	}
	testkit.Deploy(t, e, testkit.BundleDir(t, m, nil))
	url := testkit.Serve(t, e, httpapi.Options{})
	x := func(y0, y1 float32, w float64) []byte {
		b := binary.LittleEndian.AppendUint32(nil, math.Float32bits(y0))
		b = binary.LittleEndian.AppendUint32(b, math.Float32bits(y1))
		return binary.LittleEndian.AppendUint64(b, math.Float64bits(w))
	}
	nan, inf := float32(math.NaN()), math.Inf(1)

	for _, tt := range []struct {
		name    string
		x       []byte
		params  string // the request's, after "inputs"
		code    int
		err     string // 500: in the message
		jsonOut string // 200: in the JSON header
	}{
		{"NaN", x(1, nan, 2), ``, 500, `output "y": element 1 is NaN`, ""},
		{"+Inf", x(float32(inf), 1, 2), ``, 500, `output "y": element 0 is +Inf`, ""},
		{"-Inf, FP64", x(1, 2, math.Inf(-1)), ``, 500, `output "w": element 0 is -Inf`, ""},
		{"NaN in the one asked for as JSON", x(nan, 1, inf), `,"outputs":[{"name":"y","parameters":{"binary_data":true}},{"name":"w"}]`, 500, `output "w": element 0 is +Inf`, ""},
		{"NaN asked for in binary", x(nan, 1, 2.5), `,"outputs":[{"name":"y","parameters":{"binary_data":true}},{"name":"w"}]`, 200, "", `"data":[2.5]`},
		{"NaN in an output not asked for", x(1, 2, math.NaN()), `,"outputs":[{"name":"y"}]`, 200, "", `"data":[1,2]`},
		{"all binary", x(nan, float32(inf), math.NaN()), `,"parameters":{"binary_data_output":true}`, 200, "", `"binary_data_size":8`},
		{"finite", x(1.5, -2, 0.25), ``, 200, "", `"data":[1.5,-2]`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			header := []byte(`{"inputs":[{"name":"x","datatype":"UINT8","shape":[16],"parameters":{"binary_data_size":16}}]` + tt.params + `}`)
			code, hdr, b := v2Do(t, "POST", url+"/v2/models/floats/infer",
				map[string]string{"Inference-Header-Content-Length": strconv.Itoa(len(header)), "Content-Type": "application/octet-stream"},
				append(header, tt.x...))
			if code != tt.code {
				t.Fatalf("%d %q, want %d", code, b, tt.code)
			}
			if tt.code != 200 {
				var v2 struct {
					Error *string `json:"error"`
				}
				dec := json.NewDecoder(bytes.NewReader(b))
				dec.DisallowUnknownFields()
				if err := dec.Decode(&v2); err != nil || v2.Error == nil || !strings.Contains(*v2.Error, tt.err) || !strings.Contains(*v2.Error, "binary_data_output") {
					t.Fatalf(`want {"error": "...%s... binary_data_output..."}: %v: %s`, tt.err, err, b)
				}
				if ct := hdr.Get("Content-Type"); ct != "application/json" {
					t.Errorf("Content-Type %q", ct)
				}
				return
			}
			n := len(b)
			if h := hdr.Get("Inference-Header-Content-Length"); h != "" {
				n, _ = strconv.Atoi(h)
			}
			if n > len(b) || !json.Valid(b[:n]) || !strings.Contains(string(b[:n]), tt.jsonOut) {
				t.Fatalf("%s, want a JSON header holding %s", b, tt.jsonOut)
			}
			if tail := b[n:]; len(tail) > 0 && !bytes.Equal(tail, tt.x[:len(tail)]) {
				t.Errorf("binary outputs %v, want %v", tail, tt.x[:len(tail)])
			}
		})
	}
	_, _, b := v2Do(t, "GET", url+"/metrics", nil, nil)
	if want := `plover_requests_total{code="500",function="floats"} 4`; !strings.Contains(string(b), want) {
		t.Errorf("/metrics lacks %s", want)
	}
}

// /v2 refusals are written and counted as on /v1: a bad timeout header is
// a 400 naming it (before the body is read), an unknown version a 404, and
// both reach plover_requests_total.
func TestV2RefusalsCounted(t *testing.T) {
	e := testkit.Engine(t, engine.Config{})
	testkit.Deploy(t, e, testkit.BundleDir(t, testkit.Manifest("echo"), nil))
	url := testkit.Serve(t, e, httpapi.Options{})
	body := []byte(`{"inputs":[{"name":"INPUT0","datatype":"UINT8","shape":[1],"data":[1]}]}`)
	for _, tt := range []struct {
		name, path string
		hdr        map[string]string
		code       int
		msg        string
	}{
		{"bad timeout", "/v2/models/echo/infer", map[string]string{"X-Plover-Timeout-Ms": "soon"}, 400, "X-Plover-Timeout-Ms"},
		{"unknown version", "/v2/models/echo/versions/0123456789/infer", nil, 404, "has no version"},
	} {
		code, _, b := v2Do(t, "POST", url+tt.path, tt.hdr, body)
		if code != tt.code || !strings.Contains(string(b), tt.msg) || !strings.HasPrefix(string(b), `{"error":`) {
			t.Errorf("%s: %d %s, want %d naming %q in the protocol's error object", tt.name, code, b, tt.code, tt.msg)
		}
	}
	_, _, m := v2Do(t, "GET", url+"/metrics", nil, nil)
	// Refused requests of a function that has not yet served one are
	// counted under _unknown, as on /v1 (names in bad requests are the
	// client's, not a bound on the series).
	for _, want := range []string{`plover_requests_total{code="400",function="_unknown"} 1`, `plover_requests_total{code="404",function="_unknown"} 1`} {
		if !strings.Contains(string(m), want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
}

// /v2 runs the version a path names, current or not, by id, prefix or
// label (a model repository's version folder), as Triton runs any
// available version; metadata and ready answer for it.
func TestV2RunsNamedVersion(t *testing.T) {
	e := testkit.Engine(t, engine.Config{})
	deploy := func(label string, out int64, aside bool) string {
		m := testkit.Manifest("echo")
		m.OutBytes = out // tells the versions' answers apart
		b, _, _, err := bundle.PackBytes(testkit.BundleDir(t, m, nil))
		if err != nil {
			t.Fatal(err)
		}
		fi, err := e.Control().DeployLabeled(context.Background(), "echo", label, aside, bytes.NewReader(b))
		if err != nil {
			t.Fatal(err)
		}
		return fi.Version
	}
	// 2 first, then 1 beside it (a lower version folder added later): 2
	// stays current.
	v2 := deploy("2", 256, false)
	v1 := deploy("1", 128, true)
	url := testkit.Serve(t, e, httpapi.Options{})
	body := []byte(`{"inputs":[{"name":"INPUT0","datatype":"UINT8","shape":[3],"data":[7,8,9]}]}`)
	for _, c := range []struct {
		path, ran string
		out       int
		code      int
	}{
		{"/v2/models/echo/infer", v2, 256, 200},
		{"/v2/models/echo/versions/1/infer", v1, 128, 200},
		{"/v2/models/echo/versions/" + v1 + "/infer", v1, 128, 200},
		{"/v2/models/echo/versions/" + v1[:8] + "/infer", v1, 128, 200},
		{"/v2/models/echo/versions/2/infer", v2, 256, 200},
		{"/v2/models/echo/versions/3/infer", "", 0, 404},
	} {
		code, h, b := v2Do(t, "POST", url+c.path, nil, body)
		var out v2Out
		json.Unmarshal(b, &out)
		if code != c.code || h.Get("X-Plover-Version") != c.ran || (code == 200 && len(out.Outputs[0].Data) != c.out) {
			t.Errorf("%s: %d ran %q (want %d, %q) %.200s", c.path, code, h.Get("X-Plover-Version"), c.code, c.ran, b)
		}
	}
	// Version folder 1 deployed again (changed): its label names the new
	// deploy, not the old one this node has loaded beside the current.
	v1b := deploy("1", 64, true)
	code, h, b := v2Do(t, "POST", url+"/v2/models/echo/versions/1/infer", nil, body)
	var out v2Out
	json.Unmarshal(b, &out)
	if code != 200 || h.Get("X-Plover-Version") != v1b || len(out.Outputs[0].Data) != 64 {
		t.Errorf("label 1 after its redeploy: %d ran %q (want %s) %.200s", code, h.Get("X-Plover-Version"), v1b, b)
	}
	for path, code := range map[string]int{"/v2/models/echo/versions/1": 200, "/v2/models/echo/versions/1/ready": 200, "/v2/models/echo/versions/3": 404} {
		got, _, b := v2Do(t, "GET", url+path, nil, nil)
		if got != code || (code == 200 && path == "/v2/models/echo/versions/1" && !strings.Contains(string(b), v1b)) {
			t.Errorf("GET %s: %d %s, want %d", path, got, b, code)
		}
	}
}
