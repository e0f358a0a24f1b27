package pipeline

import (
	"context"
	"fmt"
	"time"

	"github.com/plover-run/plover/api"
	"github.com/plover-run/plover/errdefs"
)

// Admit is asked before a request's body is read: the most input bytes
// name takes now (0: unknown), or the error the request would get now
// (404; 429 for a full queue), so that a body no version could take, or a
// flood for a full function, is refused without its bytes. A pipeline takes
// what its first step takes (each branch of a parallel first step gets the
// whole input: the least of theirs) and its queue is its first step's,
// which Invoke meets first. It holds nothing: a deploy may change the
// answer before Invoke, which checks again.
func (r *Runner) Admit(ctx context.Context, name string, deadline time.Time) (Admission, error) {
	p, err := r.Pin(ctx, name, deadline)
	if err != nil {
		return Admission{}, err
	}
	defer p.Release()
	a := Admission{Version: p.top.Version()}
	if p.plan == nil {
		a.MaxInput, err = p.top.MaxInput(), p.top.Full()
	} else {
		a.MaxInput, a.Step = p.InputBound()
		err = r.firstFull(p.plan.name, p.plan.stages[0])
	}
	return a, err
}

// Admission is what Admit found: the most input bytes the request may
// bring (0: unknown), for a pipeline the step whose max_input_bytes that
// is (Pin.InputBound), and the version that would run it.
type Admission struct {
	MaxInput int64
	Step     StepRef // none for a function
	Version  api.Version
}

// InputBound is the most input bytes the pinned version takes (0:
// unknown) and, for a pipeline, which has no max_input_bytes of its own,
// the step whose bound it is (a refusal's message names it); none for a
// function.
func (p Pin) InputBound() (int64, StepRef) {
	if p.plan == nil {
		return p.top.MaxInput(), StepRef{}
	}
	n, by := firstMaxInput(&p.plan.stages[0])
	if by == nil {
		return 0, StepRef{}
	}
	return n, StepRef{Index: by.index, Label: by.label}
}

// inputFits is nil, or the 413 for an input of n bytes over what a
// pipeline's first step takes, refused before any step runs (and counted
// as the pipeline's request alone, as a body refused before it is read
// is): a caller who may not use that step's function reads the bound,
// not its name (StepRef.Refusal).
func (p Pin) inputFits(n int) error {
	limit, by := p.InputBound()
	if limit <= 0 || int64(n) <= limit {
		return nil
	}
	return by.Refusal(p.plan.name, func(step string) error {
		return &errdefs.Error{Kind: errdefs.KindTooLarge, Msg: fmt.Sprintf("pipeline %s: input is %d bytes; its %s accepts at most %d (max_input_bytes)", p.plan.name, n, step, limit)}
	})
}

// firstMaxInput is the most input bytes a first stage takes, and the
// function stage whose bound it is: each branch of a parallel one gets the
// whole input, so the least of theirs (0 and nil: unknown).
func firstMaxInput(st *stage) (int64, *stage) {
	if st.par == nil {
		return st.pin.MaxInput(), st
	}
	var least int64
	var by *stage
	for j := range st.par {
		if n, s := firstMaxInput(&st.par[j][0]); n > 0 && (least == 0 || n < least) {
			least, by = n, s
		}
	}
	return least, by
}

// firstFull is the refusal a first stage's queue would give now, if any,
// naming the step and counted as its error, as Invoke's would be: a
// request's step errors do not depend on whether its body was small
// enough to reach Invoke.
func (r *Runner) firstFull(pipeline string, st stage) error {
	if st.par == nil {
		if err := st.pin.Full(); err != nil {
			r.met.observe(pipeline, st.index, st.label, 0, err)
			return stepError(pipeline, st.index, st.label, err)
		}
		return nil
	}
	for _, br := range st.par {
		if err := r.firstFull(pipeline, br[0]); err != nil {
			return err
		}
	}
	return nil
}
