package grpcapi_test

import (
	"context"
	"testing"

	"github.com/plover-run/plover/auth"
	"github.com/plover-run/plover/engine"
	"github.com/plover-run/plover/gate"
	"github.com/plover-run/plover/grpcapi"
	pb "github.com/plover-run/plover/grpcapi/inferencepb"
	"github.com/plover-run/plover/internal/testkit"
)

// A hot small ModelInfer over loopback (a 64-byte raw input echoed into a
// 256-byte answer): what a call costs the client and the server together,
// the transport's share of it what its per-call work adds.
func BenchmarkModelInfer(b *testing.B) {
	for _, bc := range []struct {
		name   string
		tokens gate.Tokens
	}{
		{"open", nil},
		// A token with a concurrency limit: each call takes and gives
		// back its place in the token's count (a place of its own).
		{"token", table{"one": {Name: "one", Scopes: auth.Invoke, Functions: []string{"*"}, Limits: auth.Limits{Concurrency: 4}}}},
	} {
		b.Run(bc.name, func(b *testing.B) { benchModelInfer(b, bc.tokens) })
	}
}

func benchModelInfer(b *testing.B, tokens gate.Tokens) {
	e := testkit.Engine(b, engine.Config{})
	testkit.Deploy(b, e, testkit.BundleDir(b, testkit.Manifest("bench"), nil))
	f := serveEngine(b, e, tokens, grpcapi.Options{})
	req := &pb.ModelInferRequest{ModelName: "bench",
		Inputs:           []*pb.ModelInferRequest_InferInputTensor{{Name: "INPUT0", Datatype: "UINT8", Shape: []int64{64}}},
		RawInputContents: [][]byte{make([]byte, 64)}}
	ctx := context.Background()
	if tokens != nil {
		ctx = withToken(ctx, "one")
	}
	if _, err := f.client.ModelInfer(ctx, req); err != nil { // cold start outside the loop
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := f.client.ModelInfer(ctx, req); err != nil {
			b.Fatal(err)
		}
	}
}
