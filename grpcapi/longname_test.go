package grpcapi_test

import (
	"runtime"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/plover-run/plover/abi"
	pb "github.com/plover-run/plover/grpcapi/inferencepb"
	"github.com/plover-run/plover/internal/testkit"
)

// A model name may be as long as the body limit (256 MiB by default). One
// no function has is answered NotFound at a cost of a few copies of it,
// not a did-you-mean table of len(name) ints per function name (a 2 MiB
// name allocated 1.5 GB), and the message quotes its head only.
func TestLongModelNameRefusedInBoundedMemory(t *testing.T) {
	f := serve(t, nil) // echo, typed, slow
	testkit.Deploy(t, f.e, testkit.BundleDir(t, testkit.Manifest(strings.Repeat("q", abi.MaxNameLen)), nil))
	name := strings.Repeat("q", 1<<20)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	_, err := f.client.ModelMetadata(ctxT(t), &pb.ModelMetadataRequest{Name: name})
	runtime.ReadMemStats(&after)
	st := status.Convert(err)
	if st.Code() != codes.NotFound || !strings.Contains(st.Message(), `"`+name[:64]+`"...`) ||
		len(st.Message()) > 256 || strings.Contains(st.Message(), "did you mean") {
		t.Errorf("ModelMetadata(1 MiB name): %v %.200q, want NotFound quoting its first 64 bytes, no suggestion", st.Code(), st.Message())
	}
	// The client's message, the server's read of it and the name decoded
	// and kept for the error: a few MiB of the process's (client and
	// server) allocation, with room for what runs beside.
	n := after.TotalAlloc - before.TotalAlloc
	t.Logf("a 1 MiB name: %d KiB allocated", n>>10)
	if n > 32<<20 {
		t.Errorf("a 1 MiB name allocated %d MiB", n>>20)
	}
}
