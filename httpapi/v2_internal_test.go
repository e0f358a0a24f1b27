package httpapi

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math"
	"net"
	"reflect"
	"strings"
	"testing"

	"github.com/valyala/fasthttp"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/oip"
)

func TestFloat16(t *testing.T) {
	for _, tt := range []struct {
		f     float64
		bits  uint16
		exact bool // f is a half: it comes back whole
	}{
		{0, 0x0000, true}, {1, 0x3c00, true}, {-2, 0xc000, true}, {0.5, 0x3800, true}, {65504, 0x7bff, true},
		{1e6, 0x7c00, false}, {math.Inf(-1), 0xfc00, false}, {5.960464477539063e-08, 0x0001, true}, {0.333251953125, 0x3555, true},
		// Rounded once, from the float64 (through a float32 the first
		// two went the other way): just past a tie, just under the
		// overflow point, the overflow point, a tie (to even), and a
		// subnormal tie (to even: zero) and just past it.
		{1.000488282181322574615478515625, 0x3c01, false}, {65519.999, 0x7bff, false}, {65520, 0x7c00, false}, {1.00048828125, 0x3c00, false},
		{math.Ldexp(1, -25), 0x0000, false}, {math.Nextafter(math.Ldexp(1, -25), 1), 0x0001, false},
	} {
		if got := float16bits(tt.f); got != tt.bits {
			t.Errorf("float16bits(%v) = %#04x, want %#04x", tt.f, got, tt.bits)
		}
		if back := float64(float16to32(tt.bits)); tt.exact && back != tt.f {
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
		fmt.Fprintf(&b, "in %q %q %v data=%q binSize=%v/%d\n", t.name, t.datatype, t.shape, t.data, t.hasBinSize, t.binSize)
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
		// The two count a header's parts alike, so refuse the same.
		if fastH.parts != slowH.parts {
			t.Fatalf("%q: parse counts %d parts, decode %d", header, fastH.parts, slowH.parts)
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
			if vc.cuts, vc.dims, err = oip.CutOutputs(tt.out, tt.decl, nil, nil); err != nil {
				t.Fatal(err)
			}
			vc.ans = vc.cuts
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

// layInputs takes each binary input's bytes at its place in request order
// (the binary extension's bytes hold the binary inputs in the order the
// request lists them) and lays the inputs out in declared order; it hands
// over the binary bytes themselves only when they already are that layout.
func TestLayInputs(t *testing.T) {
	decl := []abi.Tensor{{Name: "a", Datatype: "UINT8", Shape: []int64{2}}, {Name: "b", Datatype: "INT16", Shape: []int64{-1}}}
	decl3 := append(decl[:2:2], abi.Tensor{Name: "c", Datatype: "FP32", Shape: []int64{1}})
	bin := []byte{1, 2, 3, 0, 4, 0} // a, then b: the declared layout
	c := []byte{0, 0, 0xc0, 0x3f}   // 1.5
	cat := func(bs ...[]byte) []byte { return bytes.Join(bs, nil) }
	a := inferTensor{name: "a", datatype: "UINT8", shape: []int64{2}, hasBinSize: true, binSize: 2}
	aJSON := inferTensor{name: "a", datatype: "UINT8", shape: []int64{2}, data: []byte("[1,2]")}
	bBin := inferTensor{name: "b", datatype: "INT16", shape: []int64{2}, hasBinSize: true, binSize: 4}
	bJSON := inferTensor{name: "b", datatype: "INT16", shape: []int64{2}, data: []byte("[3,4]")}
	bEmpty := inferTensor{name: "b", datatype: "INT16", shape: []int64{0}, hasBinSize: true, binSize: 0}
	cBin := inferTensor{name: "c", datatype: "FP32", shape: []int64{1}, hasBinSize: true, binSize: 4}
	cJSON := inferTensor{name: "c", datatype: "FP32", shape: []int64{1}, data: []byte("[1.5]")}
	many := make([]inferTensor, 20)
	for i := range many {
		many[i] = inferTensor{name: fmt.Sprint("t", i)}
	}
	// Enough inputs for layInputs' map, all binary, listed in reverse.
	var declMany []abi.Tensor
	var manyRev []inferTensor
	var manyBin, manyWant []byte
	for i := range 20 {
		n := fmt.Sprint("m", i)
		declMany = append(declMany, abi.Tensor{Name: n, Datatype: "UINT8", Shape: []int64{1}})
		manyRev = append([]inferTensor{{name: n, datatype: "UINT8", shape: []int64{1}, hasBinSize: true, binSize: 1}}, manyRev...)
		manyBin = append([]byte{byte(i)}, manyBin...)
		manyWant = append(manyWant, byte(i))
	}
	for _, tt := range []struct {
		name    string
		decl    []abi.Tensor // decl when nil
		got     []inferTensor
		bin     []byte
		want    []byte
		aliases bool // the result is bin's own bytes
		err     string
	}{
		{name: "all binary", got: []inferTensor{a, bBin}, bin: bin, want: bin, aliases: true},
		{name: "all binary, request order differs", got: []inferTensor{bBin, a}, bin: cat(bin[2:], bin[:2]), want: bin},
		{name: "all binary, an empty input", got: []inferTensor{a, bEmpty}, bin: bin[:2], want: bin[:2], aliases: true},
		{name: "all binary, an empty input listed first", got: []inferTensor{bEmpty, a}, bin: bin[:2], want: bin[:2], aliases: true},
		{name: "three, all binary, rotated", decl: decl3, got: []inferTensor{bBin, cBin, a}, bin: cat(bin[2:], c, bin[:2]), want: cat(bin, c)},
		{name: "three, all binary, reversed", decl: decl3, got: []inferTensor{cBin, bBin, a}, bin: cat(c, bin[2:], bin[:2]), want: cat(bin, c)},
		{name: "three, all binary, declared order", decl: decl3, got: []inferTensor{a, bBin, cBin}, bin: cat(bin, c), want: cat(bin, c), aliases: true},
		{name: "mixed", got: []inferTensor{bJSON, a}, bin: bin[:2], want: bin},
		{name: "mixed, binary listed first", got: []inferTensor{a, bJSON}, bin: bin[:2], want: bin},
		{name: "mixed, JSON declared first", got: []inferTensor{aJSON, bBin}, bin: bin[2:], want: bin},
		{name: "three, mixed, binary out of order", decl: decl3, got: []inferTensor{cBin, aJSON, bBin}, bin: cat(c, bin[2:]), want: cat(bin, c)},
		{name: "three, mixed, binary in order", decl: decl3, got: []inferTensor{a, bBin, cJSON}, bin: bin, want: cat(bin, c)},
		{name: "three, mixed, JSON between", decl: decl3, got: []inferTensor{cBin, bJSON, a}, bin: cat(c, bin[:2]), want: cat(bin, c)},
		{name: "three, all JSON", decl: decl3, got: []inferTensor{cJSON, bJSON, aJSON}, want: cat(bin, c)},
		{name: "missing", got: []inferTensor{a}, bin: bin[:2], err: `input "b" is missing (the model takes a, b)`},
		// Misnamed: the name sent is the one to fix, said first.
		{name: "missing, another name sent", got: []inferTensor{a, {name: "B", datatype: "INT16", shape: []int64{2}, hasBinSize: true, binSize: 4}}, bin: bin,
			err: `input "B" is not one of the model's inputs (a, b), and "b" is missing`},
		{name: "twice", got: []inferTensor{a, bBin, a}, bin: bin, err: `input "a" is given twice`},
		{name: "unknown", got: []inferTensor{a, bBin, {name: "c"}}, bin: bin, err: `input "c" is not one of the model's inputs (a, b)`},
		// A name the client sent is quoted to its head: it may be as long
		// as the body, and four times that quoted.
		{name: "unknown, huge", got: []inferTensor{a, bBin, {name: strings.Repeat("\xff", 1<<16)}}, bin: bin,
			err: `input "` + strings.Repeat(`\xff`, 64) + `"... is not one of the model's inputs (a, b)`},
		{name: "twice, huge", got: []inferTensor{a, bBin, {name: strings.Repeat("c", 1<<16)}, {name: strings.Repeat("c", 1<<16)}}, bin: bin,
			err: `input "` + strings.Repeat("c", 64) + `"... is given twice`},
		{name: "bytes left", got: []inferTensor{a, bBin}, bin: append(bin[:6:6], 9), err: "1 bytes of binary data after the last input"},
		{name: "bytes left, request order differs", got: []inferTensor{bBin, a}, bin: append(bin[:6:6], 9), err: "1 bytes of binary data after the last input"},
		{name: "bytes short", got: []inferTensor{a, bBin}, bin: bin[:5], err: `input "b": binary_data_size 4:`},
		{name: "bytes short, request order differs", got: []inferTensor{bBin, a}, bin: bin[:5], err: `input "a": binary_data_size 2:`},
		{name: "size mismatch", got: []inferTensor{{name: "a", datatype: "UINT8", shape: []int64{2}, hasBinSize: true, binSize: 3}, bBin}, bin: bin,
			err: `input "a": binary_data_size 3: want 2 bytes (shape [2] of UINT8), with that many left in the body`},
		// The input listed first is the wrong one, not the one declared
		// first that its size pushes past the end.
		{name: "size mismatch, listed before a declared one", got: []inferTensor{{name: "b", datatype: "INT16", shape: []int64{2}, hasBinSize: true, binSize: 100}, a}, bin: bin,
			err: `input "b": binary_data_size 100: want 4 bytes (shape [2] of INT16)`},
		{name: "size negative", got: []inferTensor{{name: "a", datatype: "UINT8", shape: []int64{2}, hasBinSize: true, binSize: -4}, bBin}, bin: bin,
			err: `input "a": binary_data_size -4: want 2 bytes`},
		// Shapes whose byte size overflows an int64: to a negative number,
		// sent as that number (decode takes it), which must not be sliced
		// with; to a small one, which must not pass for it.
		{name: "size overflows", got: []inferTensor{a, {name: "b", datatype: "INT16", shape: []int64{1 << 62}, hasBinSize: true, binSize: math.MinInt64}}, bin: bin,
			err: `input "b": shape [4611686018427387904] of INT16: its byte size overflows an int64`},
		{name: "size overflows to a small one", decl: []abi.Tensor{{Name: "v", Datatype: "FP32", Shape: []int64{-1}}},
			got: []inferTensor{{name: "v", datatype: "FP32", shape: []int64{1<<62 + 1}, hasBinSize: true, binSize: 4}}, bin: c,
			err: `input "v": shape [4611686018427387905] of FP32: its byte size overflows an int64`},
		{name: "size overflows, JSON data", decl: []abi.Tensor{{Name: "v", Datatype: "FP32", Shape: []int64{-1, 2}}},
			got: []inferTensor{{name: "v", datatype: "FP32", shape: []int64{1 << 61, 2}, data: []byte("[1]")}},
			err: `input "v": shape [2305843009213693952 2] of FP32: its byte size overflows an int64`},
		{name: "an empty dimension before huge ones", decl: []abi.Tensor{{Name: "v", Datatype: "FP32", Shape: []int64{-1, 1 << 40, 1 << 40}}},
			got: []inferTensor{{name: "v", datatype: "FP32", shape: []int64{0, 1 << 40, 1 << 40}, hasBinSize: true, binSize: 0}}, want: []byte{}},
		{name: "many inputs, all binary, reversed", decl: declMany, got: manyRev, bin: manyBin, want: manyWant},
		{name: "many inputs, one twice", got: append(many, many[3]), err: `input "t3" is given twice`},
		{name: "many inputs, unknown", got: many, err: `input "t0" is not one of the model's inputs (a, b), and "a" is missing`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			d := tt.decl
			if d == nil {
				d = decl
			}
			in, _, err := layInputs(&inferHeader{inputs: tt.got}, d, tt.bin, nil, inputBound{})
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("err %v, want %q", err, tt.err)
				}
				return
			}
			if err != nil || !bytes.Equal(in, tt.want) {
				t.Fatalf("%v %v, want %v", in, err, tt.want)
			}
			if aliases := len(in) > 0 && len(tt.bin) > 0 && &in[0] == &tt.bin[0]; aliases != tt.aliases {
				t.Errorf("result is the body's bytes: %v, want %v", aliases, tt.aliases)
			}
		})
	}
}

// An output with JSON data holding NaN or an infinity is an error naming
// it, with nothing written, and the response keeps no more than keptBody
// of the buffer grown for the answer (the error written next goes into
// it, and fasthttp keeps it for the connection's life); in binary, or
// finite, it is a response.
func TestWriteInferJSONNonFinite(t *testing.T) {
	f32 := func(fs ...float32) []byte {
		var b []byte
		for _, f := range fs {
			b = binary.LittleEndian.AppendUint32(b, math.Float32bits(f))
		}
		return b
	}
	f64 := func(f float64) []byte { return binary.LittleEndian.AppendUint64(nil, math.Float64bits(f)) }
	nan32, inf := float32(math.NaN()), math.Inf(1)
	for _, tt := range []struct {
		name      string
		decl      []abi.Tensor
		out       []byte
		binary    string // an output asked for in binary
		binAll    bool   // binary_data_output
		err       string // "": a 200
		dataHolds string // in the JSON written
	}{
		{name: "FP32 NaN", decl: []abi.Tensor{{Name: "y", Datatype: "FP32", Shape: []int64{2}}}, out: f32(1, nan32),
			err: `output "y": element 1 is NaN, which JSON data cannot carry`},
		{name: "FP32 -Inf", decl: []abi.Tensor{{Name: "y", Datatype: "FP32", Shape: []int64{-1}}}, out: f32(float32(math.Inf(-1))),
			err: `output "y": element 0 is -Inf`},
		{name: "NaN at the end of a large output", decl: []abi.Tensor{{Name: "y", Datatype: "FP32", Shape: []int64{-1}}},
			out: append(make([]byte, 1<<20), f32(nan32)...), err: `output "y": element 262144 is NaN`},
		{name: "FP64 +Inf", decl: []abi.Tensor{{Name: "w", Datatype: "FP64", Shape: []int64{1}}}, out: f64(inf), err: `output "w": element 0 is +Inf`},
		{name: "FP16 NaN", decl: []abi.Tensor{{Name: "h", Datatype: "FP16", Shape: []int64{1}}}, out: []byte{0x00, 0x7e}, err: `output "h": element 0 is NaN`},
		{name: "FP16 Inf", decl: []abi.Tensor{{Name: "h", Datatype: "FP16", Shape: []int64{1}}}, out: []byte{0x00, 0x7c}, err: `output "h": element 0 is +Inf`},
		{name: "the JSON one of two named", decl: []abi.Tensor{{Name: "y", Datatype: "FP32", Shape: []int64{1}}, {Name: "w", Datatype: "FP64", Shape: []int64{1}}},
			out: append(f32(nan32), f64(inf)...), binary: "y", err: `output "w": element 0 is +Inf`},
		{name: "NaN asked for in binary", decl: []abi.Tensor{{Name: "y", Datatype: "FP32", Shape: []int64{1}}, {Name: "w", Datatype: "FP64", Shape: []int64{1}}},
			out: append(f32(nan32), f64(2.5)...), binary: "y", dataHolds: `"data":[2.5]`},
		{name: "finite", decl: []abi.Tensor{{Name: "y", Datatype: "FP32", Shape: []int64{2}}}, out: f32(1.5, -2), dataHolds: `"data":[1.5,-2]`},
		{name: "integers", decl: []abi.Tensor{{Name: "i", Datatype: "INT32", Shape: []int64{1}}}, out: []byte{0, 0, 0xc0, 0x7f}, dataHolds: `"data":[2143289344]`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			h := &inferHeader{binaryOutput: tt.binAll}
			if tt.binary != "" {
				h.outputs = []inferTensor{{name: tt.binary, binary: true}}
			}
			cuts, _, err := oip.CutOutputs(tt.out, tt.decl, nil, nil)
			if err != nil {
				t.Fatal(err)
			}
			var ctx fasthttp.RequestCtx
			ctx.Init(&fasthttp.Request{}, &net.TCPAddr{}, nil)
			err = writeInferJSON(&ctx, h, "m", "v", cuts)
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) || !strings.Contains(err.Error(), "binary_data_output") {
					t.Fatalf("err %v, want one containing %q and naming binary_data_output", err, tt.err)
				}
				if len(ctx.Response.Body()) != 0 {
					t.Errorf("wrote %q as well", ctx.Response.Body())
				}
				if n := cap(ctx.Response.Body()); n > keptBody {
					t.Errorf("the response keeps a buffer of %d bytes for the error, want at most %d", n, keptBody)
				}
				return
			}
			if err != nil || ctx.Response.StatusCode() != 200 || !bytes.Contains(ctx.Response.Body(), []byte(tt.dataHolds)) {
				t.Fatalf("%v: %d %q, want data %s", err, ctx.Response.StatusCode(), ctx.Response.Body(), tt.dataHolds)
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
		if got, want := []any{name.Borrow(), version.Borrow(), action, ok}, []any{tt.name, tt.version, tt.action, tt.ok}; !reflect.DeepEqual(got, want) {
			t.Errorf("parseV2Model(%q) = %v, want %v", tt.path, got, want)
		}
	}
}
