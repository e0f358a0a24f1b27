// Package oip holds what the Open Inference Protocol's transports (HTTP
// in httpapi, gRPC in grpcapi) share: the version a request runs, and about
// tensors: a request's shapes checked against a function's declared
// tensors, their byte sizes, and a function's output cut into its declared
// outputs.
package oip

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/apierr"
	"github.com/plover-run/plover/errdefs"
	"github.com/plover-run/plover/pipedef"
	"github.com/plover-run/plover/pipeline"
)

// MaxParts bounds the parts of an inference request besides its tensors'
// contents (over HTTP: the JSON header's values but its tensors' data; over
// gRPC: its tensors, parameters and bytes elements). Decoded, a part takes
// 100-150 bytes of memory for as few as 2 bytes sent; without a bound a
// request within --max-body decoded to gigabytes (a 60 MB JSON header of
// empty inputs raised the server to 11 GB). Real requests hold tens.
const MaxParts = 1 << 14

// MaxID bounds a request's id, which its answer echoes: over gRPC an id
// near --max-body made an answer past the send limit, refused
// (ResourceExhausted) after the function had run. Clients send a UUID or
// a counter; 4 KiB leaves room for any trace or batch key.
const MaxID = 4 << 10

// CheckID refuses an id over MaxID before the request runs (400), naming
// the field and its length, not echoing it.
func CheckID(id string) error {
	if len(id) <= MaxID {
		return nil
	}
	return &apierr.Error{Status: apierr.BadRequest, Msg: fmt.Sprintf("id: %d bytes, over the bound of %d (an answer echoes its request's id)", len(id), MaxID)}
}

// Bytes is the byte size of a shape (of dimensions not negative) of
// elements of es bytes; false when it does not fit an int64, which a shape
// sent in a request may ask for.
func Bytes(shape []int64, es int64) (int64, bool) {
	if slices.Contains(shape, 0) {
		return 0, true
	}
	n := es
	for _, d := range shape {
		if d < 0 || (d > 0 && n > math.MaxInt64/d) {
			return 0, false
		}
		n *= d
	}
	return n, true
}

// Requested is the indices in decl of the outputs a request asks for
// (name gives each one's name), in its order, appended to dst[:0]; empty
// when it names none: all, in their order. A name the function does not declare, or
// one asked for twice, is a 400 naming it (the protocol: each requested
// output must be one the model has).
func Requested[T any](dst []int, want []T, name func(T) string, decl []abi.Tensor) ([]int, error) {
	dst = dst[:0]
	if len(want) == 0 {
		return dst, nil
	}
	for _, w := range want {
		n := name(w)
		k := slices.IndexFunc(decl, func(t abi.Tensor) bool { return t.Name == n })
		if k < 0 {
			return dst[:0], &apierr.Error{Status: apierr.BadRequest, Msg: fmt.Sprintf("output %s is not one of the model's outputs (%s)", errdefs.QuoteName(n), Names(decl))}
		}
		if slices.Contains(dst, k) {
			return dst[:0], &apierr.Error{Status: apierr.BadRequest, Msg: fmt.Sprintf("output %s is asked for twice", errdefs.QuoteName(n))}
		}
		dst = append(dst, k)
	}
	return dst, nil
}

// Picked is the cuts pick names (Requested), in its order, appended to dst;
// all of cuts when pick is empty.
func Picked(dst, cuts []Cut, pick []int) []Cut {
	if len(pick) == 0 {
		return append(dst, cuts...)
	}
	for _, k := range pick {
		dst = append(dst, cuts[k])
	}
	return dst
}

// Names lists the tensors' names, for messages.
func Names(ts []abi.Tensor) string {
	var n []string
	for _, t := range ts {
		n = append(n, t.Name)
	}
	return strings.Join(n, ", ")
}

// MissingInput is the error of a request without declared input missing,
// whose n inputs are named by name(i): where one of them is no input of
// the model's, most likely the one meant, the error names it first.
func MissingInput(decl []abi.Tensor, missing string, n int, name func(int) string) error {
	for i := range n {
		if !slices.ContainsFunc(decl, func(t abi.Tensor) bool { return t.Name == name(i) }) {
			return fmt.Errorf("input %s is not one of the model's inputs (%s), and %q is missing", errdefs.QuoteName(name(i)), Names(decl), missing)
		}
	}
	return fmt.Errorf("input %q is missing (the model takes %s)", missing, Names(decl))
}

// shapeHead is a request's shape as an error shows it: its first 8
// dimensions (a declared shape has at most 8), and a count of the rest. A
// gRPC shape may have millions, each printed whole into the message and
// sent back (a review's probe).
func shapeHead(s []int64) string {
	if len(s) <= 8 {
		return fmt.Sprint(s)
	}
	return strings.TrimSuffix(fmt.Sprint(s[:8]), "]") + fmt.Sprintf(" ... and %d more]", len(s)-8)
}

// MatchShape checks a request's shape against a declared one (-1: any
// size in that dimension).
func MatchShape(got, decl []int64) error {
	if len(got) != len(decl) {
		return fmt.Errorf("shape %s has %d dimensions, the model's %v has %d", shapeHead(got), len(got), decl, len(decl))
	}
	for i := range got {
		if got[i] < 0 {
			// Said as it is: "does not match [-1]" read as if -1 were
			// the one size the model refused.
			return fmt.Errorf("shape %v: dimension %d is negative", got, i)
		}
		if decl[i] != -1 && got[i] != decl[i] {
			return fmt.Errorf("shape %v does not match the model's %v", got, decl)
		}
	}
	return nil
}

// InputOver is the 413 of input (shape of datatype), which brings a
// request's inputs, counted in declared order, to total bytes, past
// model's max_input_bytes (maxInput); step, for a pipeline, is the step
// whose bound it is (pipeline.Pin.InputBound). Both transports refuse
// with it before laying any input out, since elements sent as JSON
// numbers or typed contents widen when laid out (an INT64 zero: 2 bytes
// sent, 8 laid out), so one wording serves HTTP and gRPC.
func InputOver(model, input string, shape []int64, datatype string, total, maxInput int64, step pipeline.StepRef) error {
	return step.Refusal(model, func(step string) error {
		whose := "max_input_bytes"
		if step != "" {
			whose = "its " + step + "'s max_input_bytes"
		}
		return &apierr.Error{Status: apierr.TooLarge, Msg: fmt.Sprintf(
			"input %q (shape %v of %s) brings the inputs to %d bytes; model %s takes at most %d (%s)", input, shape, datatype, total, model, maxInput, whose)}
	})
}

// AddSize is total + size, saturating at math.MaxInt64: each size fits an
// int64 (CheckInput), their sum need not.
func AddSize(total, size int64) int64 {
	if size > math.MaxInt64-total {
		return math.MaxInt64
	}
	return total + size
}

// CheckInput checks a request's input against its declaration d (found by
// name): the datatype, the shape, and that its byte size fits an int64,
// which it returns. Errors name the input; one whose size overflows is a
// 413, the others 400s.
func CheckInput(datatype string, shape []int64, d abi.Tensor) (int64, error) {
	if datatype == "" {
		return 0, fmt.Errorf("input %q: no datatype given; the model takes %s", d.Name, d.Datatype)
	}
	if datatype != d.Datatype {
		return 0, fmt.Errorf("input %q: datatype %s, the model takes %s", d.Name, errdefs.KeptName(datatype), d.Datatype)
	}
	if err := MatchShape(shape, d.Shape); err != nil {
		return 0, fmt.Errorf("input %q: %v", d.Name, err)
	}
	size, ok := Bytes(shape, abi.DatatypeSize[d.Datatype])
	if !ok { // too large, as a shape one byte past max_input_bytes is (413), not malformed
		return 0, &apierr.Error{Status: apierr.TooLarge, Msg: fmt.Sprintf("input %q: shape %v of %s: its byte size overflows an int64", d.Name, shape, d.Datatype)}
	}
	return size, nil
}

// Cut is one output: its declaration, shape and bytes.
type Cut struct {
	Decl  *abi.Tensor
	Shape []int64
	Bytes []byte
}

// CutOutputs cuts the declared outputs from out, in order, appending to
// res; the last one's variable dimension takes what is left. The shapes
// are laid in dims (a slice of it stays valid when a later append moves
// dims: the old array keeps its values).
func CutOutputs(out []byte, decl []abi.Tensor, res []Cut, dims []int64) ([]Cut, []int64, error) {
	return Split(out, decl, res, dims, "output")
}

// Split cuts b into the tensors decl declares, as CutOutputs does, naming
// them as what ("output", "input") in its errors: a function's input
// buffer is laid out the same way, so a client that holds one can split it
// into the model's inputs.
func Split(b []byte, decl []abi.Tensor, res []Cut, dims []int64, what string) ([]Cut, []int64, error) {
	for i := range decl {
		d := &decl[i]
		es := abi.DatatypeSize[d.Datatype]
		start := len(dims)
		dims = append(dims, d.Shape...)
		shape := dims[start:len(dims):len(dims)]
		fixed, vi := int64(1), -1
		for k, dim := range shape {
			if dim == -1 {
				vi = k
			} else {
				fixed *= dim
			}
		}
		if vi >= 0 {
			if i != len(decl)-1 || fixed*es == 0 || int64(len(b))%(fixed*es) != 0 {
				return res, dims, fmt.Errorf("%s %q: %d bytes left do not make whole elements of shape %v", what, d.Name, len(b), d.Shape)
			}
			shape[vi] = int64(len(b)) / (fixed * es)
		}
		n := abi.Elements(shape) * es
		if n > int64(len(b)) {
			return res, dims, fmt.Errorf("%s %q needs %d bytes, %d are left", what, d.Name, n, len(b))
		}
		res = append(res, Cut{d, shape, b[:n]})
		b = b[n:]
	}
	return res, dims, nil
}

// Pinner is what Pin needs of a transport's invoker.
type Pinner interface {
	Pin(ctx context.Context, name string, deadline time.Time) (pipeline.Pin, error)
	PinVersion(ctx context.Context, name, ref string, deadline time.Time) (pipeline.Pin, error)
}

// Pin resolves the version of name a request runs, once (the version whose
// tensors lay the inputs out is the version that runs): the current one,
// or the one version names (an id, an 8+ character prefix, or a model
// repository's label: its version folder), current or not, as Triton runs
// any available version. On success the caller releases the pin; the
// tensors are the version's, or abi.RawTensors when it declares none. Its
// store read ends at deadline (the request's, set by the door).
func Pin(ctx context.Context, inv Pinner, name, version string, deadline time.Time) (pipeline.Pin, *abi.Tensors, error) {
	pin, err := inv.Pin(ctx, name, deadline)
	if err != nil {
		return pin, nil, err
	}
	if version != "" && !pin.Version().Names(version) {
		// Not the current version: the engine keeps it beside the
		// current one while requests use it (engine.PinVersion).
		pin.Release()
		if pin, err = PinVersion(ctx, inv, name, version, deadline); err != nil {
			return pin, nil, err
		}
	}
	return pin, Tensors(pin), nil
}

// Tensors is pin's version's declared tensors, or the raw pair where it
// declares none.
func Tensors(pin pipeline.Pin) *abi.Tensors {
	if ts := pin.Version().Tensors; ts != nil {
		return ts
	}
	return &abi.RawTensors
}

// MetadataError is err as a model's metadata answers it. A pipeline whose
// steps do not resolve (a step's function deleted, plover rm --force)
// exists: its ready is not ready, its requests fail at that step, and its
// tensors, which are its steps', cannot be told. Its step's 404 would say
// the model itself is unknown, so it is a 503 naming the model and the
// step, where sees (the caller's view: gate.View.Sees; nil, all) takes the
// step's function, else not naming it; any other error is as it is.
func MetadataError(name string, err error, sees func(function string) bool) error {
	var pe *pipeline.PlanError
	if errors.As(err, &pe) && errdefs.KindOf(err) == errdefs.KindNotFound {
		if msg, hidden := pipeline.Hidden(err, sees); hidden {
			// Neither the step's name nor its error (nor a did-you-mean
			// of it): a function the caller may not see may be another
			// tenant's (gate.View).
			return errdefs.New(errdefs.KindUnavailable, nil, "model %s: its metadata cannot be told while a step does not resolve (%s)", name, msg)
		}
		// Wrapping the step's error: its did-you-mean (frontdoor) still comes.
		return errdefs.New(errdefs.KindUnavailable, err, "model %s: its metadata cannot be told while a step does not resolve (%s): deploy the step's function again, or the pipeline without it", name, pe.Error())
	}
	return err
}

// PinVersion pins the version of name that version names, for a model
// whose current version was found: a version it lacks is a 404 counted
// under its name, as a request its transport refused (not as an unknown
// function's).
//
// A pipeline's version other than its current one runs only for a caller
// that may invoke every function it runs, when ctx carries the caller's
// check (pipedef.WithInvokeCheck: an inference's transport sets it): a
// pipeline offers its steps to its callers as its current version says,
// and a redeploy without a step withdraws it (README, "Pipelines do not
// escalate"), which its older versions, still in its record, undid.
func PinVersion(ctx context.Context, inv Pinner, name, version string, deadline time.Time) (pipeline.Pin, error) {
	pin, err := inv.PinVersion(ctx, name, version, deadline)
	var pe *pipeline.PlanError
	if errdefs.KindOf(err) == errdefs.KindNotFound && !errors.As(err, &pe) { // not a step's 404
		return pin, &apierr.Error{Status: apierr.NotFound, Msg: fmt.Sprintf("model %s has no version %s: name a version folder's number, or a version id or its first 8+ characters (plover versions %s)", name, errdefs.QuoteName(version), name)}
	}
	if err == nil && pin.Pipeline() {
		if err := pin.Runs(func(fn string) error { return pipedef.Allowed(ctx, fn) }); err != nil {
			// Not naming the step: a function the token may not use may
			// be another tenant's, whose name it must not learn.
			pin.Release()
			return pipeline.Pin{}, &apierr.Error{Status: apierr.Forbidden, Msg: fmt.Sprintf("model %s version %s is not its current version, and an older version of a pipeline runs only for a token that may invoke each of its steps, which this one may not (the current version needs invoke on %s alone)", name, version, name)}
		}
	}
	return pin, err
}
