package grpcapi_test

import (
	"net"
	"os"
	"path/filepath"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/plover-run/plover/engine"
	"github.com/plover-run/plover/grpcapi"
	pb "github.com/plover-run/plover/grpcapi/inferencepb"
	"github.com/plover-run/plover/internal/testkit"
)

// ModelReady is whether the model takes inference requests now: a
// function whose library a device refused (a dependency missing: every
// request fails with InvalidArgument, and will until a redeploy) is not
// ready, as Triton answers for a model that failed to load; it answered
// ready: true. Another function on the same server stays ready.
func TestModelReadyOfAFunctionThatFailedToLoad(t *testing.T) {
	dir := t.TempDir()
	dep := filepath.Join(dir, "dep.c")
	os.WriteFile(dep, []byte("int plover_probe_dep(void) { return 1; }\n"), 0o644)
	testkit.BuildLib(t, dep, dir, "libploverdep.so")
	m := testkit.Manifest("broken")
	bdir := t.TempDir()
	testkit.BuildLib(t, testkit.KernelsSource(), bdir, m.Library, "-L"+dir, "-Wl,--no-as-needed", "-lploverdep")
	testkit.WriteManifest(t, bdir, m)
	os.Remove(filepath.Join(dir, "libploverdep.so"))
	e := testkit.Engine(t, engine.Config{})
	testkit.Deploy(t, e, bdir)
	testkit.Deploy(t, e, testkit.BundleDir(t, testkit.Manifest("echo"), nil))
	gs := grpcapi.New(testkit.Door(e, nil, nil), grpcapi.Options{}).GRPC()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go gs.Serve(ln)
	t.Cleanup(gs.Stop)
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	c, ctx := pb.NewGRPCInferenceServiceClient(conn), ctxT(t)
	in := &pb.ModelInferRequest{ModelName: "broken", Inputs: []*pb.ModelInferRequest_InferInputTensor{{Name: "INPUT0", Datatype: "UINT8", Shape: []int64{1}}},
		RawInputContents: [][]byte{{1}}}
	for range 2 {
		if _, err := c.ModelInfer(ctx, in); status.Code(err) != codes.InvalidArgument {
			t.Fatalf("ModelInfer of broken: %v, want InvalidArgument (its library refused)", err)
		}
		r, err := c.ModelReady(ctx, &pb.ModelReadyRequest{Name: "broken"})
		if err != nil || r.Ready {
			t.Fatalf("ModelReady of broken after its load failed: %v %v, want ready false", r, err)
		}
	}
	if r, err := c.ModelReady(ctx, &pb.ModelReadyRequest{Name: "echo"}); err != nil || !r.Ready {
		t.Fatalf("ModelReady of echo: %v %v", r, err)
	}
}
