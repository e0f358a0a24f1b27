package pipeline

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/engine"
	"github.com/plover-run/plover/errdefs"
	"github.com/plover-run/plover/pipedef"
)

// plan is a pipeline resolved for one request: its stages in order, with
// nested pipelines' stages inlined (a sequence of sequences is one).
type plan struct {
	name   string
	stages []stage
	pins   []engine.Pin // every function and nested pipeline pinned, once each; released with the plan
	// pinned is pins by function and version reference: a function named
	// by several steps runs one version in a request, whatever deploys
	// land while the plan is made.
	pinned    map[pinKey]engine.Pin
	functions int   // function steps, nested pipelines and parallel steps multiplied out
	holds     int64 // the most bytes of step outputs a request holds at once (Pin.Holds)
}

// stage is a function, or parallel branches given the same input whose
// outputs are concatenated in order.
type stage struct {
	index int    // the step of the requested pipeline it comes from
	label string // the step's name: "cnn", "inner/cnn" inside pipeline inner
	pin   engine.Pin
	par   [][]stage
	// cut, for the parallel stage whose outputs are the pipeline's
	// declared outputs, is the bytes each branch's declared outputs take
	// (-1: the rest, a last branch whose last output varies): a branch's
	// output is cut to them, so that each tensor is read from its own
	// branch's bytes and not from a sibling's padding. nil: outputs are
	// concatenated whole.
	cut []int64
	// out is the most bytes its output takes (stageHolds), set with the
	// plan's holds: seq drops a buffer too small for it before the stage
	// runs rather than holding it beside the one the stage makes.
	out int64
}

// Pin resolves name, and if it is a pipeline every function of its steps
// (their current versions, or those the steps pin). Every successful Pin
// must be released. Store reads end at deadline (the request's, which the
// front door sets; zero: each read's own, the engine's request timeout).
func (r *Runner) Pin(ctx context.Context, name string, deadline time.Time) (Pin, error) {
	top, err := r.e.Pin(ctx, name, deadline)
	if err != nil {
		return Pin{}, err
	}
	return r.plan(ctx, name, top, deadline)
}

// PinVersion is Pin for the version of name that ref names (an id, an 8+
// character prefix, or a model repository's label), current or not: the
// Open Inference Protocol's /v2/models/NAME/versions/V runs V.
func (r *Runner) PinVersion(ctx context.Context, name, ref string, deadline time.Time) (Pin, error) {
	top, err := r.e.PinVersion(ctx, name, ref, deadline)
	if err != nil {
		return Pin{}, err
	}
	return r.plan(ctx, name, top, deadline)
}

// plan holds top and, for a pipeline's version, every function its steps
// run.
func (r *Runner) plan(ctx context.Context, name string, top engine.Pin, deadline time.Time) (_ Pin, err error) {
	steps, ok := stepsOf(top)
	if !ok {
		return Pin{r: r, top: top}, nil
	}
	pl := &plan{name: top.Name()}
	made := false
	defer func() {
		// Also on a panic (a store read's, re-raised by the engine): the
		// pins taken so far would hold their versions for good.
		if !made {
			pl.release()
			top.Release()
		}
	}()
	if err := checkSteps(pl.name, steps); err != nil {
		return Pin{}, &PlanError{Pipeline: pl.name, Err: err}
	}
	for i, s := range steps {
		st, err := r.expand(ctx, deadline, pl, i, "", s, []string{name})
		if err != nil {
			return Pin{}, &PlanError{Pipeline: pl.name, Err: err}
		}
		pl.stages = append(pl.stages, st...)
	}
	if outs, ok := lastOutputs(pl.stages); ok {
		markCuts(pl.stages, outs)
	}
	pl.holds, _ = seqHolds(pl.stages)
	made = true // after every step of planning: a panic in one releases the pins
	return Pin{r, top, pl}, nil
}

// stepsOf is p's version's steps, and whether it is a pipeline's: told by
// its kind, as the engine tells it, not by its steps, which a record
// leaves out when they are none (api.Version's omitempty).
func stepsOf(p engine.Pin) ([]abi.Step, bool) {
	v := p.Version()
	return v.Steps, v.IsPipeline()
}

// checkSteps is the error of a pipeline whose record has no steps, or more
// than abi.MaxPipelineSteps (deploys refuse both; a record written by
// hand, or by another build, may hold one): planning indexes a pipeline's
// first and last steps, and the step metrics its steps by their index
// among abi.MaxPipelineSteps.
func checkSteps(pipeline string, steps []abi.Step) error {
	var why string
	switch {
	case len(steps) == 0:
		why = "has no steps in its record"
	case len(steps) > abi.MaxPipelineSteps:
		why = fmt.Sprintf("has %d steps in its record, more than the %d a pipeline may have", len(steps), abi.MaxPipelineSteps)
	default:
		return nil
	}
	return &errdefs.Error{Kind: errdefs.KindInternal, Msg: fmt.Sprintf("pipeline %s %s: its requests fail until it is deployed again", pipeline, why)}
}

// PlanError is a pipeline that exists but whose steps could not be
// resolved for a request: a step's function deleted (plover rm --force), a
// pinned version gone, a cycle or a limit passed by records changed since
// its deploy, a store read that failed. Its requests fail before they run,
// so it is not ready; Err is the step's error (stepError), whose status
// it keeps.
type PlanError struct {
	Pipeline string
	Err      error
}

func (e *PlanError) Error() string { return e.Err.Error() }

func (e *PlanError) Unwrap() error { return e.Err }

// expand resolves step s (step index of the requested pipeline, reached
// through the nested pipelines on path) into stages.
func (r *Runner) expand(ctx context.Context, deadline time.Time, pl *plan, index int, prefix string, s abi.Step, path []string) ([]stage, error) {
	if s.Parallel != nil {
		if len(s.Parallel) == 0 { // deploys refuse one; a record by hand may hold it
			return nil, stepError(pl.name, index, prefix+s.String(), &errdefs.Error{Kind: errdefs.KindInternal,
				Msg: "a parallel step with no branches in its record: its requests fail until it is deployed again"})
		}
		st := stage{index: index, label: prefix + s.String()}
		for _, b := range s.Parallel {
			br, err := r.expand(ctx, deadline, pl, index, prefix, b, path)
			if err != nil {
				return nil, err
			}
			st.par = append(st.par, br)
		}
		return []stage{st}, nil
	}
	pin, err := r.pinOnce(ctx, deadline, pl, s)
	if err != nil {
		return nil, stepError(pl.name, index, prefix+s.String(), err)
	}
	sub, nested := stepsOf(pin)
	if !nested {
		pl.functions++
	}
	if !nested && pl.functions > pipedef.MaxFunctions {
		// Deploys refuse more; a nested pipeline deployed since with
		// more steps (or records changed by another node) could still
		// make one request run thousands. The pipeline as deployed, not
		// the request: a 500, as a bundle that cannot start.
		return nil, stepError(pl.name, index, prefix+s.String(), &errdefs.Error{Kind: errdefs.KindInternal,
			Msg: fmt.Sprintf("the pipeline runs more than %d functions per request, nested pipelines included (a nested pipeline deployed since runs more steps): its requests fail until it or that pipeline is deployed again within the limit", pipedef.MaxFunctions)})
	}
	if !nested {
		return []stage{{index: index, label: prefix + s.Function, pin: pin}}, nil
	}
	// A nested pipeline. Deploys refuse cycles; a race between deploys on
	// two nodes could still make one, and it must not recurse for ever.
	if slices.Contains(path, s.Function) || len(path) >= pipedef.MaxDepth {
		return nil, stepError(pl.name, index, prefix+s.String(), &errdefs.Error{Kind: errdefs.KindInternal,
			Msg: fmt.Sprintf("%s -> %s: pipelines form a cycle or nest deeper than %d (deployed since this pipeline): its requests fail until one of them is deployed again", joinPath(path), s.Function, pipedef.MaxDepth)})
	}
	if err := checkSteps(s.Function, sub); err != nil {
		return nil, stepError(pl.name, index, prefix+s.String(), err)
	}
	var out []stage
	for _, ss := range sub {
		st, err := r.expand(ctx, deadline, pl, index, prefix+s.Function+"/", ss, append(slices.Clip(path), s.Function))
		if err != nil {
			return nil, err
		}
		out = append(out, st...)
	}
	return out, nil
}

// pinOnce pins the function (or nested pipeline) step s names, once per
// plan: a name and version reference met again is the pin made first.
func (r *Runner) pinOnce(ctx context.Context, deadline time.Time, pl *plan, s abi.Step) (engine.Pin, error) {
	key := pinKey{s.Function, s.Version} // no string built a step
	if pin, ok := pl.pinned[key]; ok {
		return pin, nil
	}
	var pin engine.Pin
	var err error
	if s.Version != "" {
		pin, err = r.e.PinVersion(ctx, s.Function, s.Version, deadline)
	} else {
		pin, err = r.e.Pin(ctx, s.Function, deadline)
	}
	if err != nil {
		return pin, err
	}
	pl.pins = append(pl.pins, pin)
	if pl.pinned == nil {
		pl.pinned = map[pinKey]engine.Pin{}
	}
	pl.pinned[key] = pin
	return pin, nil
}

// pinKey is a step's function and version reference.
type pinKey struct{ function, version string }

func joinPath(path []string) string {
	s := path[0]
	for _, p := range path[1:] {
		s += " -> " + p
	}
	return s
}

func (pl *plan) release() {
	for _, p := range pl.pins {
		p.Release()
	}
	pl.pins = nil
}
