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
	"sync"
	"time"
	"unsafe"

	"github.com/valyala/fasthttp"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/apierr"
	"github.com/plover-run/plover/call"
	"github.com/plover-run/plover/ioshare"
	"github.com/plover-run/plover/oip"
	"github.com/plover-run/plover/pipeline"
	"github.com/plover-run/plover/reqmetrics"
)

// The Open Inference Protocol (KServe v2) over HTTP/REST: health, server and
// model metadata, and inference with JSON tensor data or the binary tensor
// data extension. A function is a model; its versions are Plover's version
// ids (or their 8+ character prefixes) or, from a model repository, its
// version folders' labels; any available version serves (oip.Pin).

var pathV2 = []byte("/v2")

// isV2 reports whether path is /v2 or under it.
func isV2(path []byte) bool {
	return bytes.HasPrefix(path, pathV2) && (len(path) == len(pathV2) || path[len(pathV2)] == '/')
}

// v2Error writes the protocol's error object.
func v2Error(ctx *fasthttp.RequestCtx, code int, msg string) {
	writeJSON(ctx, code, map[string]string{"error": msg})
}

// v2 routes /v2... requests.
func (s *Server) v2(ctx *fasthttp.RequestCtx) {
	path := ctx.Path()
	switch {
	case string(path) == "/v2" || string(path) == "/v2/":
		if s.method(ctx, fasthttp.MethodGet) {
			ext := []string{"binary_tensor_data"}
			if s.opts.Repository != nil {
				ext = append(ext, "model_repository")
			}
			writeJSON(ctx, fasthttp.StatusOK, map[string]any{"name": "plover", "version": s.opts.Version, "extensions": ext})
		}
	case string(path) == "/v2/health/live":
		if s.method(ctx, fasthttp.MethodGet) {
			writeJSON(ctx, fasthttp.StatusOK, map[string]bool{"live": true})
		}
	case string(path) == "/v2/health/ready":
		if s.method(ctx, fasthttp.MethodGet) {
			ok, _ := s.door.Health()
			code := fasthttp.StatusOK
			if !ok || !s.Ready() {
				code = fasthttp.StatusServiceUnavailable
			}
			writeJSON(ctx, code, map[string]bool{"ready": code == fasthttp.StatusOK})
		}
	case bytes.HasPrefix(path, pathRepository):
		s.repository(ctx)
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

// parseV2Model splits NAME[/versions/V][/ready|/infer]: the name and
// version are the path's bytes, borrowed.
func parseV2Model(rest []byte) (name, version call.Name, action string, ok bool) {
	// Four segments at most (NAME/versions/V/ACTION): a fixed array keeps
	// the split off the heap.
	var segs [4][]byte
	n := 0
	for {
		if n == len(segs) {
			return call.Name{}, call.Name{}, "", false
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
	name = call.BorrowName(segs[0])
	if len(parts) >= 2 && string(parts[0]) == "versions" {
		version, parts = call.BorrowName(parts[1]), parts[2:]
	}
	switch {
	case len(parts) == 0:
	case len(parts) == 1 && string(parts[0]) == "ready":
		action = "ready"
	case len(parts) == 1 && string(parts[0]) == "infer":
		action = "infer"
	default:
		return call.Name{}, call.Name{}, "", false
	}
	return name, version, action, len(segs[0]) > 0
}

func b2s(b []byte) string { return unsafe.String(unsafe.SliceData(b), len(b)) }

func (s *Server) v2Model(ctx *fasthttp.RequestCtx, name, version call.Name, action string) {
	want := fasthttp.MethodGet
	if action == "infer" {
		want = fasthttp.MethodPost
	}
	if !s.method(ctx, want) {
		return
	}
	if action == "infer" {
		s.v2Infer(ctx, name, version.Borrow())
		return
	}
	fn := name.Borrow()
	dl, err := headerDeadline(ctx)
	if err != nil {
		s.fail(ctx, err)
		return
	}
	// A model the caller may not learn of reads as no model, before any
	// pin (gate.View.Hide).
	var pin pipeline.Pin
	var ts *abi.Tensors
	err = s.view(ctx).Hide(fn)
	if err == nil {
		pin, ts, err = oip.Pin(context.Background(), s.door, fn, version.Borrow(), s.door.Deadline(started(ctx), dl))
	}
	var pe *pipeline.PlanError
	if action == "ready" && errors.As(err, &pe) {
		// A pipeline whose steps do not resolve (a step's function
		// deleted): it exists, but its requests fail before they run.
		writeJSON(ctx, fasthttp.StatusServiceUnavailable, map[string]any{"name": fn, "ready": false})
		return
	}
	if err != nil {
		s.fail(ctx, oip.MetadataError(fn, err, s.view(ctx).Sees))
		return
	}
	cur := pin.Version()
	unready := action == "ready" && pin.Unready(time.Now()) != nil
	pin.Release()
	switch action {
	case "":
		writeJSON(ctx, fasthttp.StatusOK, map[string]any{"name": fn, "versions": []string{cur.ID}, "platform": "plover",
			"inputs": ts.Inputs, "outputs": ts.Outputs})
	case "ready":
		// Ready: the devices healthy, and a request to the model may run
		// now (not a function whose load failed for good, nor one backing
		// off: pipeline.Pin.Unready).
		ok, _ := s.door.Health()
		ok = ok && !unready
		code := fasthttp.StatusOK
		if !ok {
			code = fasthttp.StatusServiceUnavailable
		}
		writeJSON(ctx, code, map[string]any{"name": fn, "ready": ok})
	}
}

// v2Call is an inference's scratch state, pooled so that a binary-extension
// request allocates next to nothing. The embedded exchange gives writeMeta
// its timing buffer and the engine its check for a departed client (Gone,
// bound once, as on /v1).
type v2Call struct {
	exchange
	out  []byte // the engine's output
	lay  []byte // inputs laid out from JSON data
	hdr  inferHeader
	cuts []oip.Cut
	dims []int64   // the cuts' shapes
	pick []int     // the outputs asked for (oip.Requested); empty: all
	ans  []oip.Cut // the cuts answered, picked
	num  [20]byte
}

var v2Calls = sync.Pool{New: func() any {
	vc := &v2Call{exchange: exchange{timing: make([]byte, 0, reqmetrics.ServerTimingCap)}}
	vc.req.Gone = vc.gone
	return vc
}}

// keptTensors bounds the tensor and shape slices a pooled v2Call keeps, as
// keptBody bounds its buffers.
const keptTensors = 64

func (vc *v2Call) trim() {
	vc.req = call.Request{Gone: vc.req.Gone}
	vc.conn = nil
	vc.out, vc.lay = kept(vc.out), kept(vc.lay)
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
	// The cuts point into the output and at the version's tensors.
	clear(vc.cuts[:cap(vc.cuts)])
	clear(vc.ans[:cap(vc.ans)])
	if cap(vc.cuts) > keptTensors || cap(vc.dims) > 8*keptTensors || cap(vc.ans) > keptTensors || cap(vc.pick) > keptTensors {
		vc.cuts, vc.dims, vc.ans, vc.pick = nil, nil, nil, nil
	}
}

var hdrInferHeaderLen = []byte("Inference-Header-Content-Length")

// v2Infer reads the request, then pins the function's version: a slow
// upload must not hold a version (and its device memory) that a deploy
// replaced, as a pin would from the start; so, as on /v1, an unknown model
// is a 404 after its body is read. Every outcome, refusals included, is
// written and counted by finish, as on /v1.
func (s *Server) v2Infer(ctx *fasthttp.RequestCtx, name call.Name, version string) {
	vc := v2Calls.Get().(*v2Call)
	defer func() {
		vc.trim()
		v2Calls.Put(vc)
	}()
	vc.req.Timing = call.Timing{}
	vc.conn = ctx.Conn()
	err := s.v2Run(ctx, vc, name, version)
	s.finish(ctx, name, &vc.exchange, err)
	if err == nil {
		s.writeMeta(ctx, &vc.exchange)
	}
}

// v2Run is v2Infer's work: the response written, or the error to write.
func (s *Server) v2Run(ctx *fasthttp.RequestCtx, vc *v2Call, name call.Name, version string) error {
	r := &vc.req
	// Before the body: a bad timeout header costs no upload.
	if err := s.begin(ctx, r); err != nil {
		return err
	}
	limit, err := s.inputLimit(ctx, name, version, v2JSON, r.Deadline)
	if err != nil {
		return err
	}
	fn := name.Borrow()
	tn := s.turnsOf(ctx, fn, r)
	body, held, err := s.readBody(ctx, limit, &vc.in, tn)
	if err != nil {
		return err
	}
	defer s.releaseBody(held)

	// The binary extension: a JSON header of the given length, then the
	// tensors' bytes in input order.
	header, bin := body, []byte(nil)
	if h := ctx.Request.Header.PeekBytes(hdrInferHeaderLen); len(h) > 0 {
		n, err := strconv.Atoi(b2s(h))
		if err != nil || n < 0 || n > len(body) {
			return badField("Inference-Header-Content-Length", strconv.Quote(string(h))+" is not a length within the body")
		}
		header, bin = body[:n], body[n:]
	}
	h := &vc.hdr
	// Decoding the header and laying the tensors out are the server's CPU
	// on the function's bytes, metered; finding the version between them
	// is not (it may wait for a store read), but the model's total counts
	// it, as /v1's does (Runner.Invoke). One clock read ends each step and
	// starts the next.
	t := ioshare.Now()
	err = h.read(header)
	looked := tn.fl.MeteredSince(t)
	if err != nil {
		return err
	}
	pin, ts, err := oip.Pin(s.runCheck(ctx, version), s.door, fn, version, r.Deadline)
	if err != nil {
		return err
	}
	defer pin.Release()
	found := ioshare.Now()
	if vc.pick, err = oip.Requested(vc.pick[:0], h.outputs, outputName, ts.Outputs); err == nil {
		lim := inputBound{model: fn}
		lim.max, lim.step = pin.InputBound()
		r.Input, vc.lay, err = layInputs(h, ts.Inputs, bin, vc.lay[:0], lim)
		if err != nil { // layInputs' own errors are the request's fault
			err = classed(err, apierr.BadRequest)
		}
	}
	t = tn.fl.MeteredSince(found)
	if err != nil {
		return err
	}
	r.Output = vc.out[:0]
	err = pin.InvokeSince(context.Background(), r, (t - (found - looked)).Time())
	vc.out, r.Input = r.Output, nil
	if err != nil {
		return err
	}
	// The function ran; what it produced may still not make a response
	// (too few bytes for its outputs, values JSON cannot carry): a 500
	// that says why, counted as one.
	t = ioshare.Now() // and encoding the answer is metered
	vc.cuts, vc.dims, err = oip.CutOutputs(r.Output, ts.Outputs, vc.cuts[:0], vc.dims[:0])
	if err == nil {
		vc.ans = oip.Picked(vc.ans[:0], vc.cuts, vc.pick)
		if h.allBinary(vc.ans) {
			writeBinary(ctx, vc, fn)
		} else {
			err = writeInferJSON(ctx, h, fn, r.Version, vc.ans)
		}
	}
	tn.fl.MeteredSince(t)
	if err == nil {
		s.pieceAnswer(ctx, tn)
	}
	if err != nil { // an output the protocol cannot carry, but for writeInferJSON's refusal
		return classed(err, apierr.BadOutput)
	}
	return nil
}

// classed is err as an *apierr.Error: as it is if it is one (a 413 of
// max_input_bytes, a refusal of JSON data), else with status st. Called
// on the error path only: its errors.As target escapes.
func classed(err error, st apierr.Status) error {
	var ae *apierr.Error
	if errors.As(err, &ae) {
		return err
	}
	return &apierr.Error{Status: st, Msg: err.Error()}
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
	for i := range vc.ans {
		o := &vc.ans[i]
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, `{"datatype":`...)
		b = appendJSONString(b, o.Decl.Datatype)
		b = append(b, `,"name":`...)
		b = appendJSONString(b, o.Decl.Name)
		b = append(b, `,"parameters":{"binary_data_size":`...)
		b = strconv.AppendInt(b, int64(len(o.Bytes)), 10)
		b = appendShape(append(b, `},"shape":[`...), o.Shape)
	}
	b = append(b, "]}"...)
	n := len(b)
	for i := range vc.ans {
		b = append(b, vc.ans[i].Bytes...)
	}
	tail := len(b) - n
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

// maxJSONOutput bounds the output bytes one response carries as JSON
// data. Written as JSON numbers an element takes up to 7 times its bytes
// (an INT8 "-128," is 5 for 1; a UINT8 output of 16 MiB made 57 MiB of
// JSON), and the answer is built in memory before it is sent; the binary
// extension carries any size at its own. Past it the request is refused
// (400) with what to ask for instead: the function has run, but a client
// that asks the same way would get the same refusal, so it is the
// request's to change. README, "Open Inference Protocol".
const maxJSONOutput = 16 << 20

// writeInferJSON writes a response with JSON data for some output, by
// hand into the response's buffer, as encoding/json would write it from
// maps (sorted keys, its number format; TestWriteInferJSONMatchesEncodingJSON),
// but without a value per element: decoded into []any first, a 16 MiB
// output took 441 MiB of memory. An output whose JSON data would hold NaN
// or an infinity, which JSON has no numbers for, is an error (and nothing
// is written): the binary extension carries those values. So is JSON data
// of more than maxJSONOutput bytes of outputs, a 400.
func writeInferJSON(ctx *fasthttp.RequestCtx, h *inferHeader, name, version string, outs []oip.Cut) error {
	var inJSON, room int64
	for i := range outs {
		o := &outs[i]
		if !h.binaryOutput && !h.wantsBinary(o.Decl.Name) {
			inJSON += int64(len(o.Bytes))
			room += int64(len(o.Bytes)) / abi.DatatypeSize[o.Decl.Datatype] * maxElementText[o.Decl.Datatype]
		}
	}
	if inJSON > maxJSONOutput {
		return &apierr.Error{Status: apierr.BadRequest, Msg: fmt.Sprintf("the outputs asked for as JSON data hold %d bytes, over the %d that JSON data carries: "+
			"ask for them in binary (the request's parameters.binary_data_output, or an output's parameters.binary_data)", inJSON, maxJSONOutput)}
	}
	ctx.Response.Reset()
	b := ctx.Response.SwapBody(nil)[:0]
	b = slices.Grow(b, int(room)+256)
	b = append(b, '{')
	if h.id != "" {
		b = append(b, `"id":`...)
		b = appendJSONString(b, h.id)
		b = append(b, ',')
	}
	b = append(b, `"model_name":`...)
	b = appendJSONString(b, name)
	b = append(b, `,"model_version":`...)
	b = appendJSONString(b, version)
	b = append(b, `,"outputs":[`...)
	tail := 0 // the binary outputs' bytes, appended after the header
	for i := range outs {
		o, decl := &outs[i], outs[i].Decl
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, '{')
		binary := h.binaryOutput || h.wantsBinary(decl.Name)
		if !binary {
			b = append(b, `"data":[`...)
			var err error
			if b, err = appendData(b, decl.Datatype, o.Bytes); err != nil {
				// Grown to the answer's bound: the response keeps it for
				// the connection's life under the error written next.
				ctx.Response.SwapBody(kept(b))
				return fmt.Errorf("output %q: %v, which JSON data cannot carry: ask for the output in binary "+
					"(the request's parameters.binary_data_output, or the output's parameters.binary_data)", decl.Name, err)
			}
			b = append(b, "],"...)
		}
		b = append(b, `"datatype":`...)
		b = appendJSONString(b, decl.Datatype)
		b = append(b, `,"name":`...)
		b = appendJSONString(b, decl.Name)
		if binary {
			b = append(b, `,"parameters":{"binary_data_size":`...)
			b = strconv.AppendInt(b, int64(len(o.Bytes)), 10)
			b = append(b, '}')
			tail += len(o.Bytes)
		}
		b = appendShape(append(b, `,"shape":[`...), o.Shape)
	}
	b = append(b, "]}"...)
	n := len(b)
	for i := range outs {
		if h.binaryOutput || h.wantsBinary(outs[i].Decl.Name) {
			b = append(b, outs[i].Bytes...)
		}
	}
	ctx.Response.SwapBody(b)
	ctx.SetStatusCode(fasthttp.StatusOK)
	if tail > 0 {
		ctx.SetContentType("application/octet-stream")
		ctx.Response.Header.Set("Inference-Header-Content-Length", strconv.Itoa(n))
	} else {
		ctx.SetContentType("application/json")
	}
	return nil
}

// maxElementText is what appendData writes for an element of each
// datatype, its comma included, at most for the integers and for most
// floats: the JSON is grown once to fit. A float below 1e21 but far from 1
// is written whole ('f'), -1.2345678e20 as FP32 in 23 bytes, and answers
// full of such values grow past it (a copy, up to twice the memory); room
// for them in every answer would be half as much again for the usual ones.
var maxElementText = map[string]int64{
	"BOOL": 6, "UINT8": 4, "INT8": 5, "UINT16": 6, "INT16": 7, "UINT32": 11, "INT32": 12,
	"UINT64": 21, "INT64": 21, "FP16": 16, "FP32": 16, "FP64": 25,
}

// appendData appends the elements of little-endian tensor bytes b of
// datatype dt as JSON numbers (or true and false) separated by commas, as
// encoding/json writes the Go values they are; an element NaN or
// infinite is an error naming it.
func appendData(dst []byte, dt string, b []byte) ([]byte, error) {
	es := int(abi.DatatypeSize[dt])
	le := binary.LittleEndian
	for i, k := 0, 0; i+es <= len(b); i, k = i+es, k+1 {
		if k > 0 {
			dst = append(dst, ',')
		}
		e := b[i : i+es]
		switch dt {
		case "BOOL":
			dst = strconv.AppendBool(dst, e[0] != 0)
		case "UINT8":
			dst = strconv.AppendUint(dst, uint64(e[0]), 10)
		case "INT8":
			dst = strconv.AppendInt(dst, int64(int8(e[0])), 10)
		case "UINT16":
			dst = strconv.AppendUint(dst, uint64(le.Uint16(e)), 10)
		case "INT16":
			dst = strconv.AppendInt(dst, int64(int16(le.Uint16(e))), 10)
		case "UINT32":
			dst = strconv.AppendUint(dst, uint64(le.Uint32(e)), 10)
		case "INT32":
			dst = strconv.AppendInt(dst, int64(int32(le.Uint32(e))), 10)
		case "UINT64":
			dst = strconv.AppendUint(dst, le.Uint64(e), 10)
		case "INT64":
			dst = strconv.AppendInt(dst, int64(le.Uint64(e)), 10)
		default:
			var f float64
			bits := 32
			switch dt {
			case "FP32":
				f = float64(math.Float32frombits(le.Uint32(e)))
			case "FP16":
				f = float64(float16to32(le.Uint16(e)))
			default:
				f, bits = math.Float64frombits(le.Uint64(e)), 64
			}
			if math.IsNaN(f) || math.IsInf(f, 0) {
				return dst, fmt.Errorf("element %d is %v", k, f)
			}
			dst = appendFloat(dst, f, bits)
		}
	}
	return dst, nil
}

// appendFloat appends f (a float32's value when bits is 32) as
// encoding/json writes it: the shortest text that reads back as it, in
// exponent form below 1e-6 and from 1e21, with an exponent of one digit
// not padded (1e-7, not 1e-07).
func appendFloat(dst []byte, f float64, bits int) []byte {
	abs := math.Abs(f)
	format := byte('f')
	if abs != 0 && (bits == 64 && (abs < 1e-6 || abs >= 1e21) || bits == 32 && (float32(abs) < 1e-6 || float32(abs) >= 1e21)) {
		format = 'e'
	}
	dst = strconv.AppendFloat(dst, f, format, -1, bits)
	if format == 'e' {
		if n := len(dst); n >= 4 && dst[n-4] == 'e' && dst[n-3] == '-' && dst[n-2] == '0' {
			dst[n-2] = dst[n-1]
			dst = dst[:n-1]
		}
	}
	return dst
}

// appendShape appends shape's dimensions, comma-separated, and closes the
// array and the output's object.
func appendShape(b []byte, shape []int64) []byte {
	for k, d := range shape {
		if k > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendInt(b, d, 10)
	}
	return append(b, "]}"...)
}
