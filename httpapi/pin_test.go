package httpapi_test

import (
	"context"
	"encoding/json"
	"sync"
	"testing"
	"time"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/api"
	"github.com/plover-run/plover/engine"
	"github.com/plover-run/plover/frontdoor"
	"github.com/plover-run/plover/httpapi"
	"github.com/plover-run/plover/internal/testkit"
	"github.com/plover-run/plover/pipeline"
)

// redeployer is the engine, with a deploy of the next version made right
// after the /v2 route has resolved the function's version for the first
// time: the window in which a request could lay its inputs out by one
// version's tensors and run another.
type redeployer struct {
	*engine.Engine
	once sync.Once
	next func()
}

func (r *redeployer) Pin(ctx context.Context, name string, deadline time.Time) (engine.Pin, error) {
	p, err := r.Engine.Pin(ctx, name, deadline)
	r.once.Do(r.next)
	return p, err
}

// A /v2 inference runs on the version its inputs were laid out for, even
// when a deploy makes another current between resolving the function and
// running it: the response names the version that ran, and that is the
// one whose tensors the request was read by.
func TestV2InferPinsItsVersion(t *testing.T) {
	e := testkit.Engine(t, engine.Config{})
	old := testkit.Manifest("m")
	old.Tensors = &abi.Tensors{
		Inputs:  []abi.Tensor{{Name: "x", Datatype: "FP32", Shape: []int64{2}}},
		Outputs: []abi.Tensor{{Name: "y", Datatype: "FP32", Shape: []int64{2}}},
	}
	old.OutBytes = 8
	v1 := testkit.Deploy(t, e, testkit.BundleDir(t, old, nil))
	neu := testkit.Manifest("m")
	neu.Tensors = &abi.Tensors{
		Inputs:  []abi.Tensor{{Name: "a", Datatype: "INT32", Shape: []int64{4}}},
		Outputs: []abi.Tensor{{Name: "b", Datatype: "INT32", Shape: []int64{4}}},
	}
	neu.OutBytes = 16
	newDir := testkit.BundleDir(t, neu, nil)
	var v2 api.FunctionInfo
	r := &redeployer{Engine: e, next: func() { v2 = testkit.Deploy(t, e, newDir) }}
	url := testkit.ServeWith(t, httpapi.New(frontdoor.New(frontdoor.Config{Runner: pipeline.New(r, nil)}), e.Control(), httpapi.Options{}))

	code, _, b := v2Do(t, "POST", url+"/v2/models/m/infer", nil,
		[]byte(`{"inputs":[{"name":"x","datatype":"FP32","shape":[2],"data":[1.5,-2]}]}`))
	if v2.Version == "" || v2.Version == v1.Version {
		t.Fatalf("the test's redeploy did not happen (versions %q, %q)", v1.Version, v2.Version)
	}
	var out v2Out
	if err := json.Unmarshal(b, &out); err != nil || code != 200 {
		t.Fatalf("%d %s", code, b)
	}
	if out.ModelVersion != v1.Version || len(out.Outputs) != 1 || out.Outputs[0].Name != "y" ||
		len(out.Outputs[0].Data) != 2 || out.Outputs[0].Data[0] != "1.5" || out.Outputs[0].Data[1] != "-2" {
		t.Fatalf("inputs laid out for version %s; the response: %s", v1.Version, b)
	}
	// The next request finds the new version.
	code, _, b = v2Do(t, "POST", url+"/v2/models/m/infer", nil,
		[]byte(`{"inputs":[{"name":"a","datatype":"INT32","shape":[4],"data":[1,2,3,4]}]}`))
	if err := json.Unmarshal(b, &out); err != nil || code != 200 || out.ModelVersion != v2.Version || out.Outputs[0].Name != "b" {
		t.Fatalf("after the redeploy: %d %s", code, b)
	}
}
