// Package call holds what every layer shares about one invocation: the
// request, how it found an instance and where its time went. The engine
// fills it, the pipelines compose it, and the transports, metrics and
// traces read it; it imports nothing of Plover's but the ABI's launch
// description, so none of them reaches into the engine for it.
package call

import (
	"errors"
	"time"

	"github.com/plover-run/plover/abi"
)

// Start says how a request found its instance.
type Start uint8

const (
	Hot  Start = iota // an idle instance was reused
	Warm              // the version was loaded; a new instance was created
	Cold              // the version was loaded (and maybe fetched) for this request
)

func (s Start) String() string { return [...]string{"hot", "warm", "cold"}[s] }

// Timing splits a request's time; Total includes everything in Invoke.
type Timing struct {
	Queue, Load, CopyIn, Kernels, CopyOut, Total time.Duration
	// BatchWait is the part of Queue a free instance held the request for
	// company (a batching function with max_delay); 0 otherwise.
	BatchWait time.Duration
	// Sched is the time the run waited for the device's scheduler: for
	// other functions' runs, by their shares and priorities.
	Sched time.Duration
	// Prep is the part of Load a cold request spent before it queued:
	// its version's bundle from the node cache or the store (verified,
	// unpacked), by this request or waiting for another's. Program is the
	// part after the queue that loaded the library, constants and hooks on
	// the device (for the request whose cold start loaded the program; 0
	// for a batching function's runs); the rest of Load is the instance.
	Prep, Program time.Duration
	// Resolve is the time before the request queued that was not Prep:
	// finding the function's current version (a store read on a node
	// that had not seen it) and checking the request against it.
	// Dispatch is the time after the queue that no other part holds:
	// handing the run to the device and its result back beside what the
	// device measured (a worker process's message and reply, waking it;
	// a batch's gathering and its hand-off to each request), and a run
	// that found its worker dead and was tried again. A function
	// request's parts add up to its Total: Resolve + Queue + Load + Sched
	// + CopyIn + Kernels + CopyOut + Dispatch.
	Resolve, Dispatch time.Duration
	// Handoff and Handback are parts of Dispatch: the run's message's
	// wait for its worker process to read it and the reply's for the
	// server to read it (device.Timing's); 0 in the server's process.
	Handoff, Handback time.Duration
}

// End sets Total and, from it, Dispatch: what no other part holds; and
// bounds Handoff and Handback, parts of it, to it (a worker's clock
// readings are its word, each bounded apart by its run's wall time).
func (t *Timing) End(total time.Duration) {
	t.Total = total
	t.Dispatch = t.unheld(total)
	t.Handoff = min(t.Handoff, t.Dispatch)
	t.Handback = min(t.Handback, t.Dispatch-t.Handoff)
}

// EndIn is End for a request that failed before it ran: what no part
// holds of total goes to part, one of t's (Resolve, Queue or Load: where
// it failed), not to Dispatch, the hand-over of a run it never had. Its
// time so is laid out where it went (a 504 after a long queue and a cold
// load), as a request's that ran is.
func (t *Timing) EndIn(part *time.Duration, total time.Duration) {
	*part += t.unheld(total)
	t.End(total)
}

// unheld is what no part but Dispatch holds of total.
func (t *Timing) unheld(total time.Duration) time.Duration {
	return max(0, total-t.Resolve-t.Queue-t.Load-t.Sched-t.CopyIn-t.Kernels-t.CopyOut)
}

// Override replaces parts of the manifest for one request, within its limits.
type Override struct {
	Chain    []abi.Launch // nil: the manifest's chain
	OutBytes int64        // < 0: the manifest's out_bytes
	TmpBytes int64        // < 0: the manifest's tmp_bytes
	// Names, if set, is how the client's body names a field of the
	// override given its Plover name (out_bytes, tmp_bytes, chain,
	// chain[1].grid), so that a refusal names the field the client sent
	// (a PyPlover body's output_size, grid_sizes[1]).
	Names func(field string) string
}

// Field is field as the client named it (Names).
func (o *Override) Field(field string) string {
	if o.Names == nil {
		return field
	}
	return o.Names(field)
}

// Request is one invocation. Callers may reuse a Request (and its Output's
// capacity) across calls; the engine never keeps references to it.
type Request struct {
	Input    []byte
	Override *Override
	// Deadline bounds queue time plus execution: the client's, or the
	// server's default timeout from Began, set once at the front door
	// (frontdoor.Door.Begin); zero, from a caller that passed no door: the
	// engine's timeout from when it begins the request. A request that
	// would start after it fails with KindTimeout without running.
	Deadline time.Time
	// Began is when the transport began the request, set with Deadline at
	// the door: its trace's start.
	Began time.Time
	// Reached is when the engine (or a pipeline's runner) began timing
	// the request: Timing's parts run from it, Resolve first, to Reached
	// + Total. A trace lays them out from here, not back from when the
	// transport had its answer ready, which comes after its encoding (a
	// /v2 JSON answer, a /v1 base64 one); zero where none timed it.
	Reached time.Time
	// Gone, if set, reports whether the client has gone away. It is polled
	// while the request waits for an instance, so an abandoned request
	// gives up its queue slot instead of holding it until its deadline.
	Gone func() bool
	// Output is set to the bytes the chain produced (out_bytes, or fewer when
	// an ABI 2 entry lowered s->out.len), reusing its capacity.
	Output  []byte
	Timing  Timing
	Start   Start
	Version string
	// Device is the name of the device the request ran on ("" when it
	// did not run).
	Device string
	// BatchSize is how many requests ran in this one's chain run (a
	// batching function); 0 for a function that does not batch.
	BatchSize int
	// Steps is, for a pipeline (package pipeline), each function step's
	// timing in the order they ran; it keeps its capacity across calls and
	// is empty for a function.
	Steps []StepTiming
	// Landing, when set, is the memory Input was read into, lent by the
	// request path before the body was read (Land): the run works on it
	// where it is, and Output is then its output region (the caller writes
	// the response from it, and releases the landing after). Nil: Input and
	// Output are ordinary memory, copied in and out.
	Landing Landing
	// Copied is the payload bytes copied on the host for this request
	// besides reading the body and writing the response: into and out of a
	// device's slot or buffers when the request did not land where its run
	// read it (a landing on another device, or none), and by the device.
	Copied int64
}

// Landing is memory a request's body is read into, where the device that
// will run it reads its input and writes its output: a worker's shared
// slot. The transport that asked for it releases it once the response is
// written: until then no other request uses it.
type Landing interface {
	Input() []byte  // the input region, max_input_bytes long: read the body into it
	Output() []byte // the output region, out_bytes long: the run's output lands here
	Release()
	// Discard is Release where the request's run panicked: a worker may
	// still write into the slot, so it never serves another request; its
	// memory goes once its worker is done with it, or with its program.
	Discard()
}

// ErrLandedElsewhere is the cause of a request's failure where its landing
// was lent by a program that may not run it (its worker crashed or was
// replaced meanwhile, and may have rewritten the slot): it did not run. A
// caller that holds the input elsewhere too (gRPC's message) may run it
// again without the landing.
var ErrLandedElsewhere = errors.New("the request's input is in a slot its run may not use")

// StepTiming is one function step of a pipeline request.
type StepTiming struct {
	// Step is the step as the pipeline names it ("cnn"; "inner/cnn" for a
	// step of a nested pipeline) and Index its position (0-based) in the
	// pipeline the request named.
	Step      string
	Index     int
	Version   string
	Start     Start
	Timing    Timing
	BatchSize int
	Device    string
	// Begin is when the step started, after the pipeline's request did:
	// parallel steps share a start.
	Begin time.Duration
}
