package grpcapi_test

import (
	"fmt"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/plover-run/plover/auth"
	pb "github.com/plover-run/plover/grpcapi/inferencepb"
)

// The methods open without a token answer a call that carries a stale
// (revoked) or malformed one as they answer one without: nothing was
// refused, so plover_auth_failures_total does not move, as it does not
// for HTTP's /v2/health/live with the same header. A load balancer's
// health check configured with a revoked token counted an
// unknown_token failure a probe, every few seconds, and an operator's
// alert on auth failures fired for calls that were all answered.
func TestOpenMethodsWithAStaleTokenAreNoAuthFailure(t *testing.T) {
	f := serve(t, table{"root": {Name: "root", Scopes: auth.Admin}})
	before := gatherFailures(t, f)
	for _, authz := range []string{"Bearer revoked", "Basic cm9vdDpyb290"} {
		ctx := metadata.AppendToOutgoingContext(ctxT(t), "authorization", authz)
		if _, err := f.client.ServerLive(ctx, &pb.ServerLiveRequest{}); err != nil {
			t.Fatalf("ServerLive with %q: %v", authz, err)
		}
		if _, err := f.client.ServerMetadata(ctx, &pb.ServerMetadataRequest{}); err != nil {
			t.Fatalf("ServerMetadata with %q: %v", authz, err)
		}
	}
	if after := gatherFailures(t, f); after != before {
		t.Errorf("open calls, all answered, moved the auth failures: %s, then %s", before, after)
	}
	// A refused call still counts.
	ctx := metadata.AppendToOutgoingContext(ctxT(t), "authorization", "Bearer revoked")
	if _, err := f.client.ModelMetadata(ctx, &pb.ModelMetadataRequest{Name: "echo"}); err == nil {
		t.Fatal("ModelMetadata with an unknown token answered")
	}
	if after := gatherFailures(t, f); after == before {
		t.Errorf("a refused call left the auth failures at %s", after)
	}
}

// gatherFailures is plover_auth_failures_total by reason, as one string.
func gatherFailures(t *testing.T, f *fixture) string {
	t.Helper()
	mfs, err := f.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for _, mf := range mfs {
		if mf.GetName() != "plover_auth_failures_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			fmt.Fprintf(&b, "%s=%g ", m.GetLabel()[0].GetValue(), m.GetCounter().GetValue())
		}
	}
	return b.String()
}

// An inference that names no model is the client's mistake, answered
// InvalidArgument naming the field whatever the token's globs: a token
// limited to its functions was told PermissionDenied, "store-wide
// operations need the admin scope or functions *", as if it had asked
// for a gc, and the call was counted as a forbidden auth failure.
func TestInferNamingNoModelIsInvalidArgument(t *testing.T) {
	f := serve(t, table{
		"invoker":  {Name: "invoker", Scopes: auth.Invoke, Functions: []string{"ech*"}},
		"all":      {Name: "all", Scopes: auth.Invoke},
		"reader":   {Name: "reader", Scopes: auth.Read},
		"deployer": {Name: "deployer", Scopes: auth.Deploy, Functions: []string{"ech*"}},
	})
	before := gatherFailures(t, f)
	for _, tok := range []string{"invoker", "all"} {
		ctx := metadata.AppendToOutgoingContext(ctxT(t), "authorization", "Bearer "+tok)
		_, err := f.client.ModelInfer(ctx, &pb.ModelInferRequest{})
		if st, _ := status.FromError(err); st.Code() != codes.InvalidArgument || !strings.Contains(st.Message(), "model name") {
			t.Errorf("token %s, no model name: %v %q, want InvalidArgument naming the model name", tok, st.Code(), st.Message())
		}
	}
	if after := gatherFailures(t, f); after != before {
		t.Errorf("inferences naming no model moved the auth failures: %s, then %s", before, after)
	}
	// Its scope still applies: a token that may not invoke is refused as
	// it is naming a model (a review found the empty name skipped it).
	for _, tok := range []string{"reader", "deployer"} {
		ctx := metadata.AppendToOutgoingContext(ctxT(t), "authorization", "Bearer "+tok)
		_, err := f.client.ModelInfer(ctx, &pb.ModelInferRequest{})
		if st, _ := status.FromError(err); st.Code() != codes.PermissionDenied || !strings.Contains(st.Message(), "invoke") {
			t.Errorf("token %s, no model name: %v %q, want PermissionDenied naming the invoke scope", tok, st.Code(), st.Message())
		}
	}
}

// A call's rate is charged from its headers, as its concurrency is: a
// message that does not decode never reaches the interceptor that charged
// it, so a token over its rate could send malformed calls, each read and
// decoded, without limit (a review found it).
func TestMalformedCallsAreChargedTheirRate(t *testing.T) {
	f := serve(t, table{"limited": {Name: "limited", Scopes: auth.Read, Limits: auth.Limits{Rate: 0.001, Burst: 1}}})
	if _, err := f.client.ModelMetadata(withToken(ctxT(t), "limited"), &pb.ModelMetadataRequest{Name: "echo"}); status.Code(err) == codes.ResourceExhausted {
		t.Fatalf("the token's first call: %v", err)
	}
	bad := &wrapperspb.BytesValue{Value: []byte{0xff, 0xfe}} // field 1, where a string is: not UTF-8
	for i := range 3 {
		err := f.conn.Invoke(withToken(ctxT(t), "limited"), pb.GRPCInferenceService_ModelMetadata_FullMethodName, bad, &pb.ModelMetadataResponse{})
		if status.Code(err) != codes.ResourceExhausted {
			t.Fatalf("malformed call %d past the token's rate: %v, want ResourceExhausted", i, err)
		}
	}
}
