package grpcapi

import (
	"bytes"
	"testing"

	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"

	pb "github.com/plover-run/plover/grpcapi/inferencepb"
	"github.com/plover-run/plover/ioshare"
)

// The codec measures a ModelInfer call's decoding, for its flow once the
// call finds it, and charges its answer's encoding to the flow the call
// found: the server's time on the call's bytes beside the handler's.
func TestCodecMetersInferCalls(t *testing.T) {
	c := newCodec(New(nil, Options{}))
	big := bytes.Repeat([]byte{7}, 4<<20)
	wire, err := proto.Marshal(&pb.ModelInferRequest{ModelName: "f",
		Inputs:           []*pb.ModelInferRequest_InferInputTensor{{Name: "INPUT0", Datatype: "UINT8", Shape: []int64{int64(len(big))}}},
		RawInputContents: [][]byte{big}})
	if err != nil {
		t.Fatal(err)
	}
	call := new(inferCall)
	if err := c.Unmarshal(mem.BufferSlice{mem.SliceBuffer(wire)}, call); err != nil {
		t.Fatal(err)
	}
	if call.req.GetModelName() != "f" || !bytes.Equal(call.req.GetRawInputContents()[0], big) {
		t.Fatalf("decoded %q with %d inputs", call.req.GetModelName(), len(call.req.GetRawInputContents()))
	}
	if call.io.decode <= 0 {
		t.Fatalf("decoding a %d-byte message measured %v", len(wire), call.io.decode)
	}

	fl := ioshare.New(ioshare.Config{}).Flow("f")
	call.io.fl = fl
	call.resp = &pb.ModelInferResponse{ModelName: "f", RawOutputContents: [][]byte{big}}
	out, err := c.Marshal(call)
	if err != nil {
		t.Fatal(err)
	}
	want, _ := proto.Marshal(call.resp)
	if !bytes.Equal(out.Materialize(), want) {
		t.Fatal("a call's encoding is not its answer's")
	}
	if fl.Seconds() <= 0 {
		t.Fatalf("encoding a %d-byte answer charged its flow %v s", len(want), fl.Seconds())
	}
}

// A small ModelInfer's decoding and encoding by the codec: bare (as the
// generated handler had it) and as a call, measured and charged to its
// flow; the difference is what the accounting costs a hot small call in
// the codec.
func BenchmarkCodecSmallInfer(b *testing.B) {
	c := newCodec(New(nil, Options{}))
	wire, _ := proto.Marshal(&pb.ModelInferRequest{ModelName: "bench",
		Inputs:           []*pb.ModelInferRequest_InferInputTensor{{Name: "INPUT0", Datatype: "UINT8", Shape: []int64{64}}},
		RawInputContents: [][]byte{make([]byte, 64)}})
	resp := &pb.ModelInferResponse{ModelName: "bench", RawOutputContents: [][]byte{make([]byte, 256)},
		Outputs: []*pb.ModelInferResponse_InferOutputTensor{{Name: "OUTPUT0", Datatype: "UINT8", Shape: []int64{256}}}}
	fl := ioshare.New(ioshare.Config{}).Flow("bench")
	data := mem.BufferSlice{mem.SliceBuffer(wire)}
	b.Run("bare", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			req := new(pb.ModelInferRequest)
			if err := c.Unmarshal(data, req); err != nil {
				b.Fatal(err)
			}
			out, err := c.Marshal(resp)
			if err != nil {
				b.Fatal(err)
			}
			out.Free()
		}
	})
	b.Run("call", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			call := new(inferCall)
			if err := c.Unmarshal(data, call); err != nil {
				b.Fatal(err)
			}
			call.io.fl, call.resp = fl, resp
			fl.Metered(call.io.decode)
			out, err := c.Marshal(call)
			if err != nil {
				b.Fatal(err)
			}
			out.Free()
		}
	})
}
