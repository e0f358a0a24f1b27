package bench

import (
	"strings"
	"testing"

	pb "github.com/plover-run/plover/grpcapi/inferencepb"
)

// The bench's input is split into the model's inputs as the engine reads
// its input buffer; what does not fit is refused with the reason.
func TestSplitInput(t *testing.T) {
	meta := func(ts ...[3]any) []*pb.ModelMetadataResponse_TensorMetadata {
		var out []*pb.ModelMetadataResponse_TensorMetadata
		for _, x := range ts {
			out = append(out, &pb.ModelMetadataResponse_TensorMetadata{Name: x[0].(string), Datatype: x[1].(string), Shape: x[2].([]int64)})
		}
		return out
	}
	for _, tc := range []struct {
		name   string
		in     int
		decl   []*pb.ModelMetadataResponse_TensorMetadata
		shapes [][]int64
		err    string
	}{
		{"raw bytes", 5, meta([3]any{"INPUT0", "UINT8", []int64{-1}}), [][]int64{{5}}, ""},
		{"fixed then variable", 16 + 6, meta([3]any{"x", "FP32", []int64{2, 2}}, [3]any{"y", "INT16", []int64{-1}}), [][]int64{{2, 2}, {3}}, ""},
		{"too short", 8, meta([3]any{"x", "FP32", []int64{2, 2}}), nil, `input "x" needs 16 bytes, 8 are left`},
		{"left over", 20, meta([3]any{"x", "FP32", []int64{2, 2}}), nil, "4 bytes of the input after"},
		{"no whole elements", 7, meta([3]any{"y", "INT16", []int64{-1}}), nil, "do not make whole elements"},
		{"BYTES", 4, meta([3]any{"s", "BYTES", []int64{-1}}), nil, "cannot be sent raw"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req, err := splitInput("m", make([]byte, tc.in), tc.decl)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil || len(req.Inputs) != len(tc.shapes) {
				t.Fatalf("%v %v", req, err)
			}
			total := 0
			for i, s := range tc.shapes {
				if got := req.Inputs[i].Shape; len(got) != len(s) || got[len(got)-1] != s[len(s)-1] {
					t.Errorf("input %d shape %v, want %v", i, got, s)
				}
				total += len(req.RawInputContents[i])
			}
			if total != tc.in {
				t.Errorf("%d bytes sent of %d", total, tc.in)
			}
		})
	}
}
