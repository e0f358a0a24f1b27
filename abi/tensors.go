package abi

import (
	"fmt"
)

// Tensors declares a function's inputs and outputs for the Open Inference
// Protocol (KServe v2). Inputs are laid out in the input buffer in declared
// order, outputs cut from out in declared order; little-endian, row-major.
type Tensors struct {
	Inputs  []Tensor `json:"inputs"`
	Outputs []Tensor `json:"outputs"`
}

// Tensor is one named tensor; a shape dimension of -1 is variable (at most
// one per tensor).
type Tensor struct {
	Name     string  `json:"name"`
	Datatype string  `json:"datatype"`
	Shape    []int64 `json:"shape"`
}

// DatatypeSize is the byte size of one element of each protocol datatype
// Plover supports (BYTES, strings of varying length, is not).
var DatatypeSize = map[string]int64{
	"BOOL": 1, "UINT8": 1, "UINT16": 2, "UINT32": 4, "UINT64": 8,
	"INT8": 1, "INT16": 2, "INT32": 4, "INT64": 8, "FP16": 2, "FP32": 4, "FP64": 8,
}

// RawTensors are the tensors of a function that declares none: its request
// and response bytes.
var RawTensors = Tensors{
	Inputs:  []Tensor{{Name: "INPUT0", Datatype: "UINT8", Shape: []int64{-1}}},
	Outputs: []Tensor{{Name: "OUTPUT0", Datatype: "UINT8", Shape: []int64{-1}}},
}

// MaxTensors bounds the tensors one side (inputs, outputs) declares. 1,024
// inputs of 8 dimensions are some 12,300 values of a /v2 request's header,
// within the 16,384 one may hold (oip.MaxParts): a function declaring many
// more could not be sent all its inputs. Every version of a function's
// record keeps a copy of its tensors, so they bound its size too
// (registry.MaxRecordBytes). A rule of admission: a bundle stored with more
// still loads.
const MaxTensors = 1024

// counts refuses a side that declares more than MaxTensors tensors.
func (t *Tensors) counts() *FieldError {
	if t == nil {
		return nil
	}
	for _, side := range []struct {
		field string
		n     int
	}{{"tensors.inputs", len(t.Inputs)}, {"tensors.outputs", len(t.Outputs)}} {
		if side.n > MaxTensors {
			return &FieldError{side.field, fmt.Sprintf("declares %d tensors, at most %d", side.n, MaxTensors)}
		}
	}
	return nil
}

var tensorNameClass = byteClass{first: "A-Za-z0-9_.:/-", rest: "A-Za-z0-9_.:/-", max: 64} // ^[A-Za-z0-9_.:/-]{1,64}$

func (t *Tensors) validate() error {
	if t == nil {
		return nil
	}
	for _, side := range []struct {
		field string
		ts    []Tensor
	}{{"tensors.inputs", t.Inputs}, {"tensors.outputs", t.Outputs}} {
		if len(side.ts) == 0 {
			return &FieldError{side.field, "must declare at least one tensor"}
		}
		seen := map[string]bool{}
		variable := 0
		left := int64(MaxBufferBytes) // what the tensors' fixed bytes may still take
		for i, x := range side.ts {
			f := fmt.Sprintf("%s[%d]", side.field, i)
			switch {
			case !tensorNameClass.match(x.Name):
				return &FieldError{f + ".name", fmt.Sprintf("%q must match [A-Za-z0-9_.:/-]{1,64}", x.Name)}
			case seen[x.Name]:
				return &FieldError{f + ".name", fmt.Sprintf("%q is declared twice", x.Name)}
			case DatatypeSize[x.Datatype] == 0:
				return &FieldError{f + ".datatype", fmt.Sprintf("%q: want one of BOOL, UINT8..UINT64, INT8..INT64, FP16, FP32, FP64", x.Datatype)}
			case len(x.Shape) == 0 || len(x.Shape) > 8:
				return &FieldError{f + ".shape", "must have 1 to 8 dimensions"}
			}
			seen[x.Name] = true
			vars := 0
			for _, d := range x.Shape {
				if d == -1 {
					vars++
				} else if d < 1 {
					return &FieldError{f + ".shape", fmt.Sprintf("dimension %d: want a positive size or -1 (variable)", d)}
				}
			}
			if vars > 1 {
				return &FieldError{f + ".shape", "at most one dimension may be -1"}
			}
			// Bounded by the largest buffer, so that no product of a
			// shape's sizes overflows where requests are laid out and
			// responses cut (a wrapped negative length panicked the
			// server's /v2 handler). Not by this function's buffer: an
			// output declared past out_bytes is a response /v2 refuses
			// (bad_output), as one an entry cut short.
			fixed := fixedBytes(x, left)
			if fixed < 0 {
				return &FieldError{f + ".shape", fmt.Sprintf("%v of %s takes more than %d bytes, the most a buffer holds%s", x.Shape, x.Datatype, MaxBufferBytes, tensorsBefore(i))}
			}
			left -= fixed
			variable += vars
		}
		// Only the last output may vary: outputs are cut from out in order.
		if side.field == "tensors.outputs" {
			for i, x := range side.ts[:len(side.ts)-1] {
				for _, d := range x.Shape {
					if d == -1 {
						return &FieldError{fmt.Sprintf("tensors.outputs[%d].shape", i), "only the last output may have a variable dimension (outputs are cut from out in order)"}
					}
				}
			}
		}
	}
	return nil
}

// fixedBytes is the bytes of t's fixed dimensions (one element of a
// variable one), or -1 when they are more than room; computed so that
// nothing overflows whatever the shape holds.
func fixedBytes(t Tensor, room int64) int64 {
	n := DatatypeSize[t.Datatype]
	for _, d := range t.Shape {
		if d == -1 {
			continue
		}
		if d > room/n {
			return -1
		}
		n *= d
	}
	if n > room {
		return -1
	}
	return n
}

// tensorsBefore says, for a tensor at index i, that the room was what the
// tensors declared before it left.
func tensorsBefore(i int) string {
	if i == 0 {
		return ""
	}
	return " with the tensors declared before it"
}

// Elements is the number of elements a shape holds.
func Elements(shape []int64) int64 {
	n := int64(1)
	for _, d := range shape {
		n *= d
	}
	return n
}
