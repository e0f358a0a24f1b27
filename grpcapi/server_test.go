package grpcapi_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"math"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/api"
	"github.com/plover-run/plover/auth"
	"github.com/plover-run/plover/bundle"
	"github.com/plover-run/plover/engine"
	"github.com/plover-run/plover/frontdoor"
	"github.com/plover-run/plover/gate"
	"github.com/plover-run/plover/grpcapi"
	pb "github.com/plover-run/plover/grpcapi/inferencepb"
	"github.com/plover-run/plover/internal/testkit"
	"github.com/plover-run/plover/pipeline"
	"github.com/plover-run/plover/reqmetrics"
)

type fixture struct {
	conn   *grpc.ClientConn
	client pb.GRPCInferenceServiceClient
	e      *engine.Engine
	reg    *prometheus.Registry
	typed  api.FunctionInfo
	raw    *abi.Manifest
	srv    *grpcapi.Server
}

// serve deploys echo (raw bytes), typed (declared tensors) and slow on a
// real engine and serves them over gRPC on a loopback port.
func serve(t *testing.T, tokens gate.Tokens) *fixture { return serveOpts(t, tokens, grpcapi.Options{}) }

// serveOpts is serve with more of the server's options than its gate and
// metrics.
func serveOpts(t *testing.T, tokens gate.Tokens, opts grpcapi.Options) *fixture {
	t.Helper()
	e := testkit.Engine(t, engine.Config{MaxInstances: 1})
	raw := testkit.Manifest("echo") // echo: out = input, zero-padded to out_bytes
	testkit.Deploy(t, e, testkit.BundleDir(t, raw, nil))
	typed := testkit.Typed("typed")
	fi := testkit.Deploy(t, e, testkit.BundleDir(t, typed, nil))
	testkit.Deploy(t, e, testkit.BundleDir(t, testkit.Slow("slow", 2000), nil))
	f := serveEngine(t, e, tokens, opts)
	f.typed, f.raw = fi, raw
	return f
}

// serveEngine serves e over gRPC on a loopback port, behind a front door
// with tokens (nil: none), its listener wrapped by wrap (the first nearest
// the sockets) and then as plover serve wraps it.
func serveEngine(t testing.TB, e *engine.Engine, tokens gate.Tokens, opts grpcapi.Options, wrap ...func(net.Listener) net.Listener) *fixture {
	t.Helper()
	reg := prometheus.NewRegistry()
	run := pipeline.New(e, reg)
	opts.Version = "test"
	door := frontdoor.New(frontdoor.Config{Runner: run, Gate: gate.New(tokens, reg), Metrics: reqmetrics.New(reg)})
	srv := grpcapi.New(door, opts)
	conn := dial(t, srv.GRPC(), append(wrap, srv.Listener)...) // as plover serve does: its connections may move in turns
	return &fixture{conn: conn, client: pb.NewGRPCInferenceServiceClient(conn), e: e, reg: reg, srv: srv}
}

// dial serves gs on a loopback port, its listener wrapped by wrap (the
// first nearest the sockets), and returns a client connection to it; both
// end with the test.
func dial(t testing.TB, gs *grpc.Server, wrap ...func(net.Listener) net.Listener) *grpc.ClientConn {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range wrap {
		ln = w(ln)
	}
	go gs.Serve(ln)
	t.Cleanup(gs.Stop)
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func fp32(fs ...float32) []byte {
	var b []byte
	for _, f := range fs {
		b = binary.LittleEndian.AppendUint32(b, math.Float32bits(f))
	}
	return b
}

// The protocol's methods against a served engine: health, metadata, and
// inference with raw and typed contents, output selection and the id.
func TestService(t *testing.T) {
	f := serve(t, nil)
	c, ctx := f.client, ctxT(t)
	if r, err := c.ServerLive(ctx, &pb.ServerLiveRequest{}); err != nil || !r.Live {
		t.Fatalf("ServerLive: %v %v", r, err)
	}
	if r, err := c.ServerReady(ctx, &pb.ServerReadyRequest{}); err != nil || !r.Ready {
		t.Fatalf("ServerReady: %v %v", r, err)
	}
	if r, err := c.ServerMetadata(ctx, &pb.ServerMetadataRequest{}); err != nil || r.Name != "plover" || r.Version != "test" {
		t.Fatalf("ServerMetadata: %v %v", r, err)
	}
	if r, err := c.ModelReady(ctx, &pb.ModelReadyRequest{Name: "typed", Version: f.typed.Version[:8]}); err != nil || !r.Ready {
		t.Fatalf("ModelReady: %v %v", r, err)
	}
	m, err := c.ModelMetadata(ctx, &pb.ModelMetadataRequest{Name: "typed"})
	if err != nil || m.Platform != "plover" || len(m.Versions) != 1 || m.Versions[0] != f.typed.Version ||
		len(m.Inputs) != 2 || m.Inputs[0].Name != "x" || m.Inputs[0].Datatype != "FP32" || len(m.Outputs) != 2 || m.Outputs[1].Shape[0] != -1 {
		t.Fatalf("ModelMetadata: %v %v", m, err)
	}
	if m, err := c.ModelMetadata(ctx, &pb.ModelMetadataRequest{Name: "echo"}); err != nil || m.Inputs[0].Name != "INPUT0" || m.Inputs[0].Datatype != "UINT8" {
		t.Fatalf("raw ModelMetadata: %v %v", m, err)
	}

	t.Run("raw bytes", func(t *testing.T) {
		var hdr metadata.MD
		r, err := c.ModelInfer(ctx, &pb.ModelInferRequest{ModelName: "echo", Id: "r1",
			Inputs:           []*pb.ModelInferRequest_InferInputTensor{{Name: "INPUT0", Datatype: "UINT8", Shape: []int64{3}}},
			RawInputContents: [][]byte{{7, 8, 9}}}, grpc.Header(&hdr))
		if err != nil {
			t.Fatal(err)
		}
		want := make([]byte, f.raw.OutBytes)
		copy(want, []byte{7, 8, 9})
		if r.Id != "r1" || r.ModelName != "echo" || r.ModelVersion == "" || len(r.Outputs) != 1 || r.Outputs[0].Name != "OUTPUT0" ||
			r.Outputs[0].Shape[0] != f.raw.OutBytes || len(r.RawOutputContents) != 1 || !bytes.Equal(r.RawOutputContents[0], want) || r.Outputs[0].Contents != nil {
			t.Fatalf("%v", r)
		}
		if s := hdr.Get("x-plover-start"); len(s) != 1 || (s[0] != "hot" && s[0] != "cold" && s[0] != "warm") {
			t.Errorf("x-plover-start: %v", hdr)
		}
		if s := hdr.Get("server-timing"); len(s) != 1 || !strings.HasPrefix(s[0], "queue;dur=") || !strings.Contains(s[0], "total;dur=") {
			t.Errorf("server-timing: %v", hdr)
		}
	})

	t.Run("raw, declared tensors in another order", func(t *testing.T) {
		x, y := fp32(1, 2, 3, 4), []byte{5, 0, 6, 0}
		r, err := c.ModelInfer(ctx, &pb.ModelInferRequest{ModelName: "typed", ModelVersion: f.typed.Version,
			Inputs: []*pb.ModelInferRequest_InferInputTensor{
				{Name: "y", Datatype: "INT16", Shape: []int64{2}},
				{Name: "x", Datatype: "FP32", Shape: []int64{2, 2}}},
			RawInputContents: [][]byte{y, x}})
		if err != nil {
			t.Fatal(err)
		}
		if len(r.RawOutputContents) != 2 || !bytes.Equal(r.RawOutputContents[0], x) || !bytes.Equal(r.RawOutputContents[1][:4], y) ||
			len(r.RawOutputContents[1]) != 16 || r.Outputs[1].Shape[0] != 8 {
			t.Fatalf("%v", r)
		}
	})

	t.Run("typed contents both ways", func(t *testing.T) {
		r, err := c.ModelInfer(ctx, &pb.ModelInferRequest{ModelName: "typed",
			Inputs: []*pb.ModelInferRequest_InferInputTensor{
				{Name: "x", Datatype: "FP32", Shape: []int64{2, 2}, Contents: &pb.InferTensorContents{Fp32Contents: []float32{1.5, 2, 3, -4}}},
				{Name: "y", Datatype: "INT16", Shape: []int64{2}, Contents: &pb.InferTensorContents{IntContents: []int32{-3, 300}}}}})
		if err != nil {
			t.Fatal(err)
		}
		if len(r.RawOutputContents) != 0 || len(r.Outputs) != 2 {
			t.Fatalf("%v", r)
		}
		z, rest := r.Outputs[0].Contents, r.Outputs[1].Contents
		if got := z.GetFp32Contents(); len(got) != 4 || got[0] != 1.5 || got[3] != -4 {
			t.Errorf("z = %v", z)
		}
		if got := rest.GetIntContents(); len(got) != 8 || got[0] != -3 || got[1] != 300 || got[2] != 0 {
			t.Errorf("rest = %v", rest)
		}
	})

	t.Run("outputs asked for", func(t *testing.T) {
		r, err := c.ModelInfer(ctx, &pb.ModelInferRequest{ModelName: "typed",
			Inputs: []*pb.ModelInferRequest_InferInputTensor{
				{Name: "x", Datatype: "FP32", Shape: []int64{2, 2}}, {Name: "y", Datatype: "INT16", Shape: []int64{0}}},
			Outputs:          []*pb.ModelInferRequest_InferRequestedOutputTensor{{Name: "rest"}},
			RawInputContents: [][]byte{fp32(1, 2, 3, 4), {}}})
		if err != nil {
			t.Fatal(err)
		}
		if len(r.Outputs) != 1 || r.Outputs[0].Name != "rest" || len(r.RawOutputContents) != 1 || len(r.RawOutputContents[0]) != 16 {
			t.Fatalf("%v", r)
		}
	})

	// Every gRPC inference is counted with the HTTP ones, under its
	// class's HTTP status.
	if n := testutil.ToFloat64(counter(t, f.reg, "echo", "200")); n != 1 {
		t.Errorf("plover_requests_total{echo,200} = %v, want 1", n)
	}
}

func counter(t *testing.T, reg *prometheus.Registry, fn, code string) prometheus.Collector {
	t.Helper()
	v := counterValue(t, reg, "plover_requests_total", map[string]string{"function": fn, "code": code})
	return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "x"}, func() float64 { return v })
}

// counterValue is the counter name{labels} as reg gathers it (0 when it
// has no such series).
func counterValue(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	series:
		for _, m := range mf.GetMetric() {
			n := 0
			for _, l := range m.GetLabel() {
				if want, ok := labels[l.GetName()]; ok {
					if l.GetValue() != want {
						continue series
					}
					n++
				}
			}
			if n == len(labels) {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}

// Refusals: each with its code and a message naming the field.
func TestErrors(t *testing.T) {
	f := serve(t, nil)
	x := &pb.ModelInferRequest_InferInputTensor{Name: "x", Datatype: "FP32", Shape: []int64{2, 2}}
	y := &pb.ModelInferRequest_InferInputTensor{Name: "y", Datatype: "INT16", Shape: []int64{1}}
	for _, tc := range []struct {
		name string
		req  *pb.ModelInferRequest
		code codes.Code
		msg  string
	}{
		{"unknown model", &pb.ModelInferRequest{ModelName: "nope"}, codes.NotFound, "nope"},
		{"no model name", &pb.ModelInferRequest{}, codes.InvalidArgument, "model name"},
		{"an unknown version", &pb.ModelInferRequest{ModelName: "typed", ModelVersion: "00000000"}, codes.NotFound, "has no version"},
		{"missing input", &pb.ModelInferRequest{ModelName: "typed", Inputs: []*pb.ModelInferRequest_InferInputTensor{x}, RawInputContents: [][]byte{fp32(1, 2, 3, 4)}},
			codes.InvalidArgument, `input "y" is missing`},
		{"misnamed input", &pb.ModelInferRequest{ModelName: "typed", Inputs: []*pb.ModelInferRequest_InferInputTensor{x,
			{Name: "Y", Datatype: "INT16", Shape: []int64{1}}}, RawInputContents: [][]byte{fp32(1, 2, 3, 4), {0, 0}}},
			codes.InvalidArgument, `input "Y" is not one of the model's inputs (x, y), and "y" is missing`},
		{"extra input", &pb.ModelInferRequest{ModelName: "echo", Inputs: []*pb.ModelInferRequest_InferInputTensor{
			{Name: "INPUT0", Datatype: "UINT8", Shape: []int64{1}}, {Name: "other", Datatype: "UINT8", Shape: []int64{1}}}, RawInputContents: [][]byte{{1}, {2}}},
			codes.InvalidArgument, `input "other" is not one of the model's inputs`},
		{"datatype", &pb.ModelInferRequest{ModelName: "echo", Inputs: []*pb.ModelInferRequest_InferInputTensor{{Name: "INPUT0", Datatype: "FP32", Shape: []int64{1}}},
			RawInputContents: [][]byte{fp32(1)}}, codes.InvalidArgument, "datatype FP32, the model takes UINT8"},
		{"raw size", &pb.ModelInferRequest{ModelName: "typed", Inputs: []*pb.ModelInferRequest_InferInputTensor{x, y}, RawInputContents: [][]byte{fp32(1, 2, 3), {0, 0}}},
			codes.InvalidArgument, "raw_input_contents[0] has 12 bytes"},
		{"raw count", &pb.ModelInferRequest{ModelName: "typed", Inputs: []*pb.ModelInferRequest_InferInputTensor{x, y}, RawInputContents: [][]byte{fp32(1, 2, 3, 4)}},
			codes.InvalidArgument, "raw_input_contents has 1 entries for 2 inputs"},
		{"typed count", &pb.ModelInferRequest{ModelName: "typed", Inputs: []*pb.ModelInferRequest_InferInputTensor{
			{Name: "x", Datatype: "FP32", Shape: []int64{2, 2}, Contents: &pb.InferTensorContents{Fp32Contents: []float32{1}}}, y}},
			codes.InvalidArgument, "contents hold 1 elements in fp32_contents, the field for FP32; the shape holds 4"},
		// Elements in another datatype's field: the message names the one
		// the datatype takes, and where they went.
		{"typed wrong field", &pb.ModelInferRequest{ModelName: "echo", Inputs: []*pb.ModelInferRequest_InferInputTensor{
			{Name: "INPUT0", Datatype: "UINT8", Shape: []int64{2}, Contents: &pb.InferTensorContents{IntContents: []int32{1, 2}}}}},
			codes.InvalidArgument, `input "INPUT0": contents hold 0 elements in uint_contents, the field for UINT8; the shape holds 2 (int_contents holds 2, not the field for UINT8)`},
		{"negative dimension", &pb.ModelInferRequest{ModelName: "echo", Inputs: []*pb.ModelInferRequest_InferInputTensor{{Name: "INPUT0", Datatype: "UINT8", Shape: []int64{-2}}},
			RawInputContents: [][]byte{{1}}}, codes.InvalidArgument, `input "INPUT0": shape [-2]: dimension 0 is negative`},
		{"typed range", &pb.ModelInferRequest{ModelName: "typed", Inputs: []*pb.ModelInferRequest_InferInputTensor{
			{Name: "x", Datatype: "FP32", Shape: []int64{2, 2}, Contents: &pb.InferTensorContents{Fp32Contents: []float32{1, 2, 3, 4}}},
			{Name: "y", Datatype: "INT16", Shape: []int64{1}, Contents: &pb.InferTensorContents{IntContents: []int32{70000}}}}},
			codes.InvalidArgument, "int_contents[0] = 70000 is not an INT16"},
		{"unknown output", &pb.ModelInferRequest{ModelName: "echo", Inputs: []*pb.ModelInferRequest_InferInputTensor{{Name: "INPUT0", Datatype: "UINT8", Shape: []int64{1}}},
			RawInputContents: [][]byte{{1}}, Outputs: []*pb.ModelInferRequest_InferRequestedOutputTensor{{Name: "z"}}}, codes.InvalidArgument, `output "z" is not one of the model's outputs`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			_, err := f.client.ModelInfer(ctx, tc.req)
			st, _ := status.FromError(err)
			if st.Code() != tc.code || !strings.Contains(st.Message(), tc.msg) {
				t.Fatalf("%v %q, want %v with %q", st.Code(), st.Message(), tc.code, tc.msg)
			}
		})
	}
	// A version that is not current is counted as HTTP counts it: under its
	// model's name once the model has been served (the name is known).
	echo := &pb.ModelInferRequest{ModelName: "echo", Inputs: []*pb.ModelInferRequest_InferInputTensor{{Name: "INPUT0", Datatype: "UINT8", Shape: []int64{1}}},
		RawInputContents: [][]byte{{1}}}
	if _, err := f.client.ModelInfer(ctxT(t), echo); err != nil {
		t.Fatal(err)
	}
	echo.ModelVersion = "00000000"
	if _, err := f.client.ModelInfer(ctxT(t), echo); status.Code(err) != codes.NotFound {
		t.Fatalf("another version of echo: %v", err)
	}
	if got := testutil.ToFloat64(counter(t, f.reg, "echo", "404")); got != 1 {
		t.Errorf("echo's 404s: %v, want 1 (the version that is not current)", got)
	}
	if _, err := f.client.ModelMetadata(ctxT(t), &pb.ModelMetadataRequest{Name: "nope"}); status.Code(err) != codes.NotFound {
		t.Errorf("ModelMetadata of an unknown model: %v", err)
	}
}

type table map[string]*auth.Principal

func (t table) Lookup(tok []byte) *auth.Principal { return t[string(tok)] }

// Tokens in the authorization metadata, with HTTP's scopes and globs.
func TestAuth(t *testing.T) {
	f := serve(t, table{
		"reader":  {Name: "reader", Scopes: auth.Read},
		"invoker": {Name: "invoker", Scopes: auth.Invoke, Functions: []string{"ech*"}},
		"limited": {Name: "limited", Scopes: auth.Invoke, Limits: auth.Limits{Rate: 0.001, Burst: 1}},
	})
	infer := &pb.ModelInferRequest{ModelName: "echo", Inputs: []*pb.ModelInferRequest_InferInputTensor{{Name: "INPUT0", Datatype: "UINT8", Shape: []int64{1}}},
		RawInputContents: [][]byte{{1}}}
	with := func(tok string) context.Context {
		ctx := ctxT(t)
		if tok == "" {
			return ctx
		}
		return metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+tok)
	}
	if _, err := f.client.ServerLive(with(""), &pb.ServerLiveRequest{}); err != nil {
		t.Errorf("ServerLive without a token: %v", err)
	}
	for _, tc := range []struct {
		name, tok string
		call      func(ctx context.Context) error
		code      codes.Code
		msg       string
	}{
		{"infer, no token", "", func(ctx context.Context) error { _, err := f.client.ModelInfer(ctx, infer); return err }, codes.Unauthenticated, "needs a token"},
		{"infer, unknown token", "x", func(ctx context.Context) error { _, err := f.client.ModelInfer(ctx, infer); return err }, codes.Unauthenticated, "not known"},
		{"infer, read token", "reader", func(ctx context.Context) error { _, err := f.client.ModelInfer(ctx, infer); return err }, codes.PermissionDenied, ""},
		{"metadata, no token", "", func(ctx context.Context) error {
			_, err := f.client.ModelMetadata(ctx, &pb.ModelMetadataRequest{Name: "echo"})
			return err
		}, codes.Unauthenticated, ""},
		{"metadata, read token", "reader", func(ctx context.Context) error {
			_, err := f.client.ModelMetadata(ctx, &pb.ModelMetadataRequest{Name: "echo"})
			return err
		}, codes.OK, ""},
		{"infer in glob", "invoker", func(ctx context.Context) error { _, err := f.client.ModelInfer(ctx, infer); return err }, codes.OK, ""},
		{"infer outside glob", "invoker", func(ctx context.Context) error {
			_, err := f.client.ModelInfer(ctx, &pb.ModelInferRequest{ModelName: "typed"})
			return err
		}, codes.PermissionDenied, "typed"},
		{"rate: the burst", "limited", func(ctx context.Context) error { _, err := f.client.ModelInfer(ctx, infer); return err }, codes.OK, ""},
		{"rate: over", "limited", func(ctx context.Context) error { _, err := f.client.ModelInfer(ctx, infer); return err }, codes.ResourceExhausted, "retry in"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.call(with(tc.tok))
			st, _ := status.FromError(err)
			if st.Code() != tc.code || !strings.Contains(st.Message(), tc.msg) {
				t.Fatalf("%v %q, want %v with %q", st.Code(), st.Message(), tc.code, tc.msg)
			}
		})
	}
}

// A call whose message never comes (a client that sends the headers and
// holds the stream) is ended within the read timeout, and until then holds
// a place in its token's concurrency: held calls used to last for ever
// (200 connections x 32 streams, 5.5 minutes), outside the token's limits.
func TestCallWithoutItsMessage(t *testing.T) {
	const timeout = 400 * time.Millisecond
	f := serveOpts(t, table{"two": {Name: "two", Scopes: auth.Invoke, Functions: []string{"*"}, Limits: auth.Limits{Concurrency: 2}}},
		grpcapi.Options{ReadTimeout: timeout})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer two")
	infer := &pb.ModelInferRequest{ModelName: "echo", Inputs: []*pb.ModelInferRequest_InferInputTensor{{Name: "INPUT0", Datatype: "UINT8", Shape: []int64{1}}},
		RawInputContents: [][]byte{{1}}}
	start := time.Now()
	var held []grpc.ClientStream
	for range 2 { // headers now, the message never
		cs, err := f.conn.NewStream(ctx, &grpc.StreamDesc{ClientStreams: true, ServerStreams: true}, pb.GRPCInferenceService_ModelInfer_FullMethodName)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, cs)
	}
	// One connection: the server reads the held calls' headers first.
	_, err := f.client.ModelInfer(ctx, infer)
	if st, _ := status.FromError(err); st.Code() != codes.ResourceExhausted || !strings.Contains(st.Message(), "concurrency") {
		t.Fatalf("a third call while two wait for their messages: %v, want ResourceExhausted (concurrency)", err)
	}
	for i, cs := range held {
		err := cs.RecvMsg(&pb.ModelInferResponse{})
		if st, _ := status.FromError(err); st.Code() == codes.OK || st.Code() == codes.DeadlineExceeded && ctx.Err() != nil {
			t.Fatalf("held call %d: %v after %v; want it ended by the server", i, err, time.Since(start))
		}
	}
	if d := time.Since(start); d > timeout+2*time.Second {
		t.Fatalf("held calls ended after %v, read timeout %v", d, timeout)
	}
	for { // their places come back as their streams end
		_, err := f.client.ModelInfer(ctx, infer)
		if err == nil {
			break
		}
		if st, _ := status.FromError(err); st.Code() != codes.ResourceExhausted || ctx.Err() != nil {
			t.Fatalf("after the held calls ended: %v", err)
		}
	}
}

// A client that calls one at a time finds its place free for its next
// call: the place is given back before the answer is written, not when the
// stream is torn down after it (1 in 30 calls was refused for concurrency).
func TestSequentialCallsAtConcurrencyOne(t *testing.T) {
	f := serve(t, table{"one": {Name: "one", Scopes: auth.Invoke, Functions: []string{"*"}, Limits: auth.Limits{Concurrency: 1}}})
	ctx := metadata.AppendToOutgoingContext(ctxT(t), "authorization", "Bearer one")
	infer := &pb.ModelInferRequest{ModelName: "echo", Inputs: []*pb.ModelInferRequest_InferInputTensor{{Name: "INPUT0", Datatype: "UINT8", Shape: []int64{1}}},
		RawInputContents: [][]byte{{1}}}
	for i := range 1000 {
		if _, err := f.client.ModelInfer(ctx, infer); err != nil {
			t.Fatalf("call %d, the one before it answered: %v", i, err)
		}
	}
}

// The client's deadline bounds the request on the server (queued past it:
// 504, DeadlineExceeded), and a client that cancels is counted as gone
// (499), as HTTP counts them; neither holds a queue slot.
func TestDeadlineAndCancel(t *testing.T) {
	f := serve(t, nil)
	one := &pb.ModelInferRequest{ModelName: "slow", Inputs: []*pb.ModelInferRequest_InferInputTensor{{Name: "INPUT0", Datatype: "UINT8", Shape: []int64{1}}},
		RawInputContents: [][]byte{{1}}}
	for _, tc := range []struct {
		name string
		call func() error
		code string // the metrics' status for slow
	}{
		{"deadline while queued", func() error {
			ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
			defer cancel()
			_, err := f.client.ModelInfer(ctx, one)
			return err
		}, "504"},
		{"cancelled while queued", func() error {
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { _, err := f.client.ModelInfer(ctx, one); done <- err }()
			testkit.WaitFor(t, f.e, "slow", "the second request queued", testkit.Busy(1, 1))
			cancel()
			return <-done
		}, "499"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// The one instance busy for 2 s: the request queues behind it.
			busy := make(chan error, 1)
			go func() { _, err := f.client.ModelInfer(ctxT(t), one); busy <- err }()
			testkit.WaitFor(t, f.e, "slow", "the first request running", testkit.Busy(1, 0))
			if err := tc.call(); err == nil {
				t.Fatal("the request succeeded")
			}
			deadline := time.Now().Add(10 * time.Second)
			for testutil.ToFloat64(counter(t, f.reg, "slow", tc.code)) != 1 {
				if time.Now().After(deadline) {
					t.Fatalf("no request of slow counted %s", tc.code)
				}
				time.Sleep(5 * time.Millisecond)
			}
			testkit.WaitFor(t, f.e, "slow", "the queue empty", func(fi api.FunctionInfo) bool { return fi.Queue == 0 })
			if err := <-busy; err != nil {
				t.Fatalf("the first request: %v", err)
			}
		})
	}
}

func batchItem(value, sleepMs uint32) []byte {
	b := binary.LittleEndian.AppendUint32(nil, value)
	return binary.LittleEndian.AppendUint32(b, sleepMs)
}

// gRPC calls share a batching function's runs as HTTP requests do: six
// queued behind a busy instance run as one batch, each answered with its
// own item, and server-timing says the batch's size.
func TestBatching(t *testing.T) {
	f := serve(t, nil)
	m := testkit.BatchManifest("b", 16, "")
	m.MaxInstances = 1
	dir := t.TempDir()
	testkit.BuildLib(t, testkit.BatchSource(), dir, m.Library)
	testkit.WriteManifest(t, dir, m)
	testkit.Deploy(t, f.e, dir)
	type res struct {
		value, items uint32
		timing       string
		err          error
	}
	call := func(value, sleepMs uint32) chan res {
		ch := make(chan res, 1)
		go func() {
			var hdr metadata.MD
			r, err := f.client.ModelInfer(ctxT(t), &pb.ModelInferRequest{ModelName: "b",
				Inputs:           []*pb.ModelInferRequest_InferInputTensor{{Name: "INPUT0", Datatype: "UINT8", Shape: []int64{8}}},
				RawInputContents: [][]byte{batchItem(value, sleepMs)}}, grpc.Header(&hdr))
			if err != nil {
				ch <- res{err: err}
				return
			}
			out := r.RawOutputContents[0]
			ch <- res{value: binary.LittleEndian.Uint32(out), items: binary.LittleEndian.Uint32(out[4:]), timing: strings.Join(hdr.Get("server-timing"), "")}
		}()
		return ch
	}
	if r := <-call(1, 0); r.err != nil || r.value != 2 || r.items != 1 {
		t.Fatalf("first call: %+v", r)
	}
	busy := call(100, 300)
	testkit.WaitFor(t, f.e, "b", "the busy run", testkit.Busy(1, 0))
	var queued []chan res
	for i := range 6 {
		queued = append(queued, call(uint32(1000+i), 0))
	}
	testkit.WaitFor(t, f.e, "b", "six calls queued", testkit.Busy(1, 6))
	if r := <-busy; r.err != nil || r.value != 101 {
		t.Fatalf("the busy call: %+v", r)
	}
	for i, ch := range queued {
		r := <-ch
		if r.err != nil || r.value != uint32(1001+i) || r.items != 6 || !strings.Contains(r.timing, "batch;desc=6") {
			t.Fatalf("call %d: %+v, want value %d in a batch of 6", i, r, 1001+i)
		}
	}
}

// A model name no function has is told the one within a typo of it, over
// gRPC as over HTTP (the front door's one classification): NotFound with
// the did-you-mean in the status's message.
func TestDidYouMeanOverGRPC(t *testing.T) {
	f := serve(t, nil)
	c, ctx := f.client, ctxT(t)
	for _, tc := range []struct {
		method string
		call   func() error
		want   string
	}{
		{"ModelInfer", func() error {
			_, err := c.ModelInfer(ctx, &pb.ModelInferRequest{ModelName: "ecoh"})
			return err
		}, `(did you mean "echo"?)`},
		{"ModelMetadata", func() error { _, err := c.ModelMetadata(ctx, &pb.ModelMetadataRequest{Name: "typd"}); return err }, `(did you mean "typed"?)`},
		{"ModelReady", func() error { _, err := c.ModelReady(ctx, &pb.ModelReadyRequest{Name: "slwo"}); return err }, `(did you mean "slow"?)`},
	} {
		st := status.Convert(tc.call())
		if st.Code() != codes.NotFound || !strings.HasSuffix(st.Message(), tc.want) {
			t.Errorf("%s: %v %q, want NotFound ending %q", tc.method, st.Code(), st.Message(), tc.want)
		}
	}
}

// model_version runs that version, current or not (its label, as a model
// repository deploys it, or its id), as over HTTP.
func TestModelVersionRuns(t *testing.T) {
	f := serve(t, nil)
	m := testkit.Manifest("echo")
	m.OutBytes = 128 // another bundle than the fixture's echo, made current
	b, _, _, err := bundle.PackBytes(testkit.BundleDir(t, m, nil))
	if err != nil {
		t.Fatal(err)
	}
	cur, err := f.e.Control().DeployLabeled(context.Background(), "echo", "7", false, bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	rec, err := f.e.Control().Versions(context.Background(), "echo")
	if err != nil || len(rec.Versions) != 2 {
		t.Fatalf("echo's record: %v %v", rec, err)
	}
	old := rec.Versions[0].ID
	for _, c := range []struct {
		version, ran string
		out          int
	}{{"", cur.Version, 128}, {"7", cur.Version, 128}, {old, old, int(f.raw.OutBytes)}, {old[:8], old, int(f.raw.OutBytes)}} {
		var hdr metadata.MD
		r, err := f.client.ModelInfer(ctxT(t), &pb.ModelInferRequest{ModelName: "echo", ModelVersion: c.version,
			Inputs:           []*pb.ModelInferRequest_InferInputTensor{{Name: "INPUT0", Datatype: "UINT8", Shape: []int64{3}}},
			RawInputContents: [][]byte{{7, 8, 9}}}, grpc.Header(&hdr))
		if err != nil {
			t.Errorf("model_version %q: %v", c.version, err)
			continue
		}
		if ran := hdr.Get("x-plover-version"); len(ran) != 1 || ran[0] != c.ran || len(r.RawOutputContents[0]) != c.out {
			t.Errorf("model_version %q ran %v with %d bytes out (want %s, %d)", c.version, ran, len(r.RawOutputContents[0]), c.ran, c.out)
		}
	}
}
