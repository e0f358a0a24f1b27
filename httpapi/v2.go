package httpapi

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"unsafe"

	"github.com/valyala/fasthttp"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/engine"
)

// The Open Inference Protocol (KServe v2) over HTTP/REST: health, server and
// model metadata, and inference with JSON tensor data or the binary tensor
// data extension. A function is a model; its versions are Plover's version
// ids (or their 8+ character prefixes), and only the current one serves.

var pathV2 = []byte("/v2")

// isV2 reports whether path is /v2 or under it.
func isV2(path []byte) bool {
	return bytes.HasPrefix(path, pathV2) && (len(path) == len(pathV2) || path[len(pathV2)] == '/')
}

// v2Error writes the protocol's error object.
func v2Error(ctx *fasthttp.RequestCtx, code int, msg string) {
	writeJSON(ctx, code, map[string]string{"error": msg})
}

// v2Fail writes an engine or request error as the protocol's error object.
func (s *Server) v2Fail(ctx *fasthttp.RequestCtx, err error) {
	code, _ := classify(err)
	msg := err.Error()
	var re *engine.Error
	if errors.As(err, &re) {
		msg = re.Msg
	}
	v2Error(ctx, code, msg)
}

// v2 routes /v2... requests.
func (s *Server) v2(ctx *fasthttp.RequestCtx) {
	path := ctx.Path()
	switch {
	case string(path) == "/v2" || string(path) == "/v2/":
		if s.method(ctx, fasthttp.MethodGet) {
			writeJSON(ctx, fasthttp.StatusOK, map[string]any{"name": "plover", "version": s.opts.Version,
				"extensions": []string{"binary_tensor_data"}})
		}
	case string(path) == "/v2/health/live":
		if s.method(ctx, fasthttp.MethodGet) {
			writeJSON(ctx, fasthttp.StatusOK, map[string]bool{"live": true})
		}
	case string(path) == "/v2/health/ready":
		if s.method(ctx, fasthttp.MethodGet) {
			ok, _ := s.inv.Health()
			code := fasthttp.StatusOK
			if !ok || s.notReady.Load() {
				code = fasthttp.StatusServiceUnavailable
			}
			writeJSON(ctx, code, map[string]bool{"ready": code == fasthttp.StatusOK})
		}
	case bytes.HasPrefix(path, pathV2Models):
		name, version, action, ok := parseV2Model(path[len(pathV2Models):])
		if !ok {
			v2Error(ctx, fasthttp.StatusNotFound, "no route for "+string(path))
			return
		}
		s.v2Model(ctx, name, version, action)
	default:
		v2Error(ctx, fasthttp.StatusNotFound, "no route for "+string(path))
	}
}

var pathV2Models = []byte("/v2/models/")

// parseV2Model splits NAME[/versions/V][/ready|/infer]. The name and
// version borrow the path's bytes (as invoke's name does): the engine and
// the metrics copy a name before keeping it.
func parseV2Model(rest []byte) (name, version, action string, ok bool) {
	// Four segments at most (NAME/versions/V/ACTION): a fixed array keeps
	// the split off the heap.
	var segs [4][]byte
	n := 0
	for {
		if n == len(segs) {
			return "", "", "", false
		}
		seg, after, more := bytes.Cut(rest, []byte{'/'})
		segs[n] = seg
		n++
		if !more {
			break
		}
		rest = after
	}
	parts := segs[1:n]
	name = b2s(segs[0])
	if len(parts) >= 2 && string(parts[0]) == "versions" {
		version, parts = b2s(parts[1]), parts[2:]
	}
	switch {
	case len(parts) == 0:
	case len(parts) == 1 && string(parts[0]) == "ready":
		action = "ready"
	case len(parts) == 1 && string(parts[0]) == "infer":
		action = "infer"
	default:
		return "", "", "", false
	}
	return name, version, action, name != ""
}

func b2s(b []byte) string { return unsafe.String(unsafe.SliceData(b), len(b)) }

func (s *Server) v2Model(ctx *fasthttp.RequestCtx, name, version, action string) {
	want := fasthttp.MethodGet
	if action == "infer" {
		want = fasthttp.MethodPost
	}
	if !s.method(ctx, want) {
		return
	}
	// One resolution for the whole request: the version described, whose
	// tensors lay the inputs out, is the version that runs.
	pin, err := s.inv.Pin(context.Background(), name)
	if err != nil {
		s.v2Fail(ctx, err)
		return
	}
	defer pin.Release()
	cur := pin.Version()
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
		s.v2Infer(ctx, name, pin, ts)
	}
}

// v2Tensor is a tensor in an inference request, as the general decoder
// (encoding/json) reads it.
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

// inferHeader is an inference request's JSON header reduced to what the
// server acts on. Its strings and data may borrow the request body's bytes:
// it lives no longer than the request.
type inferHeader struct {
	id           string
	inputs       []inferTensor
	outputs      []inferTensor
	binaryOutput bool // parameters.binary_data_output
}

type inferTensor struct {
	name, datatype string
	shape          []int64
	data           []byte // the JSON value of "data", as sent; nil: none
	// parameters.binary_data_size of an input: hasBinSize; binSize, or
	// binSizeBad when it is no integer; binSizeText, from decode, the value
	// as its messages have always shown it (parse takes only integers that
	// print as they were sent).
	hasBinSize  bool
	binSize     int64
	binSizeBad  bool
	binSizeText string
	binOff      int64 // layInputs: where an input's binary bytes start
	binary      bool  // parameters.binary_data of an output
}

// v2Call is an inference's scratch state, pooled so that a binary-extension
// request allocates next to nothing. The embedded call gives writeMeta its
// timing buffer; its Gone stays nil, as v2 requests have never polled for a
// departed client.
type v2Call struct {
	call
	out  []byte // the engine's output
	lay  []byte // inputs laid out from JSON data
	hdr  inferHeader
	cuts []cut
	dims []int64 // the cuts' shapes
	num  [20]byte
}

var v2Calls = sync.Pool{New: func() any { return &v2Call{call: call{timing: make([]byte, 0, 160)}} }}

// keptTensors bounds the tensor and shape slices a pooled v2Call keeps, as
// keptBody bounds its buffers.
const keptTensors = 64

func (vc *v2Call) trim() {
	vc.req = engine.Request{}
	if cap(vc.out) > keptBody {
		vc.out = nil
	}
	if cap(vc.lay) > keptBody {
		vc.lay = nil
	}
	if cap(vc.hdr.inputs) > keptTensors || cap(vc.hdr.outputs) > keptTensors {
		vc.hdr = inferHeader{}
	}
	// Borrowed strings and data go: a body too large to be kept must not
	// stay reachable through them.
	vc.hdr.id = ""
	for _, ts := range [2][]inferTensor{vc.hdr.inputs, vc.hdr.outputs} {
		ts = ts[:cap(ts)] // parse reuses every element's shape
		for i := range ts {
			shape := ts[i].shape[:0]
			if cap(shape) > keptTensors {
				shape = nil
			}
			ts[i] = inferTensor{shape: shape}
		}
	}
	if cap(vc.cuts) > keptTensors || cap(vc.dims) > 8*keptTensors {
		vc.cuts, vc.dims = nil, nil
	}
}

var hdrInferHeaderLen = []byte("Inference-Header-Content-Length")

func (s *Server) v2Infer(ctx *fasthttp.RequestCtx, name string, pin engine.Pin, ts *abi.Tensors) {
	vc := v2Calls.Get().(*v2Call)
	defer func() {
		vc.trim()
		v2Calls.Put(vc)
	}()
	body, held, err := s.readBody(ctx, s.opts.MaxBodyBytes, &vc.in)
	if err != nil {
		s.v2Fail(ctx, err)
		return
	}
	defer s.releaseBody(held)
	// The binary extension: a JSON header of the given length, then the
	// tensors' bytes in input order.
	header, bin := body, []byte(nil)
	if h := ctx.Request.Header.PeekBytes(hdrInferHeaderLen); len(h) > 0 {
		n, err := strconv.Atoi(b2s(h))
		if err != nil || n < 0 || n > len(body) {
			v2Error(ctx, fasthttp.StatusBadRequest, "Inference-Header-Content-Length: "+strconv.Quote(string(h))+" is not a length within the body")
			return
		}
		header, bin = body[:n], body[n:]
	}
	h := &vc.hdr
	if !h.parse(header) {
		if err := h.decode(header); err != nil {
			v2Error(ctx, fasthttp.StatusBadRequest, "request body: invalid JSON: "+err.Error())
			return
		}
	}
	r := &vc.req
	r.Input, vc.lay, err = layInputs(h.inputs, ts.Inputs, bin, vc.lay[:0])
	if err != nil {
		v2Error(ctx, fasthttp.StatusBadRequest, err.Error())
		return
	}
	if err := deadline(ctx, r); err != nil {
		s.v2Fail(ctx, err)
		return
	}
	r.Output = vc.out[:0]
	err = pin.Invoke(context.Background(), r)
	vc.out, r.Input = r.Output, nil
	if err != nil {
		code, kind := classify(err) // only here: its errors.As target escapes
		s.metrics.record(name, code, kind, &r.Timing)
		s.v2Fail(ctx, err)
		return
	}
	// The function ran; what it produced may still not make a response
	// (too few bytes for its outputs, values JSON cannot carry): a 500,
	// counted as one.
	vc.cuts, vc.dims, err = cutOutputs(r.Output, ts.Outputs, vc.cuts[:0], vc.dims[:0])
	if err == nil {
		if h.allBinary(ts.Outputs) {
			writeBinary(ctx, vc, name)
		} else {
			err = writeInferJSON(ctx, h, name, r.Version, vc.cuts)
		}
	}
	if err != nil {
		s.metrics.record(name, fasthttp.StatusInternalServerError, engine.KindInternal, &r.Timing)
		v2Error(ctx, fasthttp.StatusInternalServerError, err.Error())
		return
	}
	s.metrics.record(name, fasthttp.StatusOK, engine.KindInternal, &r.Timing)
	s.writeMeta(ctx, &vc.call)
}

// allBinary reports whether every output goes in the binary extension.
func (h *inferHeader) allBinary(decl []abi.Tensor) bool {
	if h.binaryOutput {
		return true
	}
	for _, d := range decl {
		if !h.wantsBinary(d.Name) {
			return false
		}
	}
	return true
}

func (h *inferHeader) wantsBinary(name string) bool {
	for i := range h.outputs {
		if h.outputs[i].binary && h.outputs[i].name == name {
			return true
		}
	}
	return false
}

// writeBinary writes the response when every output is binary: the JSON
// header appended by hand into the response's own buffer (the bytes
// encoding/json would produce from writeInferJSON's maps: sorted keys, its
// escaping), then the outputs' bytes after it.
func writeBinary(ctx *fasthttp.RequestCtx, vc *v2Call, name string) {
	b := ctx.Response.SwapBody(nil)[:0]
	b = append(b, '{')
	if vc.hdr.id != "" {
		b = append(b, `"id":`...)
		b = appendJSONString(b, vc.hdr.id)
		b = append(b, ',')
	}
	b = append(b, `"model_name":`...)
	b = appendJSONString(b, name)
	b = append(b, `,"model_version":`...)
	b = appendJSONString(b, vc.req.Version)
	b = append(b, `,"outputs":[`...)
	tail := 0
	for i := range vc.cuts {
		o := &vc.cuts[i]
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, `{"datatype":`...)
		b = appendJSONString(b, o.decl.Datatype)
		b = append(b, `,"name":`...)
		b = appendJSONString(b, o.decl.Name)
		b = append(b, `,"parameters":{"binary_data_size":`...)
		b = strconv.AppendInt(b, int64(len(o.bytes)), 10)
		b = append(b, `},"shape":[`...)
		for k, d := range o.shape {
			if k > 0 {
				b = append(b, ',')
			}
			b = strconv.AppendInt(b, d, 10)
		}
		b = append(b, "]}"...)
		tail += len(o.bytes)
	}
	b = append(b, "]}"...)
	n := len(b)
	// The outputs are contiguous in the engine's output, in order.
	b = append(b, vc.req.Output[:tail]...)
	ctx.Response.SwapBody(b)
	ctx.SetStatusCode(fasthttp.StatusOK)
	if tail == 0 {
		// No bytes follow the header: plain JSON, as writeInferJSON answers.
		ctx.Response.Header.SetContentTypeBytes(contentTypeJSON)
		return
	}
	ctx.Response.Header.SetContentTypeBytes(octetStream)
	ctx.Response.Header.SetCanonical(hdrInferHeaderLen, strconv.AppendInt(vc.num[:0], int64(n), 10))
}

var contentTypeJSON = []byte("application/json")

// appendJSONString appends s as encoding/json writes it. Names, versions
// and ids are plain ASCII: anything else takes encoding/json itself.
func appendJSONString(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c > 0x7e || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			js, _ := json.Marshal(s)
			return append(b, js...)
		}
	}
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"')
}

// writeInferJSON writes a response with JSON data for some output. An
// output whose JSON data would hold NaN or an infinity, which JSON has no
// numbers for, is an error (and nothing is written): the binary extension
// carries those values.
func writeInferJSON(ctx *fasthttp.RequestCtx, h *inferHeader, name, version string, outs []cut) error {
	resp := map[string]any{"model_name": name, "model_version": version, "outputs": nil}
	if h.id != "" {
		resp["id"] = h.id
	}
	var tail []byte
	outList := make([]map[string]any, 0, len(outs))
	for i := range outs {
		o, decl := &outs[i], outs[i].decl
		t := map[string]any{"name": decl.Name, "datatype": decl.Datatype, "shape": o.shape}
		if h.binaryOutput || h.wantsBinary(decl.Name) {
			t["parameters"] = map[string]any{"binary_data_size": len(o.bytes)}
			tail = append(tail, o.bytes...)
		} else {
			data := decodeElements(decl.Datatype, o.bytes)
			if k, v, ok := nonFinite(data); ok {
				return fmt.Errorf("output %q: element %d is %v, which JSON data cannot carry: ask for the output in binary "+
					"(the request's parameters.binary_data_output, or the output's parameters.binary_data)", decl.Name, k, v)
			}
			t["data"] = data
		}
		outList = append(outList, t)
	}
	resp["outputs"] = outList
	js, err := json.Marshal(resp)
	if err != nil {
		return fmt.Errorf("encoding the response: %v", err)
	}
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
	return nil
}

// nonFinite finds the first NaN or infinity among decodeElements' values
// (only FP16, FP32 and FP64 ones can be).
func nonFinite(data []any) (k int, v float64, ok bool) {
	for k, x := range data {
		switch f := x.(type) {
		case float32:
			v = float64(f)
		case float64:
			v = f
		default:
			return 0, 0, false // one datatype: no floats at all
		}
		if math.IsNaN(v) || math.IsInf(v, 0) {
			return k, v, true
		}
	}
	return 0, 0, false
}

// decode reads header with encoding/json, for what parse leaves to it: its
// errors are the ones clients have always seen.
func (h *inferHeader) decode(header []byte) error {
	var req v2Request
	dec := json.NewDecoder(bytes.NewReader(header))
	dec.UseNumber()
	if err := dec.Decode(&req); err != nil {
		return err
	}
	*h = inferHeader{id: req.ID, binaryOutput: paramBool(req.Parameters, "binary_data_output")}
	for _, t := range req.Inputs {
		it := inferTensor{name: t.Name, datatype: t.Datatype, shape: t.Shape, data: t.Data}
		if n, ok := t.Parameters["binary_data_size"]; ok {
			it.hasBinSize, it.binSizeText = true, fmt.Sprint(n)
			it.binSize, ok = paramInt(n)
			it.binSizeBad = !ok
		}
		h.inputs = append(h.inputs, it)
	}
	for _, t := range req.Outputs {
		h.outputs = append(h.outputs, inferTensor{name: t.Name, binary: paramBool(t.Parameters, "binary_data")})
	}
	return nil
}

func paramBool(p map[string]any, key string) bool {
	b, _ := p[key].(bool)
	return b
}

func paramInt(v any) (int64, bool) {
	switch n := v.(type) {
	case json.Number:
		i, err := n.Int64()
		return i, err == nil
	case float64:
		return int64(n), true
	}
	return 0, false
}

// parse decodes the header without encoding/json, for the requests clients
// send: keys spelled as the protocol spells them, each once, strings in
// plain ASCII, integers where integers go. Anything else, valid or not, it
// declines (false) and decode reads it, so that what is accepted and what
// it means stay encoding/json's. Strings borrow header's bytes.
func (h *inferHeader) parse(header []byte) bool {
	p := hdrParser{b: header}
	h.id, h.binaryOutput = "", false
	h.inputs, h.outputs = h.inputs[:0], h.outputs[:0]
	return p.object(headerKeys, true, func(k int) bool {
		switch k {
		case 0:
			id, ok := p.str()
			h.id = b2s(id)
			return ok
		case 1:
			return p.tensors(&h.inputs, true)
		case 2:
			return p.tensors(&h.outputs, false)
		}
		return p.object(binaryOutputKey, false, func(int) bool {
			v, ok := p.bool()
			h.binaryOutput = v
			return ok
		})
	}) && p.end()
}

// The keys parse reads, in the order the field functions number them.
var (
	headerKeys      = []string{"id", "inputs", "outputs", "parameters"}
	tensorKeys      = []string{"name", "datatype", "shape", "data", "parameters"}
	binaryOutputKey = []string{"binary_data_output"}
	binarySizeKey   = []string{"binary_data_size"}
	binaryDataKey   = []string{"binary_data"}
)

// hdrParser reads JSON from b at i.
type hdrParser struct {
	b []byte
	i int
}

// maxDepth bounds skip's recursion; deeper values are decode's.
const maxDepth = 64

func (p *hdrParser) ws() {
	for p.i < len(p.b) {
		switch p.b[p.i] {
		case ' ', '\t', '\n', '\r':
			p.i++
		default:
			return
		}
	}
}

// eat consumes c after any whitespace.
func (p *hdrParser) eat(c byte) bool {
	p.ws()
	if p.i < len(p.b) && p.b[p.i] == c {
		p.i++
		return true
	}
	return false
}

// end: nothing but whitespace is left. (decode, reading one value, would
// ignore what follows; parse leaves that case to it.)
func (p *hdrParser) end() bool {
	p.ws()
	return p.i == len(p.b)
}

// str reads a string of printable ASCII without escapes.
func (p *hdrParser) str() ([]byte, bool) {
	if !p.eat('"') {
		return nil, false
	}
	start := p.i
	for ; p.i < len(p.b); p.i++ {
		switch c := p.b[p.i]; {
		case c == '"':
			p.i++
			return p.b[start : p.i-1], true
		case c < 0x20 || c >= 0x80 || c == '\\':
			return nil, false
		}
	}
	return nil, false
}

// int reads an integer that fits an int64 with room to spare (18 digits).
func (p *hdrParser) int() (int64, bool) {
	p.ws()
	neg := p.i < len(p.b) && p.b[p.i] == '-'
	if neg {
		p.i++
	}
	start := p.i
	var n int64
	for ; p.i < len(p.b) && p.b[p.i] >= '0' && p.b[p.i] <= '9'; p.i++ {
		if p.i-start == 18 {
			return 0, false
		}
		n = n*10 + int64(p.b[p.i]-'0')
	}
	if digits := p.i - start; digits == 0 || (digits > 1 && p.b[start] == '0') {
		return 0, false
	}
	if p.i < len(p.b) && (p.b[p.i] == '.' || p.b[p.i] == 'e' || p.b[p.i] == 'E') {
		return 0, false
	}
	if neg {
		if n == 0 {
			return 0, false // -0 would not print as sent
		}
		n = -n
	}
	return n, true
}

func (p *hdrParser) bool() (v, ok bool) {
	p.ws()
	switch {
	case bytes.HasPrefix(p.b[p.i:], []byte("true")):
		p.i += 4
		return true, true
	case bytes.HasPrefix(p.b[p.i:], []byte("false")):
		p.i += 5
		return false, true
	}
	return false, false
}

// tensors reads an array of tensors into *dst, reusing its capacity.
func (p *hdrParser) tensors(dst *[]inferTensor, input bool) bool {
	if !p.eat('[') {
		return false
	}
	if p.eat(']') {
		return true
	}
	for {
		n := len(*dst)
		if n < cap(*dst) {
			*dst = (*dst)[:n+1]
		} else {
			*dst = append(*dst, inferTensor{})
		}
		t := &(*dst)[n]
		*t = inferTensor{shape: t.shape[:0]}
		if !p.tensor(t, input) {
			return false
		}
		if p.eat(',') {
			continue
		}
		return p.eat(']')
	}
}

// tensor reads one tensor object. Of its parameters only an input's
// binary_data_size and an output's binary_data mean anything here.
func (p *hdrParser) tensor(t *inferTensor, input bool) bool {
	return p.object(tensorKeys, true, func(k int) bool {
		switch k {
		case 0:
			b, ok := p.str()
			t.name = b2s(b)
			return ok
		case 1:
			b, ok := p.str()
			t.datatype = b2s(b)
			return ok
		case 2:
			return p.shape(t)
		case 3:
			p.ws()
			start := p.i
			ok := p.skip(0)
			t.data = p.b[start:p.i]
			return ok
		}
		if input {
			return p.object(binarySizeKey, false, func(int) bool {
				n, ok := p.int()
				t.hasBinSize, t.binSize = true, n
				return ok
			})
		}
		return p.object(binaryDataKey, false, func(int) bool {
			v, ok := p.bool()
			t.binary = v
			return ok
		})
	})
}

func (p *hdrParser) shape(t *inferTensor) bool {
	if !p.eat('[') {
		return false
	}
	if p.eat(']') {
		return true
	}
	for {
		d, ok := p.int()
		if !ok {
			return false
		}
		t.shape = append(t.shape, d)
		if p.eat(',') {
			continue
		}
		return p.eat(']')
	}
}

// object reads a JSON object, handing each key that is one of names to
// field (with its index), at most once per key; other keys are skipped. With
// fold, a key that matches a name only case-insensitively declines the
// object, since encoding/json would take it for that field (parameters are
// a map there, so for them fold is false).
func (p *hdrParser) object(names []string, fold bool, field func(k int) bool) bool {
	if !p.eat('{') {
		return false
	}
	if p.eat('}') {
		return true
	}
	var seen uint32
	for {
		key, ok := p.str()
		if !ok || !p.eat(':') {
			return false
		}
		k := -1
		for i, n := range names {
			if string(key) == n {
				k = i
				break
			}
		}
		switch {
		case k >= 0:
			if seen&(1<<k) != 0 || !field(k) {
				return false
			}
			seen |= 1 << k
		case fold && foldsTo(key, names...), !p.skip(0):
			return false
		}
		if p.eat(',') {
			continue
		}
		return p.eat('}')
	}
}

// foldsTo reports whether key matches one of names only case-insensitively,
// which encoding/json would take for that field: left to decode.
func foldsTo(key []byte, names ...string) bool {
	for _, n := range names {
		if bytes.EqualFold(key, []byte(n)) {
			return true
		}
	}
	return false
}

// skip consumes one valid JSON value of any kind.
func (p *hdrParser) skip(depth int) bool {
	p.ws()
	if p.i >= len(p.b) || depth > maxDepth {
		return false
	}
	switch p.b[p.i] {
	case '"':
		return p.skipString()
	case '{':
		p.i++
		if p.eat('}') {
			return true
		}
		for {
			if !p.skipString() || !p.eat(':') || !p.skip(depth+1) {
				return false
			}
			if p.eat(',') {
				continue
			}
			return p.eat('}')
		}
	case '[':
		p.i++
		if p.eat(']') {
			return true
		}
		for {
			if !p.skip(depth + 1) {
				return false
			}
			if p.eat(',') {
				continue
			}
			return p.eat(']')
		}
	case 't':
		return p.literal("true")
	case 'f':
		return p.literal("false")
	case 'n':
		return p.literal("null")
	}
	return p.number()
}

func (p *hdrParser) literal(s string) bool {
	if !bytes.HasPrefix(p.b[p.i:], []byte(s)) {
		return false
	}
	p.i += len(s)
	return true
}

// skipString consumes a string, escapes and all (any byte from 0x20 up is
// allowed unescaped, as encoding/json allows it).
func (p *hdrParser) skipString() bool {
	if !p.eat('"') {
		return false
	}
	for p.i < len(p.b) {
		c := p.b[p.i]
		p.i++
		switch {
		case c == '"':
			return true
		case c < 0x20:
			return false
		case c == '\\':
			if p.i >= len(p.b) {
				return false
			}
			e := p.b[p.i]
			p.i++
			switch e {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
			case 'u':
				if p.i+4 > len(p.b) {
					return false
				}
				for _, x := range p.b[p.i : p.i+4] {
					if !('0' <= x && x <= '9' || 'a' <= x && x <= 'f' || 'A' <= x && x <= 'F') {
						return false
					}
				}
				p.i += 4
			default:
				return false
			}
		}
	}
	return false
}

// number consumes -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?.
func (p *hdrParser) number() bool {
	digits := func() int {
		start := p.i
		for p.i < len(p.b) && p.b[p.i] >= '0' && p.b[p.i] <= '9' {
			p.i++
		}
		return p.i - start
	}
	if p.i < len(p.b) && p.b[p.i] == '-' {
		p.i++
	}
	start := p.i
	if n := digits(); n == 0 || (n > 1 && p.b[start] == '0') {
		return false
	}
	if p.i < len(p.b) && p.b[p.i] == '.' {
		p.i++
		if digits() == 0 {
			return false
		}
	}
	if p.i < len(p.b) && (p.b[p.i] == 'e' || p.b[p.i] == 'E') {
		p.i++
		if p.i < len(p.b) && (p.b[p.i] == '+' || p.b[p.i] == '-') {
			p.i++
		}
		if digits() == 0 {
			return false
		}
	}
	return true
}

// layInputs puts the request's tensors in declared order (the function's
// input buffer: inputs back to back, as the model declares them), checking
// names, datatypes and shapes. The binary extension's bytes hold the binary
// inputs in the order the REQUEST lists them (the protocol: "in the same
// order as the tensors appear in the inputs list"), so each one's offset in
// bin is worked out in request order first (kept in its binOff), and the
// bytes are then taken from there in declared order. When the binary bytes
// already are the declared layout (every input binary, each where the one
// declared before it ends: request order is declared order, but for empty
// inputs) the result is bin itself, and the engine reads the inputs where
// they arrived (as invoke's body). Otherwise they are laid out in buf.
func layInputs(got []inferTensor, decl []abi.Tensor, bin []byte, buf []byte) ([]byte, []byte, error) {
	// Linear search below a few inputs, as requests have; a map above, so
	// that a header of many inputs costs no quadratic time.
	var byName map[string]int
	if len(got) > 16 {
		byName = make(map[string]int, len(got))
	}
	for i := range got {
		dup := false
		if byName != nil {
			_, dup = byName[got[i].name]
			byName[got[i].name] = i
		} else {
			for j := range i {
				dup = dup || got[j].name == got[i].name
			}
		}
		if dup {
			return nil, buf, fmt.Errorf("input %q is given twice", got[i].name)
		}
	}
	// Offsets in request order. A size that cannot be right (no integer,
	// negative) takes no room: its input fails its own check below. The
	// running offset stops past the end of bin, so that sums cannot
	// overflow; an input placed there fails the bounds check.
	end := int64(len(bin)) + 1
	off := int64(0)
	for i := range got {
		t := &got[i]
		t.binOff = off
		if t.hasBinSize && !t.binSizeBad && t.binSize > 0 {
			off = min(off+min(t.binSize, end), end)
		}
	}
	var used uint32                 // by index, without byName
	inPlace, laid := true, int64(0) // bin is the layout so far: its first laid bytes
	var short *inferTensor          // the first binary input past the end of bin
	for _, d := range decl {
		i := -1
		if byName != nil {
			if k, ok := byName[d.Name]; ok {
				i = k
				delete(byName, d.Name)
			}
		} else {
			for k := range got {
				if used&(1<<k) == 0 && got[k].name == d.Name {
					i = k
					used |= 1 << k
					break
				}
			}
		}
		if i < 0 {
			return nil, buf, fmt.Errorf("input %q is missing (the model takes %s)", d.Name, tensorNames(decl))
		}
		t := &got[i]
		if t.datatype != d.Datatype {
			return nil, buf, fmt.Errorf("input %q: datatype %s, the model takes %s", d.Name, t.datatype, d.Datatype)
		}
		if err := matchShape(t.shape, d.Shape); err != nil {
			return nil, buf, fmt.Errorf("input %q: %v", d.Name, err)
		}
		size, ok := tensorBytes(t.shape, abi.DatatypeSize[d.Datatype])
		if !ok {
			return nil, buf, fmt.Errorf("input %q: shape %v of %s: its byte size overflows an int64", d.Name, t.shape, d.Datatype)
		}
		if t.hasBinSize {
			if t.binSizeBad || t.binSize != size {
				var n any = t.binSize
				if t.binSizeText != "" {
					n = t.binSizeText
				}
				return nil, buf, fmt.Errorf("input %q: binary_data_size %v: want %d bytes (shape %v of %s), with that many left in the body", d.Name, n, size, t.shape, d.Datatype)
			}
			if size > int64(len(bin))-t.binOff {
				// Reported once every input's own size is checked: an
				// input listed before it may be the one that is wrong.
				if short == nil {
					short = t
				}
				continue
			}
			if inPlace && (t.binOff == laid || size == 0) {
				laid += size
				continue
			}
			if inPlace {
				buf = append(buf, bin[:laid]...)
				inPlace = false
			}
			buf = append(buf, bin[t.binOff:t.binOff+size]...)
			continue
		}
		if inPlace {
			buf = append(buf, bin[:laid]...)
			inPlace = false
		}
		b, err := encodeElements(d.Datatype, t.data, size/abi.DatatypeSize[d.Datatype])
		if err != nil {
			return nil, buf, fmt.Errorf("input %q: %v", d.Name, err)
		}
		buf = append(buf, b...)
	}
	for n := range byName {
		return nil, buf, fmt.Errorf("input %q is not one of the model's inputs (%s)", n, tensorNames(decl))
	}
	for k := range got {
		if byName == nil && used&(1<<k) == 0 {
			return nil, buf, fmt.Errorf("input %q is not one of the model's inputs (%s)", got[k].name, tensorNames(decl))
		}
	}
	if short != nil {
		return nil, buf, fmt.Errorf("input %q: binary_data_size %d: the body's binary data ends before it (%d bytes, the binary inputs in the order the request lists them)", short.name, short.binSize, len(bin))
	}
	if off != int64(len(bin)) {
		return nil, buf, fmt.Errorf("%d bytes of binary data after the last input", int64(len(bin))-off)
	}
	if inPlace {
		if laid == 0 {
			return []byte{}, buf, nil
		}
		return bin[:laid], buf, nil
	}
	return buf, buf, nil
}

// tensorBytes is the byte size of a shape (of dimensions not negative) of
// elements of es bytes; false when it does not fit an int64, which a shape
// sent in a request may ask for.
func tensorBytes(shape []int64, es int64) (int64, bool) {
	if slices.Contains(shape, 0) {
		return 0, true
	}
	n := es
	for _, d := range shape {
		if d < 0 || (d > 0 && n > math.MaxInt64/d) {
			return 0, false
		}
		n *= d
	}
	return n, true
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

// cut is one output: its declaration, shape and bytes.
type cut struct {
	decl  *abi.Tensor
	shape []int64
	bytes []byte
}

// cutOutputs cuts the declared outputs from out, in order, appending to
// res; the last one's variable dimension takes what is left. The shapes
// are laid in dims (a slice of it stays valid when a later append moves
// dims: the old array keeps its values).
func cutOutputs(out []byte, decl []abi.Tensor, res []cut, dims []int64) ([]cut, []int64, error) {
	for i := range decl {
		d := &decl[i]
		es := abi.DatatypeSize[d.Datatype]
		start := len(dims)
		dims = append(dims, d.Shape...)
		shape := dims[start:len(dims):len(dims)]
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
				return res, dims, fmt.Errorf("output %q: %d bytes left do not make whole elements of shape %v", d.Name, len(out), d.Shape)
			}
			shape[vi] = int64(len(out)) / (fixed * es)
		}
		n := abi.Elements(shape) * es
		if n > int64(len(out)) {
			return res, dims, fmt.Errorf("output %q needs %d bytes, the function produced %d more", d.Name, n, len(out))
		}
		res = append(res, cut{d, shape, out[:n]})
		out = out[n:]
	}
	return res, dims, nil
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
