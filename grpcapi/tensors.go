package grpcapi

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"

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

// outputs cuts the function's output into its declared outputs and
// answers the picked ones: raw_output_contents, or typed contents when the
// inputs came typed and every answered datatype has a typed field (the
// protocol allows one way for all outputs of a response).
func outputs(req *pb.ModelInferRequest, r *call.Request, decl []abi.Tensor, pick []int, typed bool) (*pb.ModelInferResponse, error) {
	cuts, _, err := oip.CutOutputs(r.Output, decl, nil, nil)
	if err != nil {
		return nil, &apierr.Error{Status: apierr.BadOutput, Msg: err.Error()}
	}
	answer := oip.Picked(nil, cuts, pick)
	for _, c := range answer {
		if c.Decl.Datatype == "FP16" {
			typed = false
		}
	}
	resp := &pb.ModelInferResponse{ModelName: req.GetModelName(), ModelVersion: r.Version, Id: req.GetId(),
		Outputs: make([]*pb.ModelInferResponse_InferOutputTensor, len(answer))}
	if !typed {
		resp.RawOutputContents = make([][]byte, len(answer))
	}
	for j := range answer {
		c := &answer[j]
		o := &pb.ModelInferResponse_InferOutputTensor{Name: c.Decl.Name, Datatype: c.Decl.Datatype, Shape: c.Shape}
		if typed {
			o.Contents = typedContents(c.Decl.Datatype, c.Bytes)
		} else {
			// r.Output is this request's own buffer: the message may
			// hold it as it is.
			resp.RawOutputContents[j] = c.Bytes
		}
		resp.Outputs[j] = o
	}
	return resp, nil
}

// typedContents decodes little-endian elements of dt into the protocol's
// typed field for dt (not FP16, which has none).
func typedContents(dt string, b []byte) *pb.InferTensorContents {
	es := int(abi.DatatypeSize[dt])
	n := len(b) / es
	c := &pb.InferTensorContents{}
	le := binary.LittleEndian
	for i := 0; i < n; i++ {
		e := b[i*es : (i+1)*es]
		switch dt {
		case "BOOL":
			c.BoolContents = append(c.BoolContents, e[0] != 0)
		case "INT8":
			c.IntContents = append(c.IntContents, int32(int8(e[0])))
		case "INT16":
			c.IntContents = append(c.IntContents, int32(int16(le.Uint16(e))))
		case "INT32":
			c.IntContents = append(c.IntContents, int32(le.Uint32(e)))
		case "INT64":
			c.Int64Contents = append(c.Int64Contents, int64(le.Uint64(e)))
		case "UINT8":
			c.UintContents = append(c.UintContents, uint32(e[0]))
		case "UINT16":
			c.UintContents = append(c.UintContents, uint32(le.Uint16(e)))
		case "UINT32":
			c.UintContents = append(c.UintContents, le.Uint32(e))
		case "UINT64":
			c.Uint64Contents = append(c.Uint64Contents, le.Uint64(e))
		case "FP32":
			c.Fp32Contents = append(c.Fp32Contents, math.Float32frombits(le.Uint32(e)))
		case "FP64":
			c.Fp64Contents = append(c.Fp64Contents, math.Float64frombits(le.Uint64(e)))
		}
	}
	return c
}
