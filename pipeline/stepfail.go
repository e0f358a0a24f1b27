package pipeline

// A step's failure, as the pipeline's caller is told it.

import (
	"errors"
	"fmt"
	"strings"

	"github.com/plover-run/plover/apierr"
	"github.com/plover-run/plover/call"
	"github.com/plover-run/plover/errdefs"
	"github.com/plover-run/plover/reqmetrics"
)

// stepError names the step a failure came from, keeping its kind (so its
// status): "pipeline digits: step 1 (cnn): ...".
func stepError(pipeline string, index int, label string, err error) error {
	var ae *apierr.Error
	if errors.As(err, &ae) {
		return atStep(pipeline, index, label, &apierr.Error{Status: ae.Status, Msg: fmt.Sprintf("pipeline %s: step %d (%s): %s", pipeline, index, label, ae.Msg)})
	}
	var ee *errdefs.Error
	if errors.As(err, &ee) {
		return atStep(pipeline, index, label, &errdefs.Error{Kind: ee.Kind, Msg: fmt.Sprintf("pipeline %s: step %d (%s): %s", pipeline, index, label, ee.Msg), Err: err})
	}
	return atStep(pipeline, index, label, &errdefs.Error{Kind: errdefs.KindInternal, Msg: fmt.Sprintf("pipeline %s: step %d (%s) failed", pipeline, index, label), Err: err})
}

// StepFailure is a failure that names a pipeline's step (Label: its
// function, or nested pipeline and function): the error as it is (its
// kind, its status, its message for the operator's log and for a caller
// who may use the function), which Hidden says less of.
type StepFailure struct {
	Pipeline string
	Index    int
	Label    string
	Err      error
	Told     string // what Hidden tells; "" for its own words
}

func (f *StepFailure) Error() string { return f.Err.Error() }
func (f *StepFailure) Unwrap() error { return f.Err }

// AtStep reports whether err names a pipeline's step (a StepFailure).
func AtStep(err error) bool {
	if err == nil {
		return false
	}
	var f *StepFailure
	return errors.As(err, &f)
}

func atStep(pipeline string, index int, label string, err error) error {
	return &StepFailure{Pipeline: pipeline, Index: index, Label: label, Err: err}
}

// Hidden is what a caller is told of err where err names a step whose
// function (or nested pipeline) sees (gate.Sees: the caller's token's
// globs) does not take: the step's place, not its name nor its function's
// own words, which may be another tenant's (a pipeline may offer a
// function to clients that may not call it); ok is false where err names
// no such step.
func Hidden(err error, sees func(string) bool) (msg string, ok bool) {
	var f *StepFailure
	if sees == nil || !errors.As(err, &f) || shown(f.Label, sees) {
		return "", false
	}
	if f.Told != "" {
		return f.Told, true
	}
	return fmt.Sprintf("pipeline %s: step %d failed (its function is one this token may not use: its owner can read why in its logs and metrics)", f.Pipeline, f.Index), true
}

// shown reports whether sees takes every name label mentions. A parallel
// step's label ("parallel(a, b@v)", "inner/parallel(a, b)": a failure
// before its branches ran, the request's deadline or its client gone)
// names each branch's function: matched whole against a token's globs,
// "*b*" took it, telling a's name to a token that may not use a.
func shown(label string, sees func(string) bool) bool {
	path, branches, par := strings.Cut(label, "parallel(")
	if !par {
		return stepShown(label, sees)
	}
	for b := range strings.SplitSeq(strings.TrimSuffix(branches, ")"), ", ") {
		if !stepShown(path+b, sees) {
			return false
		}
	}
	return true
}

// stepShown reports whether sees takes every name a function's step's
// label mentions ("cnn", "inner/cnn"), a pinned version's id left out:
// not a name. A step that failed as its request was planned is labelled
// as written ("cnn@3f1c9a2e", expand), and matched whole it told a token
// that may use cnn that it may not, not why the step failed (its 404 or
// 503). Only the last segment holds one: expand names nested pipelines
// alone, and names hold no '@' (abi.ValidName).
func stepShown(label string, sees func(string) bool) bool {
	fn, _, _ := strings.Cut(label, "@")
	return reqmetrics.StepShown(&call.StepTiming{Step: fn}, sees)
}

// StepRef is a pipeline's step whose bound a refusal names (Pin.InputBound);
// its zero value, none: a function's own.
type StepRef struct {
	Index int
	Label string // its function, or nested pipeline and function
}

// Refusal is the refusal msg makes, given how to name the step: "step 0
// (cnn)", "" for none. For a step, it is a StepFailure of pipeline's,
// which tells a caller who may not use the step's function (Hidden) msg's
// words for "step 0" alone: a refusal before the pipeline runs (its input
// over its first step's max_input_bytes) is the caller's to mend, so it
// keeps every word but the name.
func (r StepRef) Refusal(pipeline string, msg func(step string) error) error {
	if r.Label == "" {
		return msg("")
	}
	return &StepFailure{Pipeline: pipeline, Index: r.Index, Label: r.Label,
		Err: msg(fmt.Sprintf("step %d (%s)", r.Index, r.Label)), Told: msg(fmt.Sprintf("step %d", r.Index)).Error()}
}
