package grpcapi_test

import (
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/engine"
	"github.com/plover-run/plover/frontdoor"
	"github.com/plover-run/plover/gate"
	"github.com/plover-run/plover/grpcapi"
	pb "github.com/plover-run/plover/grpcapi/inferencepb"
	"github.com/plover-run/plover/internal/testkit"
	"github.com/plover-run/plover/objectstore"
	"github.com/plover-run/plover/pipeline"
	"github.com/plover-run/plover/reqmetrics"
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
	pdir := t.TempDir()
	b, _ := json.Marshal(map[string]any{"name": "p", "kind": "pipeline", "steps": []string{"echo"}})
	if err := os.WriteFile(filepath.Join(pdir, abi.ManifestFile), b, 0o644); err != nil {
		t.Fatal(err)
	}
	testkit.Deploy(t, deployer, pdir)

	total := regexp.MustCompile(`(?:^|, )total;dur=([0-9.]+)`)
	for _, model := range []string{"echo", "p"} {
		t.Run(model, func(t *testing.T) {
			e := testkit.Engine(t, engine.Config{Store: testkit.SlowRecords{Store: fs, Delay: delay}}) // has not seen the names
			reg := prometheus.NewRegistry()
			door := frontdoor.New(frontdoor.Config{Runner: pipeline.New(e, reg), Gate: gate.New(nil, reg), Metrics: reqmetrics.New(reg)})
			gs := grpcapi.New(door, grpcapi.Options{}).GRPC()
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
			t.Cleanup(func() { conn.Close() })
			var hdr metadata.MD
			_, err = pb.NewGRPCInferenceServiceClient(conn).ModelInfer(ctxT(t), &pb.ModelInferRequest{ModelName: model,
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
