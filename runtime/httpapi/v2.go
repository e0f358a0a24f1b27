package httpapi

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/valyala/fasthttp"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/runtime"
	"github.com/plover-run/plover/runtime/registry"
)

// The Open Inference Protocol (KServe v2) over HTTP/REST: health, server and
// model metadata, and inference with JSON tensor data or the binary tensor
// data extension. A function is a model; its versions are Plover's version
// ids (or their 8+ character prefixes), and only the current one serves.

// Describer gives a function's current version without loading it
// (runtime.Engine).
type Describer interface {
	Current(ctx context.Context, name string) (registry.Version, error)
}

var pathV2 = []byte("/v2")

// v2Error writes the protocol's error object.
func v2Error(ctx *fasthttp.RequestCtx, code int, msg string) {
	writeJSON(ctx, code, map[string]string{"error": msg})
}

// v2Fail writes an engine or request error as the protocol's error object.
func (s *Server) v2Fail(ctx *fasthttp.RequestCtx, err error) {
	code, _ := classify(err)
	msg := err.Error()
	var re *runtime.Error
	if errors.As(err, &re) {
		msg = re.Msg
	}
	v2Error(ctx, code, msg)
}

// v2 routes /v2... requests.
func (s *Server) v2(ctx *fasthttp.RequestCtx) {
	path := string(ctx.Path())
	switch {
	case path == "/v2" || path == "/v2/":
		if s.method(ctx, fasthttp.MethodGet) {
			writeJSON(ctx, fasthttp.StatusOK, map[string]any{"name": "plover", "version": s.opts.Version,
				"extensions": []string{"binary_tensor_data"}})
		}
	case path == "/v2/health/live":
		if s.method(ctx, fasthttp.MethodGet) {
			writeJSON(ctx, fasthttp.StatusOK, map[string]bool{"live": true})
		}
	case path == "/v2/health/ready":
		if s.method(ctx, fasthttp.MethodGet) {
			ok, _ := s.inv.Health()
			code := fasthttp.StatusOK
			if !ok || s.notReady.Load() {
				code = fasthttp.StatusServiceUnavailable
			}
			writeJSON(ctx, code, map[string]bool{"ready": code == fasthttp.StatusOK})
		}
	case strings.HasPrefix(path, "/v2/models/"):
		name, version, action, ok := parseV2Model(path[len("/v2/models/"):])
		if !ok {
			v2Error(ctx, fasthttp.StatusNotFound, "no route for "+path)
			return
		}
		s.v2Model(ctx, name, version, action)
	default:
		v2Error(ctx, fasthttp.StatusNotFound, "no route for "+path)
	}
}

// parseV2Model splits NAME[/versions/V][/ready|/infer].
func parseV2Model(rest string) (name, version, action string, ok bool) {
	parts := strings.Split(rest, "/")
	name, parts = parts[0], parts[1:]
	if len(parts) >= 2 && parts[0] == "versions" {
		version, parts = parts[1], parts[2:]
	}
	switch {
	case len(parts) == 0:
	case len(parts) == 1 && (parts[0] == "ready" || parts[0] == "infer"):
		action = parts[0]
	default:
		return "", "", "", false
	}
	return name, version, action, name != ""
}

func (s *Server) v2Model(ctx *fasthttp.RequestCtx, name, version, action string) {
	d, ok := s.inv.(Describer)
	if !ok {
		v2Error(ctx, fasthttp.StatusNotImplemented, "this server cannot describe models")
		return
	}
	want := fasthttp.MethodGet
	if action == "infer" {
		want = fasthttp.MethodPost
	}
	if !s.method(ctx, want) {
		return
	}
	cur, err := d.Current(context.Background(), name)
	if err != nil {
		s.v2Fail(ctx, err)
		return
	}
	if version != "" && version != cur.ID && !(len(version) >= 8 && strings.HasPrefix(cur.ID, version)) {
		v2Error(ctx, fasthttp.StatusNotFound, fmt.Sprintf("model %s version %q is not its current version %s: Plover serves the current version (plover rollback to change it; a prefix needs 8+ characters)", name, version, cur.ID))
		return
	}
	ts := cur.Tensors
	if ts == nil {
		ts = &abi.RawTensors
	}
	switch action {
	case "":
		writeJSON(ctx, fasthttp.StatusOK, map[string]any{"name": name, "versions": []string{cur.ID}, "platform": "plover",
			"inputs": ts.Inputs, "outputs": ts.Outputs})
	case "ready":
		ok, _ := s.inv.Health()
		code := fasthttp.StatusOK
		if !ok {
			code = fasthttp.StatusServiceUnavailable
		}
		writeJSON(ctx, code, map[string]any{"name": name, "ready": ok})
	case "infer":
		s.v2Infer(ctx, name, cur, ts)
	}
}

// v2Tensor is a tensor in an inference request or response.
type v2Tensor struct {
	Name       string          `json:"name"`
	Datatype   string          `json:"datatype"`
	Shape      []int64         `json:"shape"`
	Data       json.RawMessage `json:"data,omitempty"`
	Parameters map[string]any  `json:"parameters,omitempty"`
}

type v2Request struct {
	ID         string         `json:"id,omitempty"`
	Inputs     []v2Tensor     `json:"inputs"`
	Outputs    []v2Tensor     `json:"outputs,omitempty"`
	Parameters map[string]any `json:"parameters,omitempty"`
}

var hdrInferHeaderLen = []byte("Inference-Header-Content-Length")

func (s *Server) v2Infer(ctx *fasthttp.RequestCtx, name string, cur registry.Version, ts *abi.Tensors) {
	body, held, err := s.readBody(ctx, s.opts.MaxBodyBytes, nil)
	if err != nil {
		s.v2Fail(ctx, err)
		return
	}
	defer s.releaseBody(held)
	// The binary extension: a JSON header of the given length, then the
	// tensors' bytes in input order.
	header, bin := body, []byte(nil)
	if h := ctx.Request.Header.PeekBytes(hdrInferHeaderLen); len(h) > 0 {
		n, err := strconv.Atoi(string(h))
		if err != nil || n < 0 || n > len(body) {
			v2Error(ctx, fasthttp.StatusBadRequest, "Inference-Header-Content-Length: "+strconv.Quote(string(h))+" is not a length within the body")
			return
		}
		header, bin = body[:n], body[n:]
	}
	var req v2Request
	dec := json.NewDecoder(bytes.NewReader(header))
	dec.UseNumber()
	if err := dec.Decode(&req); err != nil {
		v2Error(ctx, fasthttp.StatusBadRequest, "request body: invalid JSON: "+err.Error())
		return
	}
	input, err := layInputs(req.Inputs, ts.Inputs, bin)
	if err != nil {
		v2Error(ctx, fasthttp.StatusBadRequest, err.Error())
		return
	}
	r := runtime.Request{Input: input}
	if err := deadline(ctx, &r); err != nil {
		s.v2Fail(ctx, err)
		return
	}
	err = s.inv.Invoke(context.Background(), name, &r)
	s.metrics.record(name, statusCode(err), runtime.KindOf(err), &r.Timing)
	if err != nil {
		s.v2Fail(ctx, err)
		return
	}
	outs, err := cutOutputs(r.Output, ts.Outputs)
	if err != nil {
		v2Error(ctx, fasthttp.StatusInternalServerError, err.Error())
		return
	}
	binaryAll := paramBool(req.Parameters, "binary_data_output")
	wantBinary := map[string]bool{}
	for _, o := range req.Outputs {
		if paramBool(o.Parameters, "binary_data") {
			wantBinary[o.Name] = true
		}
	}
	resp := map[string]any{"model_name": name, "model_version": r.Version, "outputs": nil}
	if req.ID != "" {
		resp["id"] = req.ID
	}
	var tail []byte
	outList := make([]map[string]any, 0, len(outs))
	for i, o := range outs {
		decl := ts.Outputs[i]
		t := map[string]any{"name": decl.Name, "datatype": decl.Datatype, "shape": o.shape}
		if binaryAll || wantBinary[decl.Name] {
			t["parameters"] = map[string]any{"binary_data_size": len(o.bytes)}
			tail = append(tail, o.bytes...)
		} else {
			t["data"] = decodeElements(decl.Datatype, o.bytes)
		}
		outList = append(outList, t)
	}
	resp["outputs"] = outList
	js, _ := json.Marshal(resp)
	ctx.Response.Reset()
	ctx.SetStatusCode(fasthttp.StatusOK)
	if tail != nil {
		ctx.SetContentType("application/octet-stream")
		ctx.Response.Header.Set("Inference-Header-Content-Length", strconv.Itoa(len(js)))
		ctx.SetBody(append(js, tail...))
	} else {
		ctx.SetContentType("application/json")
		ctx.SetBody(js)
	}
	c := &call{req: r, timing: make([]byte, 0, 160)}
	s.writeMeta(ctx, c)
}

func statusCode(err error) int {
	if err == nil {
		return fasthttp.StatusOK
	}
	code, _ := classify(err)
	return code
}

func paramBool(p map[string]any, key string) bool {
	b, _ := p[key].(bool)
	return b
}

// layInputs puts the request's tensors into one buffer in declared order,
// checking names, datatypes and shapes.
func layInputs(got []v2Tensor, decl []abi.Tensor, bin []byte) ([]byte, error) {
	byName := map[string]*v2Tensor{}
	for i := range got {
		if _, dup := byName[got[i].Name]; dup {
			return nil, fmt.Errorf("input %q is given twice", got[i].Name)
		}
		byName[got[i].Name] = &got[i]
	}
	var buf []byte
	for _, d := range decl {
		t := byName[d.Name]
		if t == nil {
			return nil, fmt.Errorf("input %q is missing (the model takes %s)", d.Name, tensorNames(decl))
		}
		delete(byName, d.Name)
		if t.Datatype != d.Datatype {
			return nil, fmt.Errorf("input %q: datatype %s, the model takes %s", d.Name, t.Datatype, d.Datatype)
		}
		if err := matchShape(t.Shape, d.Shape); err != nil {
			return nil, fmt.Errorf("input %q: %v", d.Name, err)
		}
		size := abi.Elements(t.Shape) * abi.DatatypeSize[d.Datatype]
		if n, ok := t.Parameters["binary_data_size"]; ok {
			bs, err := paramInt(n)
			if err != nil || bs != size || bs > int64(len(bin)) {
				return nil, fmt.Errorf("input %q: binary_data_size %v: want %d bytes (shape %v of %s), with that many left in the body", d.Name, n, size, t.Shape, d.Datatype)
			}
			buf = append(buf, bin[:bs]...)
			bin = bin[bs:]
			continue
		}
		b, err := encodeElements(d.Datatype, t.Data, abi.Elements(t.Shape))
		if err != nil {
			return nil, fmt.Errorf("input %q: %v", d.Name, err)
		}
		buf = append(buf, b...)
	}
	for n := range byName {
		return nil, fmt.Errorf("input %q is not one of the model's inputs (%s)", n, tensorNames(decl))
	}
	if len(bin) != 0 {
		return nil, fmt.Errorf("%d bytes of binary data after the last input", len(bin))
	}
	if buf == nil {
		buf = []byte{}
	}
	return buf, nil
}

func paramInt(v any) (int64, error) {
	switch n := v.(type) {
	case json.Number:
		return n.Int64()
	case float64:
		return int64(n), nil
	}
	return 0, fmt.Errorf("not a number")
}

func tensorNames(ts []abi.Tensor) string {
	var n []string
	for _, t := range ts {
		n = append(n, t.Name)
	}
	return strings.Join(n, ", ")
}

func matchShape(got, decl []int64) error {
	if len(got) != len(decl) {
		return fmt.Errorf("shape %v has %d dimensions, the model's %v has %d", got, len(got), decl, len(decl))
	}
	for i := range got {
		if got[i] < 0 || (decl[i] != -1 && got[i] != decl[i]) {
			return fmt.Errorf("shape %v does not match the model's %v", got, decl)
		}
	}
	return nil
}

type cut struct {
	shape []int64
	bytes []byte
}

// cutOutputs cuts the declared outputs from out, in order; the last one's
// variable dimension takes what is left.
func cutOutputs(out []byte, decl []abi.Tensor) ([]cut, error) {
	var res []cut
	for i, d := range decl {
		es := abi.DatatypeSize[d.Datatype]
		shape := append([]int64(nil), d.Shape...)
		fixed, vi := int64(1), -1
		for k, dim := range shape {
			if dim == -1 {
				vi = k
			} else {
				fixed *= dim
			}
		}
		if vi >= 0 {
			if i != len(decl)-1 || fixed*es == 0 || int64(len(out))%(fixed*es) != 0 {
				return nil, fmt.Errorf("output %q: %d bytes left do not make whole elements of shape %v", d.Name, len(out), d.Shape)
			}
			shape[vi] = int64(len(out)) / (fixed * es)
		}
		n := abi.Elements(shape) * es
		if n > int64(len(out)) {
			return nil, fmt.Errorf("output %q needs %d bytes, the function produced %d more", d.Name, n, len(out))
		}
		res = append(res, cut{shape, out[:n]})
		out = out[n:]
	}
	return res, nil
}

// encodeElements turns JSON data (flat or nested arrays) into n elements of
// datatype, little-endian.
func encodeElements(dt string, data json.RawMessage, n int64) ([]byte, error) {
	if len(data) == 0 {
		return nil, fmt.Errorf("no data (send \"data\" or the binary extension's binary_data_size)")
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, fmt.Errorf("data: %v", err)
	}
	var flat []any
	var walk func(any)
	walk = func(x any) {
		if a, ok := x.([]any); ok {
			for _, e := range a {
				walk(e)
			}
			return
		}
		flat = append(flat, x)
	}
	walk(v)
	if int64(len(flat)) != n {
		return nil, fmt.Errorf("data has %d elements, the shape holds %d", len(flat), n)
	}
	es := abi.DatatypeSize[dt]
	out := make([]byte, 0, int64(len(flat))*es)
	for i, x := range flat {
		b, err := encodeOne(dt, x)
		if err != nil {
			return nil, fmt.Errorf("data[%d]: %v", i, err)
		}
		out = append(out, b...)
	}
	return out, nil
}

func encodeOne(dt string, x any) ([]byte, error) {
	var b [8]byte
	if dt == "BOOL" {
		v, ok := x.(bool)
		if !ok {
			return nil, fmt.Errorf("%v is not a boolean", x)
		}
		if v {
			return []byte{1}, nil
		}
		return []byte{0}, nil
	}
	num, ok := x.(json.Number)
	if !ok {
		return nil, fmt.Errorf("%v is not a number", x)
	}
	switch dt {
	case "FP32", "FP64", "FP16":
		f, err := num.Float64()
		if err != nil {
			return nil, err
		}
		switch dt {
		case "FP32":
			binary.LittleEndian.PutUint32(b[:], math.Float32bits(float32(f)))
			return b[:4], nil
		case "FP64":
			binary.LittleEndian.PutUint64(b[:], math.Float64bits(f))
			return b[:8], nil
		}
		binary.LittleEndian.PutUint16(b[:], float16bits(float32(f)))
		return b[:2], nil
	}
	size := abi.DatatypeSize[dt]
	if strings.HasPrefix(dt, "UINT") {
		u, err := strconv.ParseUint(num.String(), 10, int(size*8))
		if err != nil {
			return nil, fmt.Errorf("%s is not a %s", num, dt)
		}
		binary.LittleEndian.PutUint64(b[:], u)
		return b[:size], nil
	}
	i, err := strconv.ParseInt(num.String(), 10, int(size*8))
	if err != nil {
		return nil, fmt.Errorf("%s is not an %s", num, dt)
	}
	binary.LittleEndian.PutUint64(b[:], uint64(i))
	return b[:size], nil
}

// decodeElements is the JSON data of a little-endian tensor (flat).
func decodeElements(dt string, b []byte) []any {
	es := int(abi.DatatypeSize[dt])
	out := make([]any, 0, len(b)/es)
	for i := 0; i+es <= len(b); i += es {
		e := b[i : i+es]
		var v any
		switch dt {
		case "BOOL":
			v = e[0] != 0
		case "UINT8":
			v = e[0]
		case "INT8":
			v = int8(e[0])
		case "UINT16":
			v = binary.LittleEndian.Uint16(e)
		case "INT16":
			v = int16(binary.LittleEndian.Uint16(e))
		case "UINT32":
			v = binary.LittleEndian.Uint32(e)
		case "INT32":
			v = int32(binary.LittleEndian.Uint32(e))
		case "UINT64":
			v = binary.LittleEndian.Uint64(e)
		case "INT64":
			v = int64(binary.LittleEndian.Uint64(e))
		case "FP32":
			v = math.Float32frombits(binary.LittleEndian.Uint32(e))
		case "FP64":
			v = math.Float64frombits(binary.LittleEndian.Uint64(e))
		case "FP16":
			v = float16to32(binary.LittleEndian.Uint16(e))
		}
		out = append(out, v)
	}
	return out
}

// float16bits rounds f to IEEE half precision (round to nearest even).
func float16bits(f float32) uint16 {
	b := math.Float32bits(f)
	sign := uint16(b>>16) & 0x8000
	exp := int((b>>23)&0xff) - 127 + 15
	man := b & 0x7fffff
	switch {
	case (b>>23)&0xff == 0xff: // inf, nan
		if man != 0 {
			return sign | 0x7e00
		}
		return sign | 0x7c00
	case exp >= 0x1f:
		return sign | 0x7c00
	case exp <= 0:
		if exp < -10 {
			return sign
		}
		man |= 0x800000
		shift := uint(14 - exp)
		h := uint16(man >> shift)
		if (man>>(shift-1))&1 != 0 && ((man&((1<<(shift-1))-1)) != 0 || h&1 != 0) {
			h++
		}
		return sign | h
	}
	h := sign | uint16(exp)<<10 | uint16(man>>13)
	if man&0x1000 != 0 && (man&0xfff != 0 || h&1 != 0) {
		h++
	}
	return h
}

func float16to32(h uint16) float32 {
	sign := uint32(h&0x8000) << 16
	exp := uint32(h>>10) & 0x1f
	man := uint32(h & 0x3ff)
	switch {
	case exp == 0x1f:
		return math.Float32frombits(sign | 0x7f800000 | man<<13)
	case exp == 0:
		if man == 0 {
			return math.Float32frombits(sign)
		}
		f := float32(man) / 1024 / 16384
		if sign != 0 {
			f = -f
		}
		return f
	}
	return math.Float32frombits(sign | (exp+112)<<23 | man<<13)
}
