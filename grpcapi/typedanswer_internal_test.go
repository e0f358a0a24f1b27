package grpcapi

import (
	"bytes"
	"encoding/binary"
	"math"
	"reflect"
	"runtime"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/call"
	pb "github.com/plover-run/plover/grpcapi/inferencepb"
)

// le packs vs little-endian, each in size bytes.
func le(size int, vs ...uint64) []byte {
	b := make([]byte, 0, 8*len(vs))
	for _, v := range vs {
		n := len(b)
		b = binary.LittleEndian.AppendUint64(b, v)[:n+size]
	}
	return b
}

// answerOf is what answer makes of out, a function's output declared as
// one tensor of dt and shape [-1] (then "o", and a second, "p", of
// datatype dt2 after it where dt2 is set), to inputs that came typed, on a
// server of message limit limit.
func answerOf(t *testing.T, limit int, dt string, out []byte, dt2 string) *pb.ModelInferResponse {
	t.Helper()
	decl := []abi.Tensor{{Name: "o", Datatype: dt, Shape: []int64{-1}}}
	if dt2 != "" {
		decl = []abi.Tensor{{Name: "p", Datatype: dt2, Shape: []int64{1}}, {Name: "o", Datatype: dt, Shape: []int64{-1}}}
	}
	s := New(nil, Options{MaxMessageBytes: limit})
	resp, err := s.answer(&pb.ModelInferRequest{ModelName: "m", Id: "call-1"}, &call.Request{Output: out, Version: "v1"}, decl, nil, true)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

// Whether an answer goes typed is decided before it is built, from a size
// counted from the output's bytes: that count is what proto.Size finds in
// the typed answer built, for every datatype with a typed field, negative
// integers (10-byte varints) and empty outputs included, so an answer goes
// raw exactly where it did when it was built to be sized (one byte past
// the message limit), and its contents are the output's elements.
func TestATypedAnswerIsSizedBeforeItIsBuilt(t *testing.T) {
	neg := func(v int64) uint64 { return uint64(v) }
	f32, f64 := math.Float32bits, math.Float64bits
	for _, tc := range []struct {
		dt, dt2 string // dt2: a one-element output before it
		out     []byte
		want    func(*pb.InferTensorContents) any // the last output's elements
		elems   any
	}{
		{"BOOL", "", []byte{0, 1, 7, 0}, func(c *pb.InferTensorContents) any { return c.GetBoolContents() }, []bool{false, true, true, false}},
		{"INT8", "", le(1, 0, 127, neg(-1), neg(-128)), func(c *pb.InferTensorContents) any { return c.GetIntContents() }, []int32{0, 127, -1, -128}},
		{"INT16", "", le(2, 300, neg(-3), 32767), func(c *pb.InferTensorContents) any { return c.GetIntContents() }, []int32{300, -3, 32767}},
		{"INT32", "", le(4, neg(math.MinInt32), 1<<28, 5), func(c *pb.InferTensorContents) any { return c.GetIntContents() }, []int32{math.MinInt32, 1 << 28, 5}},
		{"INT64", "", le(8, neg(-1), 1<<62), func(c *pb.InferTensorContents) any { return c.GetInt64Contents() }, []int64{-1, 1 << 62}},
		{"UINT8", "", []byte{0, 128, 255}, func(c *pb.InferTensorContents) any { return c.GetUintContents() }, []uint32{0, 128, 255}},
		{"UINT16", "", le(2, 65535, 1), func(c *pb.InferTensorContents) any { return c.GetUintContents() }, []uint32{65535, 1}},
		{"UINT32", "", le(4, math.MaxUint32, 200), func(c *pb.InferTensorContents) any { return c.GetUintContents() }, []uint32{math.MaxUint32, 200}},
		{"UINT64", "", le(8, math.MaxUint64, 0), func(c *pb.InferTensorContents) any { return c.GetUint64Contents() }, []uint64{math.MaxUint64, 0}},
		{"FP32", "", le(4, uint64(f32(1.5)), uint64(f32(-4))), func(c *pb.InferTensorContents) any { return c.GetFp32Contents() }, []float32{1.5, -4}},
		{"FP64", "", le(8, f64(-0.25)), func(c *pb.InferTensorContents) any { return c.GetFp64Contents() }, []float64{-0.25}},
		{"INT8", "", nil, func(c *pb.InferTensorContents) any { return c.GetIntContents() }, []int32{}},
		{"INT16", "UINT64", append(le(8, math.MaxUint64), le(2, neg(-2))...), func(c *pb.InferTensorContents) any { return c.GetIntContents() }, []int32{-2}},
		// 200 negative elements: 2,000 bytes of packed field, whose
		// length prefix and the output's take two bytes each.
		{"INT8", "FP32", append(le(4, 0), bytes.Repeat([]byte{0xff}, 200)...), func(c *pb.InferTensorContents) any { return c.GetIntContents() }, func() []int32 {
			v := make([]int32, 200)
			for i := range v {
				v[i] = -1
			}
			return v
		}()},
	} {
		t.Run(tc.dt+"_after_"+tc.dt2, func(t *testing.T) {
			resp := answerOf(t, 1<<20, tc.dt, tc.out, tc.dt2)
			if resp.RawOutputContents != nil {
				t.Fatalf("answered raw: %v", resp)
			}
			last := resp.Outputs[len(resp.Outputs)-1]
			if got := tc.want(last.GetContents()); !sameElems(got, tc.elems) {
				t.Errorf("contents %v, want %v", got, tc.elems)
			}
			n := proto.Size(resp)
			if got := answerOf(t, n, tc.dt, tc.out, tc.dt2); got.RawOutputContents != nil {
				t.Errorf("an answer of %d bytes went raw at a limit of %d", n, n)
			}
			if got := answerOf(t, n-1, tc.dt, tc.out, tc.dt2); got.RawOutputContents == nil || got.Outputs[len(got.Outputs)-1].Contents != nil {
				t.Errorf("an answer of %d bytes went typed at a limit of %d", n, n-1)
			}
		})
	}
	// FP16 has no typed field: its answer is raw, at any size.
	if got := answerOf(t, 1<<20, "FP16", append([]byte{5}, le(2, 1)...), "INT8"); len(got.RawOutputContents) != 2 {
		t.Errorf("an FP16 output answered %v", got)
	}
}

// sameElems is whether a and b, slices, hold the same elements (an empty
// one made or nil alike: the wire does not tell them apart).
func sameElems(a, b any) bool {
	va, vb := reflect.ValueOf(a), reflect.ValueOf(b)
	if va.Len() == 0 && vb.Len() == 0 {
		return va.Type() == vb.Type()
	}
	return reflect.DeepEqual(a, b)
}

// A typed answer takes memory in proportion to its output, bounded by
// maxTypedAnswer: its slices are made at their length, and an output whose
// typed message would pass the bound goes raw before any slice is made. A
// request of a few bytes (typed inputs, shape [0]) to a model with a 32 MiB
// INT8 output took 22 times that to answer (1433 MiB for 64 MiB): the
// output widened into int32s appended one at a time, then sized, then
// answered raw.
func TestATypedAnswerIsBoundedInMemory(t *testing.T) {
	const mib = 1 << 20
	for _, tc := range []struct {
		name  string
		dt    string
		out   []byte
		typed bool
		most  float64 // the bytes answer may allocate, in output bytes
	}{
		{"INT8 zeroes past the bound go raw", "INT8", make([]byte, 32*mib), false, 0.01},
		{"INT8 negatives past the bound go raw", "INT8", bytes.Repeat([]byte{0xff}, 4*mib), false, 0.01},
		{"INT8 zeroes within it are int32s", "INT8", make([]byte, 8*mib), true, 4.1},
		{"FP32 within it", "FP32", make([]byte, 8*mib), true, 1.1},
		{"INT64 negatives past it go raw", "INT64", bytes.Repeat([]byte{0xff}, 16*mib), false, 0.01},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := New(nil, Options{}) // the default message limit, 256 MiB
			decl := []abi.Tensor{{Name: "o", Datatype: tc.dt, Shape: []int64{-1}}}
			req, r := &pb.ModelInferRequest{ModelName: "m"}, &call.Request{Output: tc.out}
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			resp, err := s.answer(req, r, decl, nil, true)
			runtime.ReadMemStats(&after)
			if err != nil {
				t.Fatal(err)
			}
			if got, most := after.TotalAlloc-before.TotalAlloc, uint64(tc.most*float64(len(tc.out))); got > most {
				t.Errorf("answering a %d-byte %s output allocated %d bytes (%.1f times it), want at most %d",
					len(tc.out), tc.dt, got, float64(got)/float64(len(tc.out)), most)
			}
			if typed := resp.RawOutputContents == nil; typed != tc.typed {
				t.Fatalf("typed %v, want %v", typed, tc.typed)
			}
			if !tc.typed && &resp.RawOutputContents[0][0] != &tc.out[0] {
				t.Errorf("a raw answer copied its output")
			}
		})
	}
}
