package grpcapi_test

import (
	"fmt"
	"strings"
	"testing"

	"google.golang.org/grpc/metadata"

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
