package grpcapi

import (
	"encoding/binary"
	"fmt"
	"math"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/apierr"
	"github.com/plover-run/plover/call"
	pb "github.com/plover-run/plover/grpcapi/inferencepb"
	"github.com/plover-run/plover/oip"
)

// layInputs puts the request's inputs in the model's declared order into
// r.Input, checking names, datatypes and shapes. The inputs come all raw
// (raw_input_contents, one entry per input in the request's order) or all
// typed (each input's contents); typed reports which. A single raw input
// is used where it arrived, with no copy.
func layInputs(req *pb.ModelInferRequest, decl []abi.Tensor, r *call.Request) (typed bool, err error) {
	got := req.GetInputs()
	raw := req.GetRawInputContents()
	if len(raw) > 0 && len(raw) != len(got) {
		return false, badRequest("raw_input_contents has %d entries for %d inputs: send one per input, in the order of inputs", len(raw), len(got))
	}
	typed = len(raw) == 0
	idx := make(map[string]int, len(got))
	for i, t := range got {
		if _, dup := idx[t.GetName()]; dup {
			return false, badRequest("input %q is given twice", t.GetName())
		}
		idx[t.GetName()] = i
		if !typed && t.GetContents() != nil {
			return false, badRequest("input %q has contents beside raw_input_contents: send every input one way", t.GetName())
		}
	}
	var buf []byte
	for _, d := range decl {
		i, ok := idx[d.Name]
		if !ok {
			return false, badRequest("input %q is missing (the model takes %s)", d.Name, oip.Names(decl))
		}
		delete(idx, d.Name)
		t := got[i]
		size, err := oip.CheckInput(t.GetDatatype(), t.GetShape(), d)
		if err != nil {
			return false, badRequest("%v", err)
		}
		if !typed {
			b := raw[i]
			if int64(len(b)) != size {
				return false, badRequest("input %q: raw_input_contents[%d] has %d bytes, shape %v of %s needs %d", d.Name, i, len(b), t.GetShape(), d.Datatype, size)
			}
			if len(decl) == 1 && len(got) == 1 {
				r.Input = b // the one input, where it arrived
				return false, nil
			}
			buf = append(buf, b...)
			continue
		}
		n := size / abi.DatatypeSize[d.Datatype] // the shape's elements
		if buf, err = appendTyped(buf, d.Datatype, t.GetContents(), n); err != nil {
			return false, badRequest("input %q: %v", d.Name, err)
		}
	}
	for n := range idx {
		return false, badRequest("input %q is not one of the model's inputs (%s)", n, oip.Names(decl))
	}
	if buf == nil {
		buf = []byte{}
	}
	r.Input = buf
	return typed, nil
}

// appendTyped appends n elements of datatype dt from c, little-endian,
// checking that each fits the datatype (an INT8 sent as int_contents
// 300 is refused, not wrapped).
func appendTyped(b []byte, dt string, c *pb.InferTensorContents, n int64) ([]byte, error) {
	count := func(have int) error {
		if int64(have) != n {
			return fmt.Errorf("contents hold %d elements, the shape holds %d", have, n)
		}
		return nil
	}
	switch dt {
	case "BOOL":
		v := c.GetBoolContents()
		if err := count(len(v)); err != nil {
			return b, err
		}
		for _, x := range v {
			if x {
				b = append(b, 1)
			} else {
				b = append(b, 0)
			}
		}
	case "INT8", "INT16", "INT32":
		v := c.GetIntContents()
		if err := count(len(v)); err != nil {
			return b, err
		}
		bits := abi.DatatypeSize[dt] * 8
		lo, hi := int64(-1)<<(bits-1), int64(1)<<(bits-1)-1
		for k, x := range v {
			if int64(x) < lo || int64(x) > hi {
				return b, fmt.Errorf("int_contents[%d] = %d is not an %s", k, x, dt)
			}
			b = appendInt(b, uint64(x), bits/8)
		}
	case "INT64":
		v := c.GetInt64Contents()
		if err := count(len(v)); err != nil {
			return b, err
		}
		for _, x := range v {
			b = binary.LittleEndian.AppendUint64(b, uint64(x))
		}
	case "UINT8", "UINT16", "UINT32":
		v := c.GetUintContents()
		if err := count(len(v)); err != nil {
			return b, err
		}
		bits := abi.DatatypeSize[dt] * 8
		for k, x := range v {
			if bits < 32 && uint64(x) >= 1<<bits {
				return b, fmt.Errorf("uint_contents[%d] = %d is not a %s", k, x, dt)
			}
			b = appendInt(b, uint64(x), bits/8)
		}
	case "UINT64":
		v := c.GetUint64Contents()
		if err := count(len(v)); err != nil {
			return b, err
		}
		for _, x := range v {
			b = binary.LittleEndian.AppendUint64(b, x)
		}
	case "FP32":
		v := c.GetFp32Contents()
		if err := count(len(v)); err != nil {
			return b, err
		}
		for _, x := range v {
			b = binary.LittleEndian.AppendUint32(b, math.Float32bits(x))
		}
	case "FP64":
		v := c.GetFp64Contents()
		if err := count(len(v)); err != nil {
			return b, err
		}
		for _, x := range v {
			b = binary.LittleEndian.AppendUint64(b, math.Float64bits(x))
		}
	default: // FP16: the protocol has no typed field for it
		return b, fmt.Errorf("%s has no typed contents in the protocol: send it in raw_input_contents", dt)
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
