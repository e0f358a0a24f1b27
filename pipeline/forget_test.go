package pipeline_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/call"
	"github.com/plover-run/plover/engine"
	"github.com/plover-run/plover/errdefs"
	"github.com/plover-run/plover/frontdoor"
	"github.com/plover-run/plover/httpapi"
	"github.com/plover-run/plover/internal/testkit"
	"github.com/plover-run/plover/pipeline"
	"github.com/plover-run/plover/reqmetrics"
)

// stepSeries is the step series on reg, as pipeline/step/function (and
// /code for an error's).
func stepSeries(t *testing.T, reg *prometheus.Registry) []string {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, mf := range mfs {
		if !strings.HasPrefix(mf.GetName(), "plover_pipeline_step_") {
			continue
		}
		for _, m := range mf.GetMetric() {
			l := map[string]string{}
			for _, lp := range m.GetLabel() {
				l[lp.GetName()] = lp.GetValue()
			}
			s := l["pipeline"] + "/" + l["step"] + "/" + l["function"]
			if c, ok := l["code"]; ok {
				s += "/" + c
			}
			out = append(out, s)
		}
	}
	slices.Sort(out)
	return out
}

// A pipeline's step series are its current steps': a redeploy with other
// steps drops the old ones' (so does one of a pipeline it nests), and a
// delete drops the pipeline's, and in other pipelines those of the steps
// that ran the deleted function or nested pipeline; a function that
// becomes a pipeline (or back) drops the steps' series of its old kind.
// They used to stay for the process's life.
func TestStepSeriesFollowTheirPipelines(t *testing.T) {
	ctx := context.Background()
	e := testkit.Engine(t, engine.Config{})
	testkit.Deploy(t, e, testkit.BundleDir(t, testkit.Manifest("a"), nil))
	fails := testkit.Manifest("b")
	fails.Chain = []abi.Launch{{Kernel: "fail", Grid: 1, Block: 1}}
	testkit.Deploy(t, e, testkit.BundleDir(t, fails, nil))
	reg := prometheus.NewRegistry()
	r := pipeline.New(e, reg)
	e.Forgets(r)
	invoke := func(names ...string) {
		for _, n := range names {
			r.Invoke(ctx, n, &call.Request{Input: []byte("x")}) // b's steps fail: counted as errors
		}
	}
	deploy := func(name string, steps ...any) { testkit.Deploy(t, e, testkit.PipelineDir(t, name, steps...)) }
	del := func(name string) {
		if err := e.Control().Delete(ctx, name, true); err != nil {
			t.Fatal(err)
		}
	}
	for _, step := range []struct {
		what string
		do   func()
		want []string
	}{
		{"p, and outer nesting inner, ran", func() {
			deploy("p", "a")
			deploy("inner", "a")
			deploy("outer", "inner", "a")
			invoke("p", "outer")
		}, []string{"outer/0/inner/a", "outer/1/a", "p/0/a"}},
		{"p redeployed with other steps", func() { deploy("p", "b"); invoke("p") }, []string{"outer/0/inner/a", "outer/1/a", "p/0/b/500"}},
		{"inner redeployed with other steps", func() { deploy("inner", "b"); invoke("outer") }, []string{"outer/0/inner/b/500", "outer/1/a", "p/0/b/500"}},
		{"a deleted", func() { del("a") }, []string{"outer/0/inner/b/500", "p/0/b/500"}},
		{"p deleted", func() { del("p") }, []string{"outer/0/inner/b/500"}},
		{"inner deleted", func() { del("inner") }, nil},
		{"q running function x ran", func() {
			testkit.Deploy(t, e, testkit.BundleDir(t, testkit.Manifest("x"), nil))
			deploy("q", "x")
			invoke("q")
		}, []string{"q/0/x"}},
		// x's step series as a function went with its kind: it was kept
		// beside the nested one's until x was deleted.
		{"x redeployed as a pipeline", func() { deploy("x", "b"); invoke("q") }, []string{"q/0/x/b/500"}},
		{"x a function again", func() { testkit.ForceDeploy(t, e, testkit.BundleDir(t, testkit.Manifest("x"), nil)); invoke("q") }, []string{"q/0/x"}},
	} {
		step.do()
		if got := stepSeries(t, reg); !slices.Equal(got, step.want) {
			t.Errorf("%s: step series %q, want %q", step.what, got, step.want)
		}
	}
}

// The review's churn: a tenant deploying a pipeline, invoking it once and
// deleting it, again and again, while other functions hold all the
// request labels but a few. The deleted names' series go (from a real
// scrape of /metrics), the labels they held come back, and a function
// deployed after gets one of its own, not _other; the series are the
// live names' alone.
func TestChurnGivesLabelsBack(t *testing.T) {
	ctx := context.Background()
	e := testkit.Engine(t, engine.Config{})
	testkit.Deploy(t, e, testkit.BundleDir(t, testkit.Manifest("echo"), nil))
	reg := prometheus.NewRegistry()
	run, met := pipeline.New(e, reg), reqmetrics.New(reg)
	e.Forgets(run, met) // as plover serve (and testkit.Door) wire them
	url := testkit.ServeWith(t, httpapi.New(frontdoor.New(frontdoor.Config{Runner: run, Metrics: met}), e.Control(), httpapi.Options{Registry: reg}))
	const live = reqmetrics.MaxLabels - 5 // other tenants' functions, answering
	for i := range live {
		met.Record(call.NameOf(fmt.Sprintf("live-%d", i)), 200, errdefs.KindInternal, &call.Request{Version: "v"})
	}
	invoke := func(name string) {
		if resp, body := testkit.Post(t, "POST", url+"/v1/functions/"+name+"/invoke", "application/octet-stream", []byte("x")); resp.StatusCode != 200 {
			t.Fatalf("invoke %s: %d %s", name, resp.StatusCode, body)
		}
	}
	for i := range 20 {
		name := fmt.Sprintf("churn-%d", i)
		testkit.Deploy(t, e, testkit.PipelineDir(t, name, "echo"))
		invoke(name)
		if err := e.Control().Delete(ctx, name, false); err != nil {
			t.Fatal(err)
		}
	}
	testkit.Deploy(t, e, testkit.PipelineDir(t, "victim", "echo"))
	invoke("victim")
	resp, body := testkit.Post(t, "GET", url+"/metrics", "", nil)
	if resp.StatusCode != 200 {
		t.Fatalf("GET /metrics: %d", resp.StatusCode)
	}
	count := map[string]int{}
	for _, line := range strings.Split(string(body), "\n") {
		name, _, _ := strings.Cut(line, "{")
		count[name]++
		if strings.Contains(line, "churn-") {
			t.Errorf("a deleted pipeline's series: %s", line)
		}
		if strings.Contains(line, `"_other"`) {
			t.Errorf("a series of _other, with labels to spare: %s", line)
		}
	}
	if !strings.Contains(string(body), `plover_requests_total{code="200",function="victim"} 1`) {
		t.Error("the function deployed after the churn has no series of its own")
	}
	if n := count["plover_requests_total"]; n != live+1 {
		t.Errorf("%d plover_requests_total series, want %d: the live functions' and victim's", n, live+1)
	}
	if n := count["plover_pipeline_step_seconds_count"]; n != 1 {
		t.Errorf("%d pipeline step histograms, want victim's alone", n)
	}
}
