package grpcapi

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/apierr"
	"github.com/plover-run/plover/call"
	"github.com/plover-run/plover/errdefs"
	pb "github.com/plover-run/plover/grpcapi/inferencepb"
	"github.com/plover-run/plover/oip"
	"github.com/plover-run/plover/pipeline"
)

// layInputs puts the request's inputs in the model's declared order into
// r.Input, checking names, datatypes and shapes. The inputs come all raw
// (raw_input_contents, one entry per input in the request's order) or all
// typed (each input's contents); typed reports which. raw is the raw
// contents, whole or in the pieces the codec left them in. Where into, a slot
// lent for the function (its input region), holds them, they are laid out
// there, where its device reads them (inSlot); otherwise a single raw
// input is used where it arrived, with no copy. maxInput is the model's
// max_input_bytes (0: not known here; the engine checks it after): inputs
// past it are refused before any is laid out, as typed contents widen (an
// INT64 zero is one byte in the message and eight laid out); step, for a
// pipeline, is the step whose max_input_bytes it is (pipeline.Pin.InputBound).
func layInputs(req *pb.ModelInferRequest, raw rawInputs, decl []abi.Tensor, maxInput int64, step pipeline.StepRef, into []byte, r *call.Request) (typed, inSlot bool, err error) {
	got := req.GetInputs()
	if n := raw.count(); n > 0 && n != len(got) {
		return false, false, badRequest("raw_input_contents has %d entries for %d inputs: send one per input, in the order of inputs", n, len(got))
	}
	typed = raw.count() == 0
	idx := make(map[string]int, len(got))
	for i, t := range got {
		if _, dup := idx[t.GetName()]; dup {
			return false, false, badRequest("input %s is given twice", errdefs.QuoteName(t.GetName()))
		}
		idx[t.GetName()] = i
		if !typed && t.GetContents() != nil {
			return false, false, badRequest("input %s has contents beside raw_input_contents: send every input one way", errdefs.QuoteName(t.GetName()))
		}
	}
	// Every input found and checked, and their sum, before any is laid out.
	order := make([]int, len(decl)) // decl[k] is got[order[k]]
	var total int64
	for k, d := range decl {
		i, ok := idx[d.Name]
		if !ok {
			return false, false, badRequest("%v", oip.MissingInput(decl, d.Name, len(got), func(i int) string { return got[i].GetName() }))
		}
		delete(idx, d.Name)
		order[k] = i
		t := got[i]
		size, err := oip.CheckInput(t.GetDatatype(), t.GetShape(), d)
		var classed *apierr.Error // a size that overflows: too large
		if errors.As(err, &classed) {
			return false, false, err
		}
		if err != nil {
			return false, false, badRequest("%v", err)
		}
		if !typed {
			if n := raw.size(i); int64(n) != size {
				return false, false, badRequest("input %q: raw_input_contents[%d] has %d bytes, shape %v of %s needs %d", d.Name, i, n, t.GetShape(), d.Datatype, size)
			}
		} else if err := countTyped(d.Datatype, t.GetContents(), size/abi.DatatypeSize[d.Datatype]); err != nil {
			return false, false, badRequest("input %q: %v", d.Name, err)
		}
		// Each size is at most what the message holds (counted above), times
		// eight: the sum cannot overflow.
		if total += size; maxInput > 0 && total > maxInput {
			return false, false, oip.InputOver(req.GetModelName(), d.Name, t.GetShape(), d.Datatype, total, maxInput, step)
		}
	}
	for n := range idx {
		return false, false, badRequest("input %s is not one of the model's inputs (%s)", errdefs.QuoteName(n), oip.Names(decl))
	}
	var buf []byte
	switch {
	case into != nil && total <= int64(len(into)):
		buf, inSlot = into[:0], true
	case !typed && len(decl) == 1 && len(got) == 1:
		r.Input = raw.one(order[0]) // the one input, where it arrived if in one piece
		return false, false, nil
	default:
		buf = make([]byte, 0, total)
	}
	for k, d := range decl {
		if !typed {
			buf = raw.appendTo(buf, order[k])
			continue
		}
		if buf, err = appendTyped(buf, d.Datatype, got[order[k]].GetContents()); err != nil {
			return false, false, badRequest("input %q: %v", d.Name, err)
		}
	}
	r.Input = buf
	return typed, inSlot, nil
}

// countTyped checks that c holds n elements in the typed field for
// datatype dt, and none in any other field. A count that is off names that
// field, and a field of another datatype that holds elements: a client
// that put UINT8 elements in int_contents learns where they go, not just
// that none came. Elements in another field beside a right count are
// refused too: only dt's field is laid out, so they were dropped
// unannounced, and a client that sent them meant something by them (a
// wrong datatype, or values put in the wrong field) that it would not learn.
func countTyped(dt string, c *pb.InferTensorContents, n int64) error {
	fields := [...]struct {
		name string
		have int
	}{
		{"bool_contents", len(c.GetBoolContents())},
		{"int_contents", len(c.GetIntContents())},
		{"int64_contents", len(c.GetInt64Contents())},
		{"uint_contents", len(c.GetUintContents())},
		{"uint64_contents", len(c.GetUint64Contents())},
		{"fp32_contents", len(c.GetFp32Contents())},
		{"fp64_contents", len(c.GetFp64Contents())},
		// No datatype here takes it (BYTES is none of a model's), so its
		// elements are always another field's.
		{"bytes_contents", len(c.GetBytesContents())},
	}
	var want string
	switch dt {
	case "BOOL":
		want = "bool_contents"
	case "INT8", "INT16", "INT32":
		want = "int_contents"
	case "INT64":
		want = "int64_contents"
	case "UINT8", "UINT16", "UINT32":
		want = "uint_contents"
	case "UINT64":
		want = "uint64_contents"
	case "FP32":
		want = "fp32_contents"
	case "FP64":
		want = "fp64_contents"
	default: // FP16: the protocol has no typed field for it
		return fmt.Errorf("%s has no typed contents in the protocol: send it in raw_input_contents", dt)
	}
	have, other, otherHas := 0, "", 0
	for _, f := range fields {
		switch {
		case f.name == want:
			have = f.have
		case f.have > 0 && other == "":
			other, otherHas = f.name, f.have
		}
	}
	if int64(have) != n {
		stray := ""
		if other != "" {
			stray = fmt.Sprintf(" (%s holds %d, not the field for %s)", other, otherHas, dt)
		}
		return fmt.Errorf("contents hold %d elements in %s, the field for %s; the shape holds %d%s", have, want, dt, n, stray)
	}
	if other != "" {
		return fmt.Errorf("contents hold %d elements in %s, not the field for %s (%s): send an input's elements in its datatype's field alone", otherHas, other, dt, want)
	}
	return nil
}

// appendTyped appends the elements of datatype dt in c (countTyped has
// checked their number), little-endian, checking that each fits the
// datatype (an INT8 sent as int_contents 300 is refused, not wrapped).
func appendTyped(b []byte, dt string, c *pb.InferTensorContents) ([]byte, error) {
	switch dt {
	case "BOOL":
		for _, x := range c.GetBoolContents() {
			if x {
				b = append(b, 1)
			} else {
				b = append(b, 0)
			}
		}
	case "INT8", "INT16", "INT32":
		bits := abi.DatatypeSize[dt] * 8
		lo, hi := int64(-1)<<(bits-1), int64(1)<<(bits-1)-1
		for k, x := range c.GetIntContents() {
			if int64(x) < lo || int64(x) > hi {
				return b, fmt.Errorf("int_contents[%d] = %d is not an %s", k, x, dt)
			}
			b = appendInt(b, uint64(x), bits/8)
		}
	case "INT64":
		for _, x := range c.GetInt64Contents() {
			b = binary.LittleEndian.AppendUint64(b, uint64(x))
		}
	case "UINT8", "UINT16", "UINT32":
		bits := abi.DatatypeSize[dt] * 8
		for k, x := range c.GetUintContents() {
			if bits < 32 && uint64(x) >= 1<<bits {
				return b, fmt.Errorf("uint_contents[%d] = %d is not a %s", k, x, dt)
			}
			b = appendInt(b, uint64(x), bits/8)
		}
	case "UINT64":
		for _, x := range c.GetUint64Contents() {
			b = binary.LittleEndian.AppendUint64(b, x)
		}
	case "FP32":
		for _, x := range c.GetFp32Contents() {
			b = binary.LittleEndian.AppendUint32(b, math.Float32bits(x))
		}
	case "FP64":
		for _, x := range c.GetFp64Contents() {
			b = binary.LittleEndian.AppendUint64(b, math.Float64bits(x))
		}
	}
	return b, nil
}

func appendInt(b []byte, v uint64, size int64) []byte {
	for i := int64(0); i < size; i++ {
		b = append(b, byte(v>>(8*i)))
	}
	return b
}

// maxTypedAnswer bounds a typed answer on the wire, as maxJSONOutput
// (httpapi) bounds the outputs /v2 writes as JSON numbers: a typed answer
// is built whole in memory twice, as Go slices (an INT8 element widens to
// an int32, 4 bytes) and then as the message, in which an element takes up
// to 10 bytes (a negative int32 is a 10-byte varint), for a request of a
// few bytes and in no budget. Past it the answer goes raw, as one over the
// message limit does: every client of the protocol reads raw outputs, and
// typed contents are for answers small enough to spell out a number at a
// time.
const maxTypedAnswer = 16 << 20

// outputs cuts the function's output into its declared outputs and
// answers the picked ones: raw_output_contents, or typed contents when the
// inputs came typed, every answered datatype has a typed field (the
// protocol allows one way for all outputs of a response) and the typed
// message would take at most limit bytes. That is decided from the
// output's bytes before any typed field is built, so an answer that goes
// raw costs no more than a raw one.
func outputs(req *pb.ModelInferRequest, r *call.Request, decl []abi.Tensor, pick []int, typed bool, limit int) (*pb.ModelInferResponse, error) {
	cuts, _, err := oip.CutOutputs(r.Output, decl, nil, nil)
	if err != nil {
		return nil, &apierr.Error{Status: apierr.BadOutput, Msg: err.Error()}
	}
	answer := oip.Picked(nil, cuts, pick)
	resp := &pb.ModelInferResponse{ModelName: req.GetModelName(), ModelVersion: r.Version, Id: req.GetId(),
		Outputs: make([]*pb.ModelInferResponse_InferOutputTensor, len(answer))}
	for j := range answer {
		c := &answer[j]
		resp.Outputs[j] = &pb.ModelInferResponse_InferOutputTensor{Name: c.Decl.Name, Datatype: c.Decl.Datatype, Shape: c.Shape}
	}
	if typed && typedSize(resp, answer, limit) <= limit {
		for j := range answer {
			resp.Outputs[j].Contents = typedContents(answer[j].Decl.Datatype, answer[j].Bytes)
		}
		return resp, nil
	}
	// r.Output is this request's own buffer: the message may hold it as
	// it is.
	resp.RawOutputContents = make([][]byte, len(answer))
	for j := range answer {
		resp.RawOutputContents[j] = answer[j].Bytes
	}
	return resp, nil
}

// The field numbers whose tags typedSize counts: InferOutputTensor's
// contents, and the last of InferTensorContents' typed fields
// (fp64_contents), whose tag is as long as any of theirs.
const (
	contentsField  protowire.Number = 5
	lastTypedField protowire.Number = 7
)

// typedSize is the bytes resp, which holds no contents yet, takes on the
// wire once each output j holds answer[j] as typed contents, as
// proto.Size would count them built; past limit it may stop counting at
// any value over limit. An output of a datatype without a typed field
// (FP16) makes it over limit.
func typedSize(resp *pb.ModelInferResponse, answer []oip.Cut, limit int) int {
	size := proto.Size(resp)
	for j, o := range resp.Outputs {
		c := &answer[j]
		if c.Decl.Datatype == "FP16" {
			return limit + 1
		}
		payload := typedPayload(c.Decl.Datatype, c.Bytes, limit)
		contents := 0 // an empty packed field is not written
		if len(c.Bytes) > 0 {
			contents = protowire.SizeTag(lastTypedField) + protowire.SizeBytes(payload)
		}
		// The output grows by its contents field, and its own length
		// prefix in resp with it.
		before := proto.Size(o)
		after := before + protowire.SizeTag(contentsField) + protowire.SizeBytes(contents)
		if size += protowire.SizeBytes(after) - protowire.SizeBytes(before); size > limit {
			return size
		}
	}
	return size
}

// typedPayload is the bytes of b's elements of dt packed in their typed
// field, or any count over limit once it passes it: every element takes a
// byte at least, so an output of more elements than limit is not read.
func typedPayload(dt string, b []byte, limit int) int {
	switch dt {
	case "BOOL", "FP32", "FP64": // one-byte varints, fixed32s, fixed64s: their bytes
		return len(b)
	}
	es := int(abi.DatatypeSize[dt])
	if len(b)/es > limit {
		return len(b) / es
	}
	word := wordOf(dt)
	n := 0
	for i := 0; i+es <= len(b) && n <= limit; i += es {
		n += protowire.SizeVarint(word(b[i:]))
	}
	return n
}

// wordOf decodes a little-endian element of dt into 64 bits: an integer
// sign- or zero-extended, as protobuf writes it as a varint (a negative
// int32 in 10 bytes), a float's bits, a bool's byte.
func wordOf(dt string) func([]byte) uint64 {
	le := binary.LittleEndian
	switch dt {
	case "INT8":
		return func(e []byte) uint64 { return uint64(int8(e[0])) }
	case "INT16":
		return func(e []byte) uint64 { return uint64(int16(le.Uint16(e))) }
	case "INT32":
		return func(e []byte) uint64 { return uint64(int32(le.Uint32(e))) }
	case "UINT16":
		return func(e []byte) uint64 { return uint64(le.Uint16(e)) }
	case "UINT32", "FP32":
		return func(e []byte) uint64 { return uint64(le.Uint32(e)) }
	case "INT64", "UINT64", "FP64":
		return le.Uint64
	default: // BOOL, UINT8
		return func(e []byte) uint64 { return uint64(e[0]) }
	}
}

// typedContents decodes little-endian elements of dt into the protocol's
// typed field for dt (not FP16, which has none), its slice made at its
// length: appended one at a time, a slice's growth allocated several
// times what it came to.
func typedContents(dt string, b []byte) *pb.InferTensorContents {
	es, word := int(abi.DatatypeSize[dt]), wordOf(dt)
	c := &pb.InferTensorContents{}
	switch dt {
	case "BOOL":
		c.BoolContents = decodeAll(b, es, word, func(w uint64) bool { return w != 0 })
	case "INT8", "INT16", "INT32":
		c.IntContents = decodeAll(b, es, word, func(w uint64) int32 { return int32(w) })
	case "INT64":
		c.Int64Contents = decodeAll(b, es, word, func(w uint64) int64 { return int64(w) })
	case "UINT8", "UINT16", "UINT32":
		c.UintContents = decodeAll(b, es, word, func(w uint64) uint32 { return uint32(w) })
	case "UINT64":
		c.Uint64Contents = decodeAll(b, es, word, func(w uint64) uint64 { return w })
	case "FP32":
		c.Fp32Contents = decodeAll(b, es, word, func(w uint64) float32 { return math.Float32frombits(uint32(w)) })
	case "FP64":
		c.Fp64Contents = decodeAll(b, es, word, math.Float64frombits)
	}
	return c
}

// decodeAll is b's elements of es bytes each, word's 64 bits as T.
func decodeAll[T any](b []byte, es int, word func([]byte) uint64, as func(uint64) T) []T {
	out := make([]T, len(b)/es)
	for i := range out {
		out[i] = as(word(b[i*es:]))
	}
	return out
}
