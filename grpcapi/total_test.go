package grpcapi_test

import (
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	"github.com/plover-run/plover/engine"
	"github.com/plover-run/plover/grpcapi"
	pb "github.com/plover-run/plover/grpcapi/inferencepb"
	"github.com/plover-run/plover/internal/testkit"
	"github.com/plover-run/plover/objectstore"
)

// ModelInfer's server-timing total counts from before the model was found
// (its records read from the store; a pipeline's, every step's), as
// HTTP's /v1 invoke does: not from after the pin.
func TestInferTotalCountsTheModelsLookup(t *testing.T) {
	const delay = 200 * time.Millisecond
	fs, err := objectstore.NewFS(filepath.Join(t.TempDir(), "store"))
	if err != nil {
		t.Fatal(err)
	}
	deployer := testkit.Engine(t, engine.Config{Store: fs})
	testkit.Deploy(t, deployer, testkit.BundleDir(t, testkit.Manifest("echo"), nil))
	pdir := testkit.PipelineDir(t, "p", "echo")
	testkit.Deploy(t, deployer, pdir)

	total := regexp.MustCompile(`(?:^|, )total;dur=([0-9.]+)`)
	for _, model := range []string{"echo", "p"} {
		t.Run(model, func(t *testing.T) {
			e := testkit.Engine(t, engine.Config{Store: testkit.SlowRecords{Store: fs, Delay: delay}}) // has not seen the names
			f := serveEngine(t, e, nil, grpcapi.Options{})
			var hdr metadata.MD
			_, err := f.client.ModelInfer(ctxT(t), &pb.ModelInferRequest{ModelName: model,
				Inputs:           []*pb.ModelInferRequest_InferInputTensor{{Name: "INPUT0", Datatype: "UINT8", Shape: []int64{1}}},
				RawInputContents: [][]byte{{1}}}, grpc.Header(&hdr))
			if err != nil {
				t.Fatal(err)
			}
			st := strings.Join(hdr.Get("server-timing"), "")
			m := total.FindStringSubmatch(st)
			if m == nil {
				t.Fatalf("server-timing %q has no total", st)
			}
			ms, _ := strconv.ParseFloat(m[1], 64)
			if got := time.Duration(ms * float64(time.Millisecond)); got < delay {
				t.Errorf("total %v, less than the %v its record's read took: server-timing %q", got, delay, st)
			}
		})
	}
}
