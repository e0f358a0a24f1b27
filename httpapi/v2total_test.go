package httpapi_test

import (
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/plover-run/plover/engine"
	"github.com/plover-run/plover/httpapi"
	"github.com/plover-run/plover/internal/testkit"
	"github.com/plover-run/plover/objectstore"
)

var timingTotal = regexp.MustCompile(`(?:^|, )total;dur=([0-9.]+)`)

// A /v2 inference's total counts from before its model was found, as a
// /v1 invoke's does (pipeline.Runner.Invoke): finding it may read the
// store (README: resolve, "a node that has not seen the function reads its
// record from the store"), for a pipeline every step's record. The /v2
// route pinned the model first and timed only what came after.
func TestV2TotalCountsTheModelsLookup(t *testing.T) {
	const delay = 200 * time.Millisecond
	storeDir := filepath.Join(t.TempDir(), "store")
	fs, err := objectstore.NewFS(storeDir)
	if err != nil {
		t.Fatal(err)
	}
	deployer := testkit.Engine(t, engine.Config{Store: fs})
	testkit.Deploy(t, deployer, testkit.BundleDir(t, testkit.Manifest("echo"), nil))
	pdir := testkit.PipelineDir(t, "p", "echo")
	testkit.Deploy(t, deployer, pdir)

	infer := []byte(`{"inputs":[{"name":"INPUT0","datatype":"UINT8","shape":[1],"data":[1]}]}`)
	for _, tc := range []struct{ name, path string }{
		{"function on /v1", "/v1/functions/echo/invoke"},
		{"function on /v2", "/v2/models/echo/infer"},
		{"pipeline on /v2", "/v2/models/p/infer"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// A node that has not seen the names: its first request reads
			// their records, each taking delay.
			e := testkit.Engine(t, engine.Config{Store: testkit.SlowRecords{Store: fs, Delay: delay}})
			url := testkit.Serve(t, e, httpapi.Options{})
			body := infer
			if strings.HasPrefix(tc.path, "/v1/") {
				body = []byte{1}
			}
			code, hdr, out := v2Do(t, "POST", url+tc.path, nil, body)
			if code != 200 {
				t.Fatalf("%s: %d %s", tc.path, code, out)
			}
			st := hdr.Get("Server-Timing")
			m := timingTotal.FindStringSubmatch(st)
			if m == nil {
				t.Fatalf("Server-Timing %q has no total", st)
			}
			ms, _ := strconv.ParseFloat(m[1], 64)
			if total := time.Duration(ms * float64(time.Millisecond)); total < delay {
				t.Errorf("total %v, less than the %v its record's read took: Server-Timing %q", total, delay, st)
			}
		})
	}
}
