package pipeline

// A pipeline's tensors: its first step's inputs, its last step's outputs,
// and where a parallel last step's output is cut per branch.

import (
	"slices"

	"github.com/plover-run/plover/abi"
)

// lastOutputs is the outputs stages end with, as the pipeline declares
// them: false when they are raw bytes (a function that declares none,
// names that clash, or a variable output that is not the last, which
// could not be cut from the concatenation).
func lastOutputs(stages []stage) ([]abi.Tensor, bool) {
	outs, ok := declaredOutputs(stages)
	if !ok || len(outs) == 0 {
		return nil, false
	}
	for _, t := range outs[:len(outs)-1] {
		if tensorBytes(t) < 0 {
			return nil, false
		}
	}
	return outs, true
}

// tensorBytes is the bytes t takes, or -1 for a variable shape.
func tensorBytes(t abi.Tensor) int64 {
	if slices.Contains(t.Shape, -1) {
		return -1
	}
	return abi.Elements(t.Shape) * abi.DatatypeSize[t.Datatype]
}

// markCuts sets the cuts of the parallel stages whose concatenated
// outputs are outs (the last stage of stages, and within each of its
// branches the last stage again), as lastOutputs found them.
func markCuts(stages []stage, outs []abi.Tensor) {
	st := &stages[len(stages)-1]
	if st.par == nil {
		return
	}
	st.cut = make([]int64, len(st.par))
	for j, br := range st.par {
		mine, _ := declaredOutputs(br)
		n := int64(0)
		for _, t := range mine {
			if b := tensorBytes(t); b < 0 || n < 0 {
				n = -1
			} else {
				n += b
			}
		}
		st.cut[j] = n
		markCuts(br, mine)
	}
}

func firstTensors(stages []stage) *abi.Tensors {
	st := stages[0]
	if st.par != nil {
		return firstTensors(st.par[0])
	}
	return st.pin.Version().Tensors
}

// declaredOutputs is the outputs stages' last stage declares, each branch
// of a parallel one in order; false for raw bytes or clashing names.
func declaredOutputs(stages []stage) ([]abi.Tensor, bool) {
	st := stages[len(stages)-1]
	if st.par == nil {
		ts := st.pin.Version().Tensors
		if ts == nil {
			return nil, false
		}
		return ts.Outputs, true
	}
	var out []abi.Tensor
	seen := map[string]bool{}
	for _, br := range st.par {
		outs, ok := declaredOutputs(br)
		if !ok {
			return nil, false
		}
		for _, t := range outs {
			if seen[t.Name] {
				return nil, false
			}
			seen[t.Name] = true
		}
		out = append(out, outs...)
	}
	return out, true
}
