package httpapi

// What the read routes show a token that does not cover every function
// (gate.View): the functions its globs cover, each with the steps of its
// pipeline it may learn of, its versions without their deployers' names,
// its series of /metrics; a name outside its globs answered as a name of
// no function. The gate lets such a read through on its scope alone
// (required), so the cut is made here, on what the control plane returns.

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	dto "github.com/prometheus/client_model/go"
	"github.com/valyala/fasthttp"
	"github.com/valyala/fasthttp/fasthttpadaptor"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/api"
	"github.com/plover-run/plover/gate"
)

// view is what the request's caller may read.
func (s *Server) view(ctx *fasthttp.RequestCtx) gate.View {
	return s.gate.View(ctx.Request.Header.PeekBytes(hdrAuthorization))
}

// describe is GET /v1/functions/{name}'s function as the caller sees it.
func (s *Server) describe(ctx *fasthttp.RequestCtx, name string) (api.FunctionInfo, error) {
	v := s.view(ctx)
	if err := v.Hide(name); err != nil {
		return api.FunctionInfo{}, err
	}
	fi, err := s.adm.Function(callCtx(ctx), name)
	fi.Steps = shownSteps(fi.Steps, v)
	return fi, err
}

// functions is GET /v1/functions's listing as the caller sees it.
func (s *Server) functions(ctx *fasthttp.RequestCtx) ([]api.FunctionInfo, error) {
	fs, err := s.adm.Functions(callCtx(ctx))
	v := s.view(ctx)
	if err != nil || v.All() {
		return fs, err
	}
	shown := make([]api.FunctionInfo, 0, len(fs))
	for _, fi := range fs {
		if v.Sees(fi.Name) {
			fi.Steps = shownSteps(fi.Steps, v)
			shown = append(shown, fi)
		}
	}
	return shown, nil
}

// versions is GET /v1/functions/{name}/versions's record as the caller
// sees it: a version's tenant (its deployer's token's name) only for a
// token that sees every function, which the names of the tokens are.
func (s *Server) versions(ctx *fasthttp.RequestCtx, name string) (*api.Record, error) {
	v := s.view(ctx)
	if err := v.Hide(name); err != nil {
		return nil, err
	}
	rec, err := s.adm.Versions(callCtx(ctx), name)
	if err != nil || v.All() {
		return rec, err
	}
	shown := *rec // the store's record may be shared: changed in a copy
	shown.Versions = make([]api.Version, len(rec.Versions))
	for i, ver := range rec.Versions {
		ver.Tenant = ""
		ver.Steps = shownSteps(ver.Steps, v)
		shown.Versions[i] = ver
	}
	return &shown, nil
}

// shownSteps is a pipeline's steps as v may see them: a step of a
// function v does not see (another tenant's, which the pipeline offers)
// keeps its place, with neither its function's name nor its version, as
// a pipeline's answer times it (reqmetrics.StepShown). steps is not
// changed.
func shownSteps(steps []abi.Step, v gate.View) []abi.Step {
	if v.All() || len(steps) == 0 {
		return steps
	}
	out := make([]abi.Step, len(steps))
	for i, st := range steps {
		switch {
		case st.Parallel != nil:
			out[i] = abi.Step{Parallel: shownSteps(st.Parallel, v)}
		case v.Sees(st.Function):
			out[i] = st
		}
	}
	return out
}

// index is the model repository's index as the caller sees it.
func (s *Server) index(ctx *fasthttp.RequestCtx, repo Repository, ready bool) []api.RepositoryModel {
	ms := repo.Index(callCtx(ctx), ready)
	v := s.view(ctx)
	if v.All() {
		return ms
	}
	shown := make([]api.RepositoryModel, 0, len(ms))
	for _, m := range ms {
		if v.Sees(m.Name) {
			shown = append(shown, m)
		}
	}
	return shown
}

// scrapeSeen serves /metrics to a caller that does not see every
// function: the registry's series less those of functions, pipelines and
// tokens not its (gate.View.SeesLabel), a family left out whole where
// none of its series is the caller's (its HELP and TYPE with it), a
// histogram's series whole (its buckets, sum and count are one series).
func (s *Server) scrapeSeen(ctx *fasthttp.RequestCtx, v gate.View) {
	g := seenGatherer{s.opts.Registry, v}
	fasthttpadaptor.NewFastHTTPHandler(promhttp.HandlerFor(g, promhttp.HandlerOpts{}))(ctx)
}

// seenGatherer is a Gatherer's families as a view sees them.
type seenGatherer struct {
	g prometheus.Gatherer
	v gate.View
}

func (sg seenGatherer) Gather() ([]*dto.MetricFamily, error) {
	mfs, err := sg.g.Gather() // made for this call: cut in place
	out := mfs[:0]
	for _, mf := range mfs {
		ms := mf.Metric[:0]
		for _, m := range mf.Metric {
			if sg.seen(m) {
				ms = append(ms, m)
			}
		}
		if len(ms) > 0 {
			mf.Metric = ms
			out = append(out, mf)
		}
	}
	return out, err
}

func (sg seenGatherer) seen(m *dto.Metric) bool {
	for _, l := range m.GetLabel() {
		if !sg.v.SeesLabel(l.GetName(), l.GetValue()) {
			return false
		}
	}
	return true
}
