package pipeline

// A step's failure, as the pipeline's caller is told it.

import (
	"errors"
	"fmt"

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
	if sees == nil || !errors.As(err, &f) || reqmetrics.StepShown(&call.StepTiming{Step: f.Label}, sees) {
		return "", false
	}
	return fmt.Sprintf("pipeline %s: step %d failed (its function is one this token may not use: its owner can read why in its logs and metrics)", f.Pipeline, f.Index), true
}
