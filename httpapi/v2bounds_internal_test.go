package httpapi

import (
	"bytes"
	"encoding/binary"
	"math"
	"math/rand"
	"net"
	"runtime"
	"strings"
	"testing"

	"github.com/valyala/fasthttp"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/internal/racebuild"
	"github.com/plover-run/plover/oip"
)

// allocated is the bytes f allocates on the heap (TotalAlloc's growth).
func allocated(f func()) uint64 {
	var a, b runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&a)
	f()
	runtime.ReadMemStats(&b)
	return b.TotalAlloc - a.TotalAlloc
}

// JSON data is read element by element into the laid-out bytes and
// refused as soon as it passes its shape: 16 MiB of "0," for a shape of
// [1] is a 400 naming the input's data, allocating a small multiple of
// the body (decoded whole into []any it took over 15 times the body), and
// arrays without elements count as the header's values do.
func TestJSONDataBoundedAsRead(t *testing.T) {
	body := func(shape, elem string, size int) []byte {
		var b bytes.Buffer
		b.WriteString(`{"inputs":[{"name":"INPUT0","datatype":"UINT8","shape":` + shape + `,"data":[`)
		for b.Len() < size {
			b.WriteString(elem)
		}
		b.Truncate(b.Len() - 1) // the last comma
		b.WriteString(`]}]}`)
		return b.Bytes()
	}
	for _, tc := range []struct {
		name string
		body []byte
		err  string
	}{
		{"zeros past a shape of [1]", body("[1]", "0,", 16<<20), `input "INPUT0": inputs[0].data holds more than the 1 elements its shape holds`},
		{"empty arrays for a shape of [0]", body("[0]", "[],", 16<<20), `input "INPUT0": inputs[0].data holds arrays without elements`},
		{"nested empty arrays for a shape of [0]", body("[0]", "[[]],", 16<<20), `input "INPUT0": inputs[0].data holds arrays without elements`},
		// Counting the header's values walked every bracket of its data
		// into a frame of its own: 96 times the body (a review's probe).
		{"data nested 16 MiB deep", body("[1]", "[", 16<<20), "exceeded max depth"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var err error
			n := allocated(func() {
				var h inferHeader
				_, err = readInfer(&h, tc.body, -1, abi.RawTensors.Inputs, nil)
			})
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Fatalf("err %v, want %q", err, tc.err)
			}
			if n > 4*uint64(len(tc.body)) {
				t.Errorf("allocated %d bytes for a body of %d, want under 4 times it", n, len(tc.body))
			}
		})
	}
}

// v2Refusal reads and lays out a request as v2Run does, under lim.
func v2Refusal(body []byte, hdrLen int, decl []abi.Tensor, lim inputBound) ([]byte, error) {
	var h inferHeader
	header, bin := body, []byte(nil)
	if hdrLen >= 0 {
		header, bin = body[:hdrLen], body[hdrLen:]
	}
	if err := h.read(header); err != nil {
		return nil, err
	}
	in, _, err := layInputs(&h, decl, bin, nil, lim)
	return in, err
}

// What a request gets wrong is told by its field's path, with what it is
// and what it should be; what it gets right still lays out.
func TestV2RequestFieldErrors(t *testing.T) {
	typed := []abi.Tensor{{Name: "x", Datatype: "FP32", Shape: []int64{2}}, {Name: "h", Datatype: "FP16", Shape: []int64{1}}, {Name: "d", Datatype: "FP64", Shape: []int64{1}}}
	in := func(dt, shape, rest string) string {
		return `{"inputs":[{"name":"INPUT0","datatype":"` + dt + `","shape":` + shape + rest + `}]`
	}
	floats := func(x, h, d string) string {
		return `{"inputs":[{"name":"x","datatype":"FP32","shape":[2],"data":` + x + `},{"name":"h","datatype":"FP16","shape":[1],"data":` + h +
			`},{"name":"d","datatype":"FP64","shape":[1],"data":` + d + `}]}`
	}
	bin := func(header, tail string) (string, int) { return header + tail, len(header) }
	b16, n16 := bin(in("UINT8", "[16]", `,"parameters":{"binary_data_size":"16"}`)+`}`, strings.Repeat("\x00", 16))
	bf, nf := bin(in("UINT8", "[16]", `,"parameters":{"binary_data_size":16.0}`)+`}`, strings.Repeat("\x00", 16))
	bn, nn := bin(in("UINT8", "[16]", `,"parameters":{"binary_data_size":null}`)+`}`, strings.Repeat("\x00", 16))
	both, nboth := bin(in("UINT8", "[1]", `,"data":[9],"parameters":{"binary_data_size":1}`)+`}`, "\x05")
	pad, npad := bin(in("UINT8", "[1]", `,"parameters":{"binary_data_size":1}`)+"}  \n", "\x05")
	for _, tc := range []struct {
		name   string
		body   string
		hdrLen int // -1: plain JSON
		decl   []abi.Tensor
		lim    int64
		err    string // "": laid out as want
		want   []byte
	}{
		// 5: binary_data_size must be an integer.
		{"binary_data_size a string", b16, n16, nil, 0, `inputs[0].parameters.binary_data_size: it is a string, want an integer`, nil},
		{"binary_data_size a fraction", bf, nf, nil, 0, `inputs[0].parameters.binary_data_size: it is the number 16.0, want an integer`, nil},
		{"binary_data_size null", bn, nn, nil, 0, `inputs[0].parameters.binary_data_size: it is null, want an integer`, nil},
		// 6: the binary parameters must be true or false.
		{"binary_data_output a string", in("UINT8", "[1]", `,"data":[1]`) + `,"parameters":{"binary_data_output":"true"}}`, -1, nil, 0,
			`parameters.binary_data_output: it is a string, want true or false`, nil},
		{"binary_data a number", in("UINT8", "[1]", `,"data":[1]`) + `,"outputs":[{"name":"OUTPUT0","parameters":{"binary_data":1}}]}`, -1, nil, 0,
			`outputs[0].parameters.binary_data: it is the number 1, want true or false`, nil},
		// 7: a float no element of the datatype holds.
		{"FP32 past its range", floats("[1e39,1]", "[1]", "[1]"), -1, typed, 0, `input "x": inputs[0].data[0]: 1e39 is past the range of FP32`, nil},
		{"FP32 past its range, negative", floats("[1,-1e39]", "[1]", "[1]"), -1, typed, 0, `input "x": inputs[0].data[1]: -1e39 is past the range of FP32`, nil},
		{"FP16 past its range", floats("[1,2]", "[[70000]]", "[1]"), -1, typed, 0, `input "h": inputs[1].data[0]: 70000 is past the range of FP16`, nil},
		{"FP64 past its range", floats("[1,2]", "[1]", "[1e400]"), -1, typed, 0, `input "d": inputs[2].data[0]: 1e400 is past the range of FP64`, nil},
		{"floats at their ranges", floats("[3.4028234663852886e38,1e-50]", "[65504]", "[1e308]"), -1, typed, 0, "",
			cat(f32le(math.MaxFloat32, 0), []byte{0xff, 0x7b}, f64le(1e308))},
		// 8: only whitespace after the header.
		{"bytes after the header", in("UINT8", "[1]", `,"data":[1]`) + `} xyz`, -1, nil, 0, `request body: 4 bytes follow the JSON header`, nil},
		{"whitespace after the header", in("UINT8", "[1]", `,"data":[7]`) + "} \r\n\t", -1, nil, 0, "", []byte{7}},
		{"a padded binary extension header", pad, npad, nil, 0, "", []byte{5}},
		// 9: one way per input.
		{"data and binary_data_size", both, nboth, nil, 0, `input "INPUT0": inputs[0] has both data and parameters.binary_data_size`, nil},
		// 10: a negative dimension, and type errors in the protocol's words.
		{"a negative dimension", in("UINT8", "[-2]", `,"data":[1]`) + `}`, -1, nil, 0, `input "INPUT0": shape [-2]: dimension 0 is negative`, nil},
		{"a dimension as a string", in("UINT8", `["1"]`, `,"data":[1]`) + `}`, -1, nil, 0, `request body: "inputs.shape" is a string, want an integer`, nil},
		{"inputs as a string", `{"inputs":"x"}`, -1, nil, 0, `request body: "inputs" is a string, want an array`, nil},
		{"an input as a number", `{"inputs":[5]}`, -1, nil, 0, `request body: "inputs" is a number, want a JSON object`, nil},
		{"an element of the wrong kind", in("UINT8", "[2]", `,"data":[1,"2"]`) + `}`, -1, nil, 0, `input "INPUT0": inputs[0].data[1]: it is a string, want a number`, nil},
		{"nested data", in("UINT8", "[4]", `,"data":[[1,2],[[3],4]]`) + `}`, -1, nil, 0, "", []byte{1, 2, 3, 4}},
		// 2: the inputs' sum against max_input_bytes, before any is laid out.
		{"inputs over max_input_bytes", in("UINT8", "[70000]", `,"data":[1]`) + `}`, -1, nil, 1 << 16,
			`input "INPUT0" (shape [70000] of UINT8) brings the inputs to 70000 bytes; model m takes at most 65536 (max_input_bytes)`, nil},
		{"inputs at max_input_bytes", in("UINT8", "[2]", `,"data":[1,2]`) + `}`, -1, nil, 2, "", []byte{1, 2}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			decl := tc.decl
			if decl == nil {
				decl = abi.RawTensors.Inputs
			}
			got, err := v2Refusal([]byte(tc.body), tc.hdrLen, decl, inputBound{model: "m", max: tc.lim})
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil || !bytes.Equal(got, tc.want) {
				t.Fatalf("%x %v, want %x", got, err, tc.want)
			}
		})
	}
}

func cat(bs ...[]byte) []byte { return bytes.Join(bs, nil) }

func f32le(fs ...float32) []byte {
	var b []byte
	for _, f := range fs {
		b = binary.LittleEndian.AppendUint32(b, math.Float32bits(f))
	}
	return b
}

func f64le(f float64) []byte { return binary.LittleEndian.AppendUint64(nil, math.Float64bits(f)) }

// The JSON answer written by hand is byte for byte the one encoding/json
// writes from maps of the outputs' values, for every datatype, the
// numbers encoding/json writes in exponent form included, and with some
// outputs in binary.
func TestWriteInferJSONMatchesEncodingJSON(t *testing.T) {
	rng := rand.New(rand.NewSource(1))
	var decl []abi.Tensor
	var out []byte
	for _, dt := range []string{"BOOL", "UINT8", "INT8", "UINT16", "INT16", "UINT32", "INT32", "UINT64", "INT64", "FP16", "FP32", "FP64"} {
		decl = append(decl, abi.Tensor{Name: strings.ToLower(dt), Datatype: dt, Shape: []int64{2, 20}})
		b := make([]byte, 40*abi.DatatypeSize[dt])
		rng.Read(b)
		if dt == "BOOL" {
			for i := range b {
				b[i] &= 1
			}
		}
		out = append(out, b...)
	}
	// Floats at encoding/json's edges: exponent form under 1e-6 and from
	// 1e21, one-digit exponents, zeros of both signs, subnormals.
	edges := []float64{0, math.Copysign(0, -1), 1e-6, 9.99e-7, 1e-7, 1e20, 1e21, 123456789, 5e-324, 1.5, -2.25e-10, math.MaxFloat64}
	decl = append(decl, abi.Tensor{Name: "edges64", Datatype: "FP64", Shape: []int64{int64(len(edges))}}, abi.Tensor{Name: "edges32", Datatype: "FP32", Shape: []int64{int64(len(edges) - 2)}})
	for _, f := range edges {
		out = append(out, f64le(f)...)
	}
	for _, f := range edges[:len(edges)-2] {
		out = append(out, f32le(float32(f))...)
	}
	// Random float bits can be NaN or infinite, which JSON data refuses:
	// those are cleared to a finite value.
	cuts, _, err := oip.CutOutputs(out, decl, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range cuts {
		finite(c.Decl.Datatype, c.Bytes)
	}
	for _, h := range []*inferHeader{
		{},
		{id: "req-<1>"},
		{outputs: []inferTensor{{name: "fp32", binary: true}, {name: "uint8", binary: true}}},
	} {
		var ctx fasthttp.RequestCtx
		ctx.Init(&fasthttp.Request{}, &net.TCPAddr{}, nil)
		if err := writeInferJSON(&ctx, h, "m", "v1", cuts); err != nil {
			t.Fatal(err)
		}
		js, tail, err := stdInferJSON(h, "m", "v1", cuts)
		if err != nil {
			t.Fatal(err)
		}
		if got, want := ctx.Response.Body(), append(js, tail...); !bytes.Equal(got, want) {
			t.Fatalf("by hand:\n%.2000q\nencoding/json:\n%.2000q", got, want)
		}
		if len(tail) > 0 && string(ctx.Response.Header.Peek("Inference-Header-Content-Length")) != strconvItoa(len(js)) {
			t.Errorf("Inference-Header-Content-Length %q, want %d", ctx.Response.Header.Peek("Inference-Header-Content-Length"), len(js))
		}
	}
}

// finite overwrites b's NaN and infinite elements of dt with zero.
func finite(dt string, b []byte) {
	es := int(abi.DatatypeSize[dt])
	for i := 0; i+es <= len(b); i += es {
		e := b[i : i+es]
		var f float64
		switch dt {
		case "FP16":
			f = float64(float16to32(binary.LittleEndian.Uint16(e)))
		case "FP32":
			f = float64(math.Float32frombits(binary.LittleEndian.Uint32(e)))
		case "FP64":
			f = math.Float64frombits(binary.LittleEndian.Uint64(e))
		default:
			return
		}
		if math.IsNaN(f) || math.IsInf(f, 0) {
			clear(e)
		}
	}
}

// An answer's JSON data is bounded (maxJSONOutput of outputs) and built
// without a value per element: 16 MiB of output allocates a few times the
// JSON it becomes (decoded into []any first it took over 25 times the
// output), and a byte more is a 400 that says to ask for binary, with
// nothing written; asked for in binary, any size is answered.
func TestWriteInferJSONBounded(t *testing.T) {
	for _, dt := range []string{"UINT8", "FP32"} {
		out := make([]byte, maxJSONOutput)
		for i := range out {
			out[i] = byte(i * 7)
		}
		if dt == "FP32" {
			for i := 0; i < len(out); i += 4 {
				binary.LittleEndian.PutUint32(out[i:], math.Float32bits(float32(i)/7))
			}
		}
		decl := []abi.Tensor{{Name: "o", Datatype: dt, Shape: []int64{-1}}}
		cuts, _, err := oip.CutOutputs(out, decl, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		var ctx fasthttp.RequestCtx
		ctx.Init(&fasthttp.Request{}, &net.TCPAddr{}, nil)
		n := allocated(func() { err = writeInferJSON(&ctx, &inferHeader{}, "m", "v", cuts) })
		body := len(ctx.Response.Body())
		if err != nil || body < len(out) {
			t.Fatalf("%s: %v, %d bytes", dt, err, body)
		}
		// A race detector build allocated 134 MB here for 16 MiB of output:
		// the count is the plain build's.
		if n > 5*uint64(len(out)) && !racebuild.Enabled {
			t.Errorf("%s: %d bytes of output became %d of JSON, allocating %d: want under 5 times the output", dt, len(out), body, n)
		}

		over := append(out, make([]byte, abi.DatatypeSize[dt])...)
		cuts, _, _ = oip.CutOutputs(over, decl, nil, nil)
		var ctx2 fasthttp.RequestCtx
		ctx2.Init(&fasthttp.Request{}, &net.TCPAddr{}, nil)
		err = writeInferJSON(&ctx2, &inferHeader{}, "m", "v", cuts)
		if err == nil || !strings.Contains(err.Error(), "over the 16777216 that JSON data carries") || !strings.Contains(err.Error(), "binary_data_output") ||
			statusOf(err) != 400 || len(ctx2.Response.Body()) != 0 {
			t.Fatalf("%s: a byte over: %v (status %d), %d bytes written; want a 400 naming binary_data_output", dt, err, statusOf(err), len(ctx2.Response.Body()))
		}
		var ctx3 fasthttp.RequestCtx
		ctx3.Init(&fasthttp.Request{}, &net.TCPAddr{}, nil)
		if err := writeInferJSON(&ctx3, &inferHeader{binaryOutput: true}, "m", "v", cuts); err != nil {
			t.Fatalf("%s: in binary: %v", dt, err)
		}
	}
}

// A number is one value however long: one of 8 MiB in a tensor's data,
// in binary_data_size or in a shape was copied whole into each message
// wrapping it, and sent back in the 400 (a review's probe). The error
// quotes its head and says its length.
func TestALongNumberIsNotEchoed(t *testing.T) {
	long := "1" + strings.Repeat("0", 8<<20)
	for _, tc := range []struct{ name, header string }{
		{"in data", `{"inputs":[{"name":"INPUT0","datatype":"UINT8","shape":[1],"data":[` + long + `]}]}`},
		{"in FP32 data", `{"inputs":[{"name":"INPUT0","datatype":"FP32","shape":[1],"data":[` + long + `]}]}`},
		{"as binary_data_size", `{"inputs":[{"name":"INPUT0","datatype":"UINT8","shape":[1],"parameters":{"binary_data_size":` + long + `}}]}`},
		{"as a shape's dimension", `{"inputs":[{"name":"INPUT0","datatype":"UINT8","shape":[` + long + `],"data":[1]}]}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			decl := abi.RawTensors.Inputs
			if strings.Contains(tc.header, "FP32") {
				decl = []abi.Tensor{{Name: "INPUT0", Datatype: "FP32", Shape: []int64{1}}}
			}
			_, err := v2Refusal([]byte(tc.header), -1, decl, inputBound{max: 1 << 30})
			if err == nil || len(err.Error()) > 1024 || !strings.Contains(err.Error(), "bytes)") {
				msg := ""
				if err != nil {
					msg = err.Error()
				}
				t.Fatalf("a number of %d bytes: error of %d bytes (%.200s...), want its head and length", len(long), len(msg), msg)
			}
		})
	}
}

// An answer echoes its request's id, so a long one is refused before the
// run (over gRPC the echo made an answer past the send limit, refused
// after the function ran); the 400 names the field and its length, and
// does not echo it. Both readers of a header say so: parse (a plain ASCII
// id) and decode (one with an escape, which parse leaves to it).
func TestALongIDIsRefusedBeforeTheRun(t *testing.T) {
	body := func(id string) []byte {
		return []byte(`{"id":"` + id + `","inputs":[{"name":"INPUT0","datatype":"UINT8","shape":[1],"data":[7]}]}`)
	}
	for _, tc := range []struct {
		name string
		id   string
		ok   bool
	}{
		{"at the bound", strings.Repeat("a", oip.MaxID), true},
		{"at the bound, escaped", `\u00e9` + strings.Repeat("a", oip.MaxID-2), true},
		{"a byte over", strings.Repeat("a", oip.MaxID+1), false},
		{"a byte over, escaped", `\u00e9` + strings.Repeat("a", oip.MaxID-1), false},
		{"a MiB", strings.Repeat("a", 1<<20), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in, err := v2Refusal(body(tc.id), -1, abi.RawTensors.Inputs, inputBound{max: 1 << 30})
			if tc.ok {
				if err != nil || len(in) != 1 || in[0] != 7 {
					t.Fatalf("an id at the bound: %v, input %v", err, in)
				}
				return
			}
			if err == nil || statusOf(err) != 400 || !strings.HasPrefix(err.Error(), "id: ") || len(err.Error()) > 256 {
				t.Fatalf("an id over the bound: %v (status %d), want a short 400 naming id", err, statusOf(err))
			}
		})
	}
}
