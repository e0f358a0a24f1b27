package grpcapi_test

import (
	"context"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/plover-run/plover/auth"
	pb "github.com/plover-run/plover/grpcapi/inferencepb"
)

// A token of read (or deploy) limited to ech* reads a model outside its
// globs as a model of no function, over gRPC as over HTTP: ModelMetadata
// and ModelReady answer typed and slow, by name or with a version, with
// the status and message (but for the name quoted) of a name no function
// has. Before, they answered both, as to any token; a token of functions
// "*" still does.
func TestAGlobLimitedTokenReadsAnotherTenantsModelAsUnknown(t *testing.T) {
	f := serve(t, table{
		"ech-reader":   {Name: "ech-reader", Scopes: auth.Read, Functions: []string{"ech*"}},
		"ech-deployer": {Name: "ech-deployer", Scopes: auth.Deploy, Functions: []string{"ech*"}},
		"reader":       {Name: "reader", Scopes: auth.Read, Functions: []string{"*"}},
	})
	calls := map[string]func(ctx context.Context, name, version string) error{
		"ModelMetadata": func(ctx context.Context, name, version string) error {
			_, err := f.client.ModelMetadata(ctx, &pb.ModelMetadataRequest{Name: name, Version: version})
			return err
		},
		"ModelReady": func(ctx context.Context, name, version string) error {
			_, err := f.client.ModelReady(ctx, &pb.ModelReadyRequest{Name: name, Version: version})
			return err
		},
	}
	as := func(tok string) context.Context {
		return metadata.AppendToOutgoingContext(ctxT(t), "authorization", "Bearer "+tok)
	}
	for _, tc := range []struct {
		token, hidden, unknown, version string // unknown: a name of no function, as long
	}{
		{"ech-reader", "typed", "typex", ""},
		{"ech-reader", "slow", "slox", ""},
		{"ech-reader", "typed", "typex", "1"},
		{"ech-deployer", "typed", "typex", ""},
	} {
		for method, call := range calls {
			t.Run(tc.token+" "+method+" "+tc.hidden+" "+tc.version, func(t *testing.T) {
				got := status.Convert(call(as(tc.token), tc.hidden, tc.version))
				unknown := status.Convert(call(as(tc.token), tc.unknown, tc.version))
				want := strings.ReplaceAll(unknown.Message(), tc.unknown, tc.hidden)
				if got.Code() != codes.NotFound || unknown.Code() != codes.NotFound || got.Message() != want {
					t.Fatalf("%v %q, want the unknown name's %v %q", got.Code(), got.Message(), unknown.Code(), want)
				}
			})
		}
	}
	for _, tc := range []struct{ token, model string }{{"ech-reader", "echo"}, {"reader", "typed"}, {"reader", "slow"}} {
		for method, call := range calls {
			if err := call(as(tc.token), tc.model, ""); err != nil {
				t.Errorf("%s %s as %s: %v", method, tc.model, tc.token, err)
			}
		}
	}
}
