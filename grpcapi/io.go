package grpcapi

import (
	"context"
	"slices"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"

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
}

// inferIO is a call's share of the server's I/O: the time its message's
// decoding took, and its function's flow once the handler found it.
type inferIO struct {
	decode time.Duration
	fl     *ioshare.Flow
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
	c := new(inferCall)
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
	if r, ok := resp.(*pb.ModelInferResponse); ok && err == nil && c.io.fl != nil {
		// gRPC-Go keeps the reply until it is written: the request, whose
		// tensors may be as large as the answer's, need not stay with it.
		proto.Reset(&c.req)
		c.resp = r
		return c, nil
	}
	return resp, err
}

// unmarshalCall decodes a ModelInfer call's message, measuring it.
func (c codec) unmarshalCall(data mem.BufferSlice, call *inferCall) error {
	w := ioshare.Now()
	err := c.unmarshalInfer(data, &call.req)
	call.io.decode = w.Elapsed()
	return err
}

// marshalCall encodes a ModelInfer call's answer, metered as its flow's.
func (c codec) marshalCall(call *inferCall) (mem.BufferSlice, error) {
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
