package grpcapi

import (
	"context"
	"fmt"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/tap"

	"github.com/plover-run/plover/apierr"
	"github.com/plover-run/plover/errdefs"
	"github.com/plover-run/plover/frontdoor"
	"github.com/plover-run/plover/grpcapi/inferencepb"
)

// gRPC-Go recovers no panic, in a handler, an interceptor, the codec or
// the tap: one bug met by one call ended the process, every tenant's
// requests with it. What the server runs of a call is wrapped here so
// that a panic ends that call alone, answered Internal with a message
// that tells nothing of it (frontdoor.PanicMessage), and is logged and
// counted (frontdoor.Door.Panicked).

// recoverUnary is the outermost unary interceptor: around the gate (admit)
// and the method.
func (s *Server) recoverUnary(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (resp any, err error) {
	defer func() {
		if v := recover(); v != nil {
			if info.FullMethod == inferencepb.GRPCInferenceService_ModelInfer_FullMethodName {
				s.door.PanickedInvoke("grpc", info.FullMethod, modelOf(req), v)
			} else {
				s.door.Panicked("grpc", info.FullMethod, modelOf(req), v)
			}
			resp, err = nil, panicked()
		}
	}()
	return h(ctx, req)
}

// recoverStream is the outermost stream interceptor (the service has no
// streaming method today: one added is covered). A stream that had sent
// messages ends with the status all the same, in its trailers.
func (s *Server) recoverStream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) (err error) {
	defer func() {
		if v := recover(); v != nil {
			s.door.Panicked("grpc", info.FullMethod, "", v)
			err = panicked()
		}
	}()
	return h(srv, ss)
}

// recoverTap is s.tap, which runs on a call's headers in the connection's
// own goroutine, before any interceptor.
func (s *Server) recoverTap(ctx context.Context, info *tap.Info) (c context.Context, err error) {
	defer func() {
		if v := recover(); v != nil {
			s.door.Panicked("grpc", info.FullMethodName, "", v)
			c, err = ctx, panicked()
		}
	}()
	return s.tap(ctx, info)
}

// recoveringCodec is the server's codec, which gRPC-Go runs outside the
// interceptors: decoding a request before them, encoding an answer after.
// Its error is answered Internal, with what it says.
type recoveringCodec struct {
	encoding.CodecV2
	door *frontdoor.Door
}

func (c recoveringCodec) Marshal(v any) (_ mem.BufferSlice, err error) {
	defer c.recovered("encoding", v, &err)
	return c.CodecV2.Marshal(v)
}

func (c recoveringCodec) Unmarshal(data mem.BufferSlice, v any) (err error) {
	defer c.recovered("decoding", v, &err)
	return c.CodecV2.Unmarshal(data, v)
}

// recovered, deferred, turns a panic in the codec into its error.
func (c recoveringCodec) recovered(what string, v any, err *error) {
	if p := recover(); p != nil {
		c.door.Panicked("grpc", fmt.Sprintf("codec: %s %T", what, wireMessage(v)), "", p)
		*err = panicked()
	}
}

// panicked is the status of a call whose handling panicked.
func panicked() error {
	return status.Error(apierr.Of(errdefs.KindInternal).GRPC, frontdoor.PanicMessage)
}

// modelOf is the model a request names, a copy (the log keeps it), or "".
func modelOf(req any) string {
	switch r := req.(type) {
	case interface{ GetModelName() string }: // ModelInfer
		return strings.Clone(r.GetModelName())
	case interface{ GetName() string }: // ModelReady, ModelMetadata
		return strings.Clone(r.GetName())
	}
	return ""
}
