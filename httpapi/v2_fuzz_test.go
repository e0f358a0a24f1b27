package httpapi

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/oip"
)

// fuzzModels are declared inputs a request is laid out against: the raw
// bytes, testkit.Typed's, every datatype, and more inputs than layInputs
// searches linearly (its map path).
var fuzzModels = func() [][]abi.Tensor {
	every := []abi.Tensor{}
	for i, dt := range []string{"BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64", "FP16", "FP32", "FP64"} {
		shape := []int64{2}
		if i%2 == 0 {
			shape = []int64{-1, 1}
		}
		every = append(every, abi.Tensor{Name: strings.ToLower(dt), Datatype: dt, Shape: shape})
	}
	var many []abi.Tensor
	for i := range 18 {
		many = append(many, abi.Tensor{Name: fmt.Sprint("m", i), Datatype: "UINT8", Shape: []int64{-1}})
	}
	return [][]abi.Tensor{
		abi.RawTensors.Inputs,
		{{Name: "x", Datatype: "FP32", Shape: []int64{2, 2}}, {Name: "y", Datatype: "INT16", Shape: []int64{-1}}},
		every,
		many,
	}
}()

// readInfer is what v2Run does with a request body up to the function's
// input: the binary extension's header split off at hdrLen (none when
// negative), parse or else decode, and the inputs laid out in declared
// order into buf.
func readInfer(h *inferHeader, body []byte, hdrLen int, decl []abi.Tensor, buf []byte) ([]byte, error) {
	header, bin := body, []byte(nil)
	if hdrLen >= 0 {
		header, bin = body[:hdrLen], body[hdrLen:]
	}
	if err := h.read(header); err != nil {
		return nil, err
	}
	in, _, err := layInputs(h, decl, bin, buf, inputBound{})
	return in, err
}

// resend builds a request carrying inputs (in declared order, as layInputs
// lays them out) again: each as JSON data when asJSON and JSON can carry
// its values exactly, otherwise in the binary extension, listed in reverse
// declared order so that request order differs from declared order.
func resend(t *testing.T, decl []abi.Tensor, shapes [][]int64, laid []byte, asJSON bool) (body []byte, hdrLen int) {
	t.Helper()
	type tensor struct {
		Name       string         `json:"name"`
		Datatype   string         `json:"datatype"`
		Shape      []int64        `json:"shape"`
		Data       any            `json:"data,omitempty"` // any: [] is sent, not omitted
		Parameters map[string]any `json:"parameters,omitempty"`
	}
	var inputs []tensor
	var bin []byte
	off := int64(0)
	for i, d := range decl {
		size, _ := oip.Bytes(shapes[i], abi.DatatypeSize[d.Datatype])
		b := laid[off : off+size]
		off += size
		tn := tensor{Name: d.Name, Datatype: d.Datatype, Shape: shapes[i]}
		if data, ok := jsonData(d.Datatype, b); asJSON && ok {
			tn.Data = data
		} else {
			tn.Parameters = map[string]any{"binary_data_size": size}
			bin = append(b[:len(b):len(b)], bin...)
		}
		inputs = append([]tensor{tn}, inputs...)
	}
	header, err := json.Marshal(map[string]any{"inputs": inputs})
	if err != nil {
		t.Fatal(err)
	}
	if bin == nil {
		return header, -1 // plain JSON, no Inference-Header-Content-Length
	}
	return append(header, bin...), len(header)
}

// jsonData is b's elements as JSON numbers that encodeElements turns back
// into exactly b: floats as the shortest float64 text of their exact value
// (no rounding twice); false when JSON cannot carry them (NaN, infinities,
// a BOOL byte other than 0 and 1).
func jsonData(dt string, b []byte) ([]any, bool) {
	out := []any{}
	for _, v := range decodeElements(dt, b) {
		if x, ok := v.(float32); ok {
			v = float64(x)
		}
		if f, ok := v.(float64); ok {
			if math.IsNaN(f) || math.IsInf(f, 0) {
				return nil, false
			}
			v = json.Number(strconv.FormatFloat(f, 'g', -1, 64))
		}
		out = append(out, v)
	}
	if dt == "BOOL" && slices.ContainsFunc(b, func(c byte) bool { return c > 1 }) {
		return nil, false
	}
	return out, true
}

// FuzzV2InferBody fuzzes a POST /v2/models/{m}/infer body, JSON alone or
// with the binary extension, from the bytes to the function's input.
func FuzzV2InferBody(f *testing.F) {
	every := `{"inputs":[` +
		`{"name":"bool","datatype":"BOOL","shape":[2,1],"data":[true,false]},{"name":"uint8","datatype":"UINT8","shape":[2],"data":[0,255]},` +
		`{"name":"uint16","datatype":"UINT16","shape":[1,1],"data":[65535]},{"name":"uint32","datatype":"UINT32","shape":[2],"data":[[1],[4294967295]]},` +
		`{"name":"uint64","datatype":"UINT64","shape":[0,1],"data":[]},{"name":"int8","datatype":"INT8","shape":[2],"data":[-128,127]},` +
		`{"name":"int16","datatype":"INT16","shape":[1,1],"data":[-3]},{"name":"int32","datatype":"INT32","shape":[2],"data":[-2147483648,7]},` +
		`{"name":"int64","datatype":"INT64","shape":[1,1],"data":[-9223372036854775808]},{"name":"fp16","datatype":"FP16","shape":[2],"data":[0.333251953125,65504]},` +
		`{"name":"fp32","datatype":"FP32","shape":[2,1],"data":[1.5,-0]},{"name":"fp64","datatype":"FP64","shape":[2],"data":[1e-310,-2.5e300]}]}`
	var many strings.Builder
	many.WriteString(`{"inputs":[`)
	for i := 17; i >= 0; i-- {
		fmt.Fprintf(&many, `{"name":"m%d","datatype":"UINT8","shape":[1],"data":[%d]}`, i, i)
		if i > 0 {
			many.WriteString(",")
		}
	}
	many.WriteString(`]}`)
	f32s := "\x00\x00\x80\x3f\x00\x00\x00\x40\x00\x00\x40\x40\x00\x00\x80\x40" // 1, 2, 3, 4
	for _, s := range []struct {
		header, bin string
		binary      bool // with the binary extension: the header is Inference-Header-Content-Length long
		model       uint8
	}{
		{header: `{"id":"r1","inputs":[{"name":"INPUT0","datatype":"UINT8","shape":[3],"data":[7,8,9]}]}`},
		{header: `{"inputs":[{"name":"INPUT0","datatype":"UINT8","shape":[3],"parameters":{"binary_data_size":3}}]}`, bin: "\x01\x02\x03", binary: true},
		{header: `{"inputs":[{"name":"y","datatype":"INT16","shape":[2],"data":[-3,300]},{"name":"x","datatype":"FP32","shape":[2,2],"data":[[1.5,2],[3,-4]]}]}`, model: 1},
		{header: `{"inputs":[{"name":"y","datatype":"INT16","shape":[2],"parameters":{"binary_data_size":4}},{"name":"x","datatype":"FP32","shape":[2,2],"parameters":{"binary_data_size":16}}],"parameters":{"binary_data_output":true}}`,
			bin: "\x05\x00\x06\x00" + f32s, binary: true, model: 1},
		{header: `{"inputs":[{"name":"x","datatype":"FP32","shape":[2,2],"data":[1,2,3,4]},{"name":"y","datatype":"INT16","shape":[1],"parameters":{"binary_data_size":2}}],"outputs":[{"name":"z","parameters":{"binary_data":true}}]}`,
			bin: "\xff\x7f", binary: true, model: 1},
		{header: every, model: 2},
		{header: many.String(), model: 3},
		// Tricky: values at and past their type's range, shapes whose byte
		// size overflows, data that does not match its shape, a binary
		// size that disagrees with the shape, bytes left over, NaN and
		// infinity bits, a BOOL byte JSON has no value for.
		{header: strings.Replace(every, "[0,255]", "[256,-1]", 1), model: 2},
		{header: strings.Replace(every, "[0.333251953125,65504]", "[1e6,-1e-9]", 1), model: 2},
		{header: strings.Replace(every, "[1e-310,-2.5e300]", "[1e400,0]", 1), model: 2},
		{header: `{"inputs":[{"name":"y","datatype":"INT16","shape":[4611686018427387904],"data":[1]},{"name":"x","datatype":"FP32","shape":[2,2],"data":[1,2,3,4]}]}`, model: 1},
		{header: `{"inputs":[{"name":"INPUT0","datatype":"UINT8","shape":[2],"data":[[1],[2,[3]]]}]}`},
		{header: `{"inputs":[{"name":"INPUT0","datatype":"UINT8","shape":[3],"parameters":{"binary_data_size":-3}}]}`, bin: "abc", binary: true},
		{header: `{"inputs":[{"name":"INPUT0","datatype":"UINT8","shape":[3],"parameters":{"binary_data_size":3}}]}`, bin: "abcd", binary: true},
		{header: `{"inputs":[{"name":"y","datatype":"INT16","shape":[0],"parameters":{"binary_data_size":0}},{"name":"x","datatype":"FP32","shape":[2,2],"parameters":{"binary_data_size":16}}]}`,
			bin: "\x00\x00\xc0\x7f\x00\x00\x80\x7f\x00\x00\x80\xff\x00\x00\x00\x80", binary: true, model: 1},
		{header: strings.Replace(every, `"shape":[2,1],"data":[true,false]`, `"shape":[2,1],"parameters":{"binary_data_size":2}`, 1), bin: "\x07\x00", binary: true, model: 2},
	} {
		hdrLen := -1
		if s.binary {
			hdrLen = len(s.header)
		}
		f.Add([]byte(s.header+s.bin), hdrLen, s.model)
	}
	f.Fuzz(func(t *testing.T, body []byte, hdrLen int, model uint8) {
		decl := fuzzModels[int(model)%len(fuzzModels)]
		if hdrLen >= 0 {
			hdrLen %= len(body) + 1 // v2Run refuses a length past the body
		}
		var h inferHeader
		laid, err := readInfer(&h, body, hdrLen, decl, nil)
		if err != nil {
			// Errors are the client's to act on: they say what of the body
			// is wrong, or name an input it sends or the model declares.
			msg := err.Error()
			switch {
			case strings.HasPrefix(msg, "request body: "), // invalid JSON, a field of the wrong kind, bytes after it
				strings.HasSuffix(msg, " bytes of binary data after the last input"),
				strings.HasPrefix(msg, "parameters.binary_data_output: "):
			case strings.HasPrefix(msg, "inputs["), strings.HasPrefix(msg, "outputs["):
				// A parameter of the wrong kind, by its path: an index the
				// request has.
				var k int
				what := h.inputs
				if msg[0] == 'o' {
					what = h.outputs
				}
				if _, err := fmt.Sscanf(msg[strings.IndexByte(msg, '[')+1:], "%d]", &k); err != nil || k < 0 || k >= len(what) && len(what) > 0 {
					t.Fatalf("error names no tensor of the request: %q", msg)
				}
			case strings.HasPrefix(msg, "input "):
				quoted, qerr := strconv.QuotedPrefix(msg[len("input "):])
				name, _ := strconv.Unquote(quoted)
				// A long name is quoted by its head, "..." after it
				// (errdefs.QuoteName).
				clipped := strings.HasPrefix(msg[len("input ")+len(quoted):], "...")
				names := func(n string) bool { return n == name || clipped && strings.HasPrefix(n, name) }
				if qerr != nil || !slices.ContainsFunc(decl, func(d abi.Tensor) bool { return names(d.Name) }) &&
					!slices.ContainsFunc(h.inputs, func(x inferTensor) bool { return names(x.name) }) {
					t.Fatalf("error names no input of the request or the model: %q", msg)
				}
			default:
				t.Fatalf("error names neither the body nor an input: %q", msg)
			}
			return
		}

		// Taken: one request input per declared input, and the layout is
		// their byte sizes back to back.
		if len(h.inputs) != len(decl) {
			t.Fatalf("%d inputs taken for %d declared", len(h.inputs), len(decl))
		}
		shapes := make([][]int64, len(decl))
		want := int64(0)
		for i, d := range decl {
			k := slices.IndexFunc(h.inputs, func(x inferTensor) bool { return x.name == d.Name })
			if k < 0 {
				t.Fatalf("input %q taken without being sent", d.Name)
			}
			size, err := oip.CheckInput(h.inputs[k].datatype, h.inputs[k].shape, d)
			if err != nil {
				t.Fatalf("taken, yet %v", err)
			}
			shapes[i] = slices.Clone(h.inputs[k].shape)
			want += size
		}
		if int64(len(laid)) != want {
			t.Fatalf("laid out %d bytes, the shapes hold %d", len(laid), want)
		}
		laid = slices.Clone(laid) // it may borrow body

		// A pooled v2Call hands layInputs the last request's buffer: what
		// it held must not show.
		stale := bytes.Repeat([]byte{0xa5}, 2*len(laid)+64)
		var h2 inferHeader
		again, err := readInfer(&h2, body, hdrLen, decl, stale[:0])
		if err != nil || !bytes.Equal(again, laid) {
			t.Fatalf("with a used buffer: %v, %x, want %x", err, again, laid)
		}

		// The same inputs sent again, in binary and as JSON data, lay out
		// to the same bytes.
		for _, asJSON := range []bool{false, true} {
			b, n := resend(t, decl, shapes, laid, asJSON)
			var h3 inferHeader
			got, err := readInfer(&h3, b, n, decl, nil)
			if err != nil || !bytes.Equal(got, laid) {
				t.Fatalf("sent again (JSON data: %v) as %q: %v, %x, want %x", asJSON, b, err, got, laid)
			}
		}
	})
}
