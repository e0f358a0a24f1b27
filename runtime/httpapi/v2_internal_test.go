package httpapi

import (
	"bytes"
	"fmt"
	"math"
	"net"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"github.com/valyala/fasthttp"

	"github.com/plover-run/plover/abi"
)

func TestFloat16(t *testing.T) {
	for _, tt := range []struct {
		f    float32
		bits uint16
	}{
		{0, 0x0000}, {1, 0x3c00}, {-2, 0xc000}, {0.5, 0x3800}, {65504, 0x7bff},
		{1e6, 0x7c00}, {float32(math.Inf(-1)), 0xfc00}, {5.960464477539063e-08, 0x0001}, {0.333251953125, 0x3555},
	} {
		if got := float16bits(tt.f); got != tt.bits {
			t.Errorf("float16bits(%v) = %#04x, want %#04x", tt.f, got, tt.bits)
		}
		if back := float16to32(tt.bits); tt.f < 65520 && tt.f > -65520 && back != tt.f {
			t.Errorf("float16to32(%#04x) = %v, want %v", tt.bits, back, tt.f)
		}
	}
}

// inferHeaders are inference headers with whether parse should take them
// itself (fast) rather than leave them to decode.
var inferHeaders = []struct {
	name, json string
	fast       bool
}{
	{"binary input and outputs", `{"inputs":[{"name":"INPUT0","datatype":"UINT8","shape":[64],"parameters":{"binary_data_size":64}}],"parameters":{"binary_data_output":true}}`, true},
	{"JSON data, id, outputs", `{"id":"r-1","inputs":[{"name":"x","datatype":"FP32","shape":[2,2],"data":[[1.5,2],[3,-4e-3]]},{"name":"y","datatype":"INT16","shape":[2],"data":[-3,300]}],"outputs":[{"name":"z","parameters":{"binary_data":true}},{"name":"rest"}]}`, true},
	{"whitespace everywhere", " \n{ \"inputs\" :\t[ { \"name\" : \"a\" , \"datatype\" : \"BOOL\" , \"shape\" : [ 2 ] , \"data\" : [ true , false ] } ] } \r\n", true},
	{"other parameters", `{"inputs":[{"name":"a","datatype":"UINT8","shape":[1],"parameters":{"binary_data_size":1,"note":"\"q\" \u00e9 \\ /","nested":{"a":[1,-2.5e+3,null,{}]},"binary_data":"x"}}],"parameters":{"sequence_id":7,"priority":0}}`, true},
	{"output parameters", `{"inputs":[],"outputs":[{"name":"o","datatype":"FP32","shape":[-1],"parameters":{"binary_data":false,"binary_data_size":"any","classification":3}}]}`, true},
	{"unknown keys", `{"model":{"deep":[[[]]],"s":"é"},"inputs":[{"name":"a","extra":[1,{"b":null}],"datatype":"UINT8","shape":[]}]}`, true},
	{"empty", `{}`, true},
	{"empty shape and parameters", `{"inputs":[{"name":"a","datatype":"UINT8","shape":[],"parameters":{}}],"parameters":{}}`, true},
	{"null data", `{"inputs":[{"name":"a","datatype":"UINT8","shape":[1],"data":null}]}`, true},
	{"negatives", `{"inputs":[{"name":"a","datatype":"UINT8","shape":[0,-1],"parameters":{"binary_data_size":-5}}]}`, true},
	{"minus zero", `{"inputs":[{"name":"a","datatype":"UINT8","shape":[1],"parameters":{"binary_data_size":-0}}]}`, false},
	{"largest integer taken", `{"inputs":[{"name":"a","datatype":"UINT8","shape":[999999999999999999]}]}`, true},

	{"case-folded key", `{"Inputs":[{"name":"a","datatype":"UINT8","shape":[1],"data":[1]}]}`, false},
	{"case-folded tensor key", `{"inputs":[{"NAME":"a","datatype":"UINT8","shape":[1],"data":[1]}]}`, false},
	{"duplicate key", `{"inputs":[],"inputs":[{"name":"a","datatype":"UINT8","shape":[1],"data":[1]}]}`, false},
	{"duplicate tensor key", `{"inputs":[{"name":"a","name":"b","datatype":"UINT8","shape":[1],"data":[1]}]}`, false},
	{"duplicate binary_data_size", `{"inputs":[{"name":"a","datatype":"UINT8","shape":[1],"parameters":{"binary_data_size":2,"binary_data_size":1}}]}`, false},
	{"duplicate parameters", `{"parameters":{"binary_data_output":true},"parameters":{"x":1}}`, false},
	{"escaped id", `{"id":"a\"b","inputs":[]}`, false},
	{"non-ASCII name", `{"inputs":[{"name":"é","datatype":"UINT8","shape":[1],"data":[1]}]}`, false},
	{"escaped key", `{"input\u0073":[]}`, false},
	{"fractional binary_data_size", `{"inputs":[{"name":"a","datatype":"UINT8","shape":[1],"parameters":{"binary_data_size":1.0}}]}`, false},
	{"string binary_data_size", `{"inputs":[{"name":"a","datatype":"UINT8","shape":[1],"parameters":{"binary_data_size":"1"}}]}`, false},
	{"huge binary_data_size", `{"inputs":[{"name":"a","datatype":"UINT8","shape":[1],"parameters":{"binary_data_size":99999999999999999999}}]}`, false},
	{"string binary_data_output", `{"inputs":[],"parameters":{"binary_data_output":"true"}}`, false},
	{"null inputs", `{"inputs":null}`, false},
	{"null name", `{"inputs":[{"name":null}]}`, false},
	{"19-digit dimension", `{"inputs":[{"name":"a","datatype":"UINT8","shape":[1000000000000000000]}]}`, false},
	{"trailing data", `{"inputs":[]} x`, false},
	{"deep unknown value", `{"x":` + strings.Repeat("[", 100) + strings.Repeat("]", 100) + `}`, false},

	// Invalid: decode's error stands.
	{"truncated", `{"inputs":`, false},
	{"not an object", `[]`, false},
	{"float dimension", `{"inputs":[{"name":"a","datatype":"UINT8","shape":[1.0]}]}`, false},
	{"leading zero", `{"inputs":[{"name":"a","datatype":"UINT8","shape":[01]}]}`, false},
	{"bad literal", `{"inputs":[],"parameters":{"binary_data_output":truex}}`, false},
	{"control character", "{\"id\":\"a\tb\"}", false},
	{"bad escape", `{"x":"\q"}`, false},
	{"short unicode escape", `{"x":"\u12"}`, false},
	{"trailing comma", `{"inputs":[],}`, false},
	{"number without digits", `{"x":-}`, false},
	{"bare fraction", `{"x":1.}`, false},
	{"bare exponent", `{"x":1e}`, false},
	{"empty", ``, false},
}

// comparable reduces a header to what the server acts on: outputs only by
// name and binary_data, shapes by their values (nil and empty alike).
func comparable(h *inferHeader) string {
	var b strings.Builder
	fmt.Fprintf(&b, "id=%q binaryOutput=%v\n", h.id, h.binaryOutput)
	for _, t := range h.inputs {
		shown := t.binSizeText // as a message shows it
		if shown == "" && t.hasBinSize {
			shown = strconv.FormatInt(t.binSize, 10)
		}
		fmt.Fprintf(&b, "in %q %q %v data=%q binSize=%v/%d/%v/%s\n", t.name, t.datatype, t.shape, t.data, t.hasBinSize, t.binSize, t.binSizeBad, shown)
	}
	for _, t := range h.outputs {
		fmt.Fprintf(&b, "out %q binary=%v\n", t.name, t.binary)
	}
	return b.String()
}

// checkParse: whatever parse takes, decode takes too, with the same meaning.
func checkParse(t *testing.T, header []byte) (fast bool) {
	t.Helper()
	var fastH, slowH inferHeader
	// Stale state from an earlier request must not leak into the next.
	fastH.parse([]byte(`{"id":"old","inputs":[{"name":"old","datatype":"FP64","shape":[9,9,9],"data":[1],"parameters":{"binary_data_size":3}}],"outputs":[{"name":"z","parameters":{"binary_data":true}}],"parameters":{"binary_data_output":true}}`))
	fast = fastH.parse(header)
	err := slowH.decode(header)
	if fast {
		if err != nil {
			t.Fatalf("parse took %q, which encoding/json refuses: %v", header, err)
		}
		if got, want := comparable(&fastH), comparable(&slowH); got != want {
			t.Fatalf("%q:\nparse:  %s\ndecode: %s", header, got, want)
		}
	}
	return fast
}

func TestInferHeaderParse(t *testing.T) {
	for _, tt := range inferHeaders {
		t.Run(tt.name, func(t *testing.T) {
			if fast := checkParse(t, []byte(tt.json)); fast != tt.fast {
				t.Errorf("parse took it: %v, want %v", fast, tt.fast)
			}
		})
	}
}

func FuzzInferHeader(f *testing.F) {
	for _, tt := range inferHeaders {
		f.Add([]byte(tt.json))
	}
	f.Fuzz(func(t *testing.T, header []byte) { checkParse(t, header) })
}

// The response header written by hand is byte for byte the one
// encoding/json writes from writeInferJSON's maps.
func TestWriteBinaryMatchesEncodingJSON(t *testing.T) {
	for _, tt := range []struct {
		name, id, model, version string
		decl                     []abi.Tensor
		out                      []byte
	}{
		{"raw", "", "bench", "0123abcd", abi.RawTensors.Outputs, []byte("hello")},
		{"id and shapes", "req-7", "cnn", "v1", []abi.Tensor{{Name: "z", Datatype: "FP32", Shape: []int64{2, 2}}, {Name: "rest", Datatype: "INT16", Shape: []int64{1, -1}}},
			make([]byte, 16+6)},
		{"strings encoding/json escapes", "<a&b> \"é\" \u2028\x01", "m", "v", []abi.Tensor{{Name: "o:1/x", Datatype: "UINT8", Shape: []int64{-1}}}, []byte{1, 2}},
		{"no bytes", "x", "m", "v", abi.RawTensors.Outputs, nil},
	} {
		t.Run(tt.name, func(t *testing.T) {
			vc := &v2Call{}
			vc.hdr = inferHeader{id: tt.id, binaryOutput: true}
			vc.req.Version, vc.req.Output = tt.version, tt.out
			var err error
			if vc.cuts, vc.dims, err = cutOutputs(tt.out, tt.decl, nil, nil); err != nil {
				t.Fatal(err)
			}
			var hand, std fasthttp.RequestCtx
			hand.Init(&fasthttp.Request{}, &net.TCPAddr{}, nil)
			std.Init(&fasthttp.Request{}, &net.TCPAddr{}, nil)
			writeBinary(&hand, vc, tt.model)
			writeInferJSON(&std, &vc.hdr, tt.model, tt.version, vc.cuts)
			for _, h := range []string{"Content-Type", "Inference-Header-Content-Length"} {
				if a, b := string(hand.Response.Header.Peek(h)), string(std.Response.Header.Peek(h)); a != b {
					t.Errorf("%s: by hand %q, encoding/json %q", h, a, b)
				}
			}
			if a, b := hand.Response.Body(), std.Response.Body(); !bytes.Equal(a, b) {
				t.Errorf("body by hand:\n%q\nencoding/json:\n%q", a, b)
			}
		})
	}
}

// layInputs hands over the binary bytes themselves when every input is in
// them, and lays inputs out in declared order otherwise.
func TestLayInputs(t *testing.T) {
	decl := []abi.Tensor{{Name: "a", Datatype: "UINT8", Shape: []int64{2}}, {Name: "b", Datatype: "INT16", Shape: []int64{-1}}}
	bin := []byte{1, 2, 3, 0, 4, 0}
	a := inferTensor{name: "a", datatype: "UINT8", shape: []int64{2}, hasBinSize: true, binSize: 2}
	bBin := inferTensor{name: "b", datatype: "INT16", shape: []int64{2}, hasBinSize: true, binSize: 4}
	bJSON := inferTensor{name: "b", datatype: "INT16", shape: []int64{2}, data: []byte("[3,4]")}
	many := make([]inferTensor, 20)
	for i := range many {
		many[i] = inferTensor{name: fmt.Sprint("t", i)}
	}
	for _, tt := range []struct {
		name    string
		got     []inferTensor
		bin     []byte
		want    []byte
		aliases bool // the result is bin's own bytes
		err     string
	}{
		{name: "all binary", got: []inferTensor{a, bBin}, bin: bin, want: bin, aliases: true},
		{name: "all binary, request order differs", got: []inferTensor{bBin, a}, bin: bin, want: bin, aliases: true},
		{name: "mixed", got: []inferTensor{bJSON, a}, bin: bin[:2], want: bin},
		{name: "missing", got: []inferTensor{a}, bin: bin[:2], err: `input "b" is missing (the model takes a, b)`},
		{name: "twice", got: []inferTensor{a, bBin, a}, bin: bin, err: `input "a" is given twice`},
		{name: "unknown", got: []inferTensor{a, bBin, {name: "c"}}, bin: bin, err: `input "c" is not one of the model's inputs (a, b)`},
		{name: "bytes left", got: []inferTensor{a, bBin}, bin: append(bin[:6:6], 9), err: "1 bytes of binary data after the last input"},
		{name: "size mismatch", got: []inferTensor{{name: "a", datatype: "UINT8", shape: []int64{2}, hasBinSize: true, binSize: 3}, bBin}, bin: bin,
			err: `input "a": binary_data_size 3: want 2 bytes (shape [2] of UINT8), with that many left in the body`},
		{name: "size not an integer", got: []inferTensor{{name: "a", datatype: "UINT8", shape: []int64{2}, hasBinSize: true, binSizeBad: true, binSizeText: "2.0"}, bBin}, bin: bin,
			err: `input "a": binary_data_size 2.0: want 2 bytes`},
		{name: "size null", got: []inferTensor{{name: "a", datatype: "UINT8", shape: []int64{2}, hasBinSize: true, binSizeBad: true, binSizeText: "<nil>"}, bBin}, bin: bin,
			err: `input "a": binary_data_size <nil>: want 2 bytes`},
		{name: "many inputs, one twice", got: append(many, many[3]), err: `input "t3" is given twice`},
		{name: "many inputs, unknown", got: many, err: `input "a" is missing`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			in, _, err := layInputs(tt.got, decl, tt.bin, nil)
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("err %v, want %q", err, tt.err)
				}
				return
			}
			if err != nil || !bytes.Equal(in, tt.want) {
				t.Fatalf("%v %v, want %v", in, err, tt.want)
			}
			if aliases := len(in) > 0 && &in[0] == &tt.bin[0]; aliases != tt.aliases {
				t.Errorf("result is the body's bytes: %v, want %v", aliases, tt.aliases)
			}
		})
	}
}

// parseV2Model splits as strings.Split did before it borrowed the path.
func TestParseV2Model(t *testing.T) {
	for _, tt := range []struct {
		path                  string
		name, version, action string
		ok                    bool
	}{
		{"echo", "echo", "", "", true},
		{"echo/infer", "echo", "", "infer", true},
		{"echo/ready", "echo", "", "ready", true},
		{"echo/versions/abc", "echo", "abc", "", true},
		{"echo/versions/abc/infer", "echo", "abc", "infer", true},
		{"echo/versions//ready", "echo", "", "ready", true},
		{"echo/versions", "", "", "", false},
		{"echo/", "", "", "", false},
		{"/infer", "", "", "", false},
		{"", "", "", "", false},
		{"echo/bogus", "", "", "", false},
		{"echo/versions/abc/infer/x", "", "", "", false},
		{"echo/versions/abc/infer/x/y/z", "", "", "", false},
	} {
		name, version, action, ok := parseV2Model([]byte(tt.path))
		if !ok && !tt.ok {
			continue // the rest is not used
		}
		if got, want := []any{name, version, action, ok}, []any{tt.name, tt.version, tt.action, tt.ok}; !reflect.DeepEqual(got, want) {
			t.Errorf("parseV2Model(%q) = %v, want %v", tt.path, got, want)
		}
	}
}
