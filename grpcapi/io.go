package grpcapi

import (
	"context"
	"runtime"
	"slices"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"

	"github.com/plover-run/plover/call"
	pb "github.com/plover-run/plover/grpcapi/inferencepb"
	"github.com/plover-run/plover/ioshare"
)

// A ModelInfer call's bytes are its function's share of the server's I/O
// (package ioshare), as an HTTP request's are: the call touches its
// function's flow, and the server's time on its bytes is charged to it,
// by wall time as HTTP's decoding and encoding are (Flow.MeteredSince):
// decoding its message (the codec's, before any interceptor: measured
// there on the same clock and charged once the call is admitted and its
// model found, so that a call its token may not make charges no one),
// laying its tensors out, cutting its answer and encoding it (the codec's
// again, after the handler). The message itself moves in the turns of its
// connection's function, once a large call put the connection in them
// (conns.go).

// bigMessage is the smallest message that puts its connection in its
// function's turns (HTTP's bigAnswer).
const bigMessage = 64 << 10

// inferCall is a ModelInfer call as the codec decodes and encodes it: its
// request, what the server spent on it before its flow was known, and its
// answer, encoded in its flow's name.
type inferCall struct {
	req  pb.ModelInferRequest // first: the refusals' weak key is its address, the call's
	io   inferIO
	resp *pb.ModelInferResponse
	// wire is the message the request's raw inputs lie in (the codec's
	// decodeInfer or splitPieces, which copy them no more): the handler
	// frees it once they are laid out and run.
	wire mem.BufferSlice
	// unencoded gives the call's slot back should gRPC-Go drop it before
	// its answer is encoded (inferHandler); the codec stops it.
	unencoded runtime.Cleanup
}

// inferIO is a call's share of the server's I/O: the time its message's
// decoding took, and its function's flow once the handler found it; and
// the slot its inputs were laid out in, where its function's device reads
// them and writes its output (lend: the call may be lent one, its answer
// encoded by the codec, which gives it back).
type inferIO struct {
	decode time.Duration
	fl     *ioshare.Flow
	lend   bool
	land   *lent
	// size is the message's length on the wire (0: not known, the
	// request's proto size), and pieces its raw inputs where the codec
	// left them in its buffers (splitPieces; the request then holds each
	// empty).
	size   int
	pieces [][][]byte
}

// raw is req's raw inputs: in the pieces the codec left them in, or as
// proto decoded them.
func (io *inferIO) raw(req *pb.ModelInferRequest) rawInputs {
	return rawInputs{whole: req.GetRawInputContents(), pieces: io.pieces}
}

// lent is a slot lent to a call (Runner.Land), given back once: by the
// codec once the answer cut from it is encoded, by the handler where the
// call failed, or, where a run panicked and the worker may still write
// into it, discarded.
type lent struct {
	call.Landing
	done atomic.Bool
}

func (l *lent) release() {
	if l != nil && l.done.CompareAndSwap(false, true) {
		l.Release()
	}
}

func (l *lent) discard() {
	if l != nil && l.done.CompareAndSwap(false, true) {
		l.Discard()
	}
}

// service is the generated service with ModelInfer's handler inferHandler:
// the generated one decodes into a bare request, with nowhere to keep its
// decoding's time, and answers a bare response, with no flow to charge
// its encoding to.
func (s *Server) service() *grpc.ServiceDesc {
	d := pb.GRPCInferenceService_ServiceDesc
	d.Methods = slices.Clone(d.Methods)
	for i := range d.Methods {
		if d.Methods[i].MethodName == "ModelInfer" {
			d.Methods[i].Handler = inferHandler
		}
	}
	return &d
}

// inferHandler is the generated ModelInfer handler over an inferCall: its
// answer goes back to gRPC-Go as the call, for the codec to encode in its
// flow's name.
func inferHandler(srv any, ctx context.Context, dec func(any) error, interceptor grpc.UnaryServerInterceptor) (any, error) {
	s := srv.(*Server)
	c := &inferCall{io: inferIO{lend: true}}
	defer c.inputsDone()
	if err := dec(c); err != nil {
		return nil, err
	}
	h := func(ctx context.Context, req any) (any, error) {
		return s.modelInfer(ctx, req.(*pb.ModelInferRequest), &c.io)
	}
	var resp any
	var err error
	if interceptor == nil {
		resp, err = h(ctx, &c.req)
	} else {
		resp, err = interceptor(ctx, &c.req, &s.inferInfo, h)
	}
	if r, ok := resp.(*pb.ModelInferResponse); ok && err == nil && (c.io.fl != nil || c.io.land != nil) {
		// gRPC-Go keeps the reply until it is written: the request, whose
		// tensors may be as large as the answer's, need not stay with it.
		proto.Reset(&c.req)
		c.resp = r
		if c.io.land != nil {
			// The codec gives the slot back once it encoded the answer;
			// should gRPC-Go ever drop a reply unencoded, the call's
			// collection does.
			c.unencoded = runtime.AddCleanup(c, (*lent).release, c.io.land)
		}
		return c, nil
	}
	c.io.land.release()
	return resp, err
}

// inputsDone frees the message the request's raw inputs lay in: the run
// has them (in its slot, or copied) or failed.
func (c *inferCall) inputsDone() {
	c.req.RawInputContents, c.io.pieces = nil, nil
	c.wire.Free()
	c.wire = nil
}

// unmarshalCall decodes a ModelInfer call's message, measuring it: its
// raw inputs are left where they lie in the message, which the call keeps
// until its handler is done: in its buffers where it came in several
// (splitPieces), else in its one (decodeInfer). A second message, which
// gRPC decodes to refuse the call, is copied.
func (c codec) unmarshalCall(data mem.BufferSlice, call *inferCall) error {
	w := ioshare.Now()
	defer func() { call.io.decode = w.Elapsed() }()
	first := call.wire == nil
	call.io.size = data.Len()
	if first && len(data) > 1 {
		if head, raw, ok := splitPieces(data); ok {
			if c.decodeInfer(head, &call.req, false) && raw != nil {
				data.Ref()
				call.wire, call.io.pieces = data, raw
			}
			return nil
		}
	}
	buf := data.MaterializeToBuffer(mem.DefaultBufferPool())
	if c.decodeInfer(buf.ReadOnlyData(), &call.req, first) && first && call.req.RawInputContents != nil {
		call.wire = mem.BufferSlice{buf}
	} else {
		buf.Free()
	}
	return nil
}

// marshalCall encodes a ModelInfer call's answer, metered as its flow's,
// and gives back the slot its raw outputs were cut from. Encoding copies
// them: were the message written from the slot, a client that reads it
// slowly or not at all would hold the slot, and its function's version,
// for as long as it kept its connection (gRPC-Go has no write timeout;
// a stalled stream is not even a stalled socket).
func (c codec) marshalCall(call *inferCall) (mem.BufferSlice, error) {
	defer call.io.land.release()
	call.unencoded.Stop()
	t := ioshare.Now()
	b, err := c.base.Marshal(call.resp)
	call.io.fl.MeteredSince(t)
	return b, err
}

// wireMessage is the message v is on the wire: an inferCall's request or
// answer.
func wireMessage(v any) any {
	if c, ok := v.(*inferCall); ok {
		if c.resp != nil {
			return c.resp
		}
		return &c.req
	}
	return v
}
