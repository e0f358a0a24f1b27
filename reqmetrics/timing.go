package reqmetrics

import (
	"strconv"
	"strings"
	"time"

	"github.com/plover-run/plover/call"
)

// ServerTimingCap is room for a function request's whole Server-Timing
// (every part, a worker run's two and a batch's, each up to 99,999 ms):
// the transports' buffers start at it, so that no request grows one.
// A pipeline's steps may.
const ServerTimingCap = 320

// AppendServerTiming appends r's timing as a Server-Timing header value
// (milliseconds, as the header's dur expects): the phases, which for a
// function add up to total (resolve and dispatch hold what the others do
// not), a batching function's batch wait and size, and a pipeline's
// steps: each named only where sees (nil: every name) takes every name in
// its path ("inner/cnn"), else by its place and time alone (StepShown).
// HTTP sends it as Server-Timing, gRPC as server-timing header metadata.
// It allocates nothing when b has room.
func AppendServerTiming(b []byte, r *call.Request, sees func(string) bool) []byte {
	t := &r.Timing
	b = appendDur(b, "queue", t.Queue, true)
	b = appendDur(b, "sched", t.Sched, false)
	b = appendDur(b, "load", t.Load, false)
	b = appendDur(b, "copyin", t.CopyIn, false)
	b = appendDur(b, "kernels", t.Kernels, false)
	b = appendDur(b, "copyout", t.CopyOut, false)
	b = appendDur(b, "resolve", t.Resolve, false)
	b = appendDur(b, "dispatch", t.Dispatch, false)
	if t.Handoff > 0 || t.Handback > 0 { // a worker's run: dispatch's parts
		b = appendDur(b, "handoff", t.Handoff, false)
		b = appendDur(b, "handback", t.Handback, false)
	}
	b = appendDur(b, "total", t.Total, false)
	if n := r.BatchSize; n > 0 {
		// A batching function: the part of queue spent held for company,
		// and how many requests shared the run.
		b = appendDur(b, "batchwait", t.BatchWait, false)
		b = append(b, ", batch;desc="...)
		b = strconv.AppendInt(b, int64(n), 10)
	}
	// A pipeline: one entry per function step, in the order they ran,
	// named by index with the function, its start and its version short.
	for i := range r.Steps { // index: its step in the pipeline (parallel functions share one)
		if i == maxTimedSteps {
			// Headers have limits (16 KiB in some clients): the rest in one.
			b = append(b, ", more;desc=\""...)
			b = strconv.AppendInt(b, int64(len(r.Steps)-i), 10)
			b = append(b, " steps\""...)
			break
		}
		b = appendStep(b, &r.Steps[i], StepShown(&r.Steps[i], sees))
	}
	return b
}

// maxTimedSteps bounds a pipeline's step entries in Server-Timing.
const maxTimedSteps = 64

// StepShown reports whether a pipeline's caller may learn st's function:
// sees (nil: every name; else gate.Sees, its token's globs) takes every
// name in the step's path. A pipeline may offer a function to clients
// that may not call it, and so not learn of it: its name, version, nor
// whether another tenant ran it lately (its start kind).
func StepShown(st *call.StepTiming, sees func(string) bool) bool {
	return PathShown(st.Step, sees)
}

// PathShown reports whether sees (nil: every name) takes every name in a
// step's path ("inner/cnn"), as its Server-Timing entry and its series'
// function label write it.
func PathShown(path string, sees func(string) bool) bool {
	if sees == nil {
		return true
	}
	for rest := path; ; {
		name, after, more := strings.Cut(rest, "/")
		if !sees(name) {
			return false
		}
		if !more {
			return true
		}
		rest = after
	}
}

// appendStep writes a pipeline step's Server-Timing entry:
// step1;desc="cnn hot 3f1c9a2e";dur=0.210 (its whole time in the engine),
// or, not shown to its caller, step1;dur=0.210.
func appendStep(b []byte, st *call.StepTiming, shown bool) []byte {
	b = append(b, ", step"...)
	b = strconv.AppendInt(b, int64(st.Index), 10)
	if !shown {
		b = append(b, ";dur="...)
		return strconv.AppendFloat(b, float64(st.Timing.Total.Nanoseconds())/1e6, 'f', 3, 64)
	}
	b = append(b, ";desc=\""...)
	b = append(b, st.Step...)
	b = append(b, ' ')
	b = append(b, st.Start.String()...)
	if id := st.Version; id != "" {
		b = append(b, ' ')
		b = append(b, id[:min(8, len(id))]...)
	}
	b = append(b, "\";dur="...)
	return strconv.AppendFloat(b, float64(st.Timing.Total.Nanoseconds())/1e6, 'f', 3, 64)
}

func appendDur(b []byte, name string, d time.Duration, first bool) []byte {
	if !first {
		b = append(b, ", "...)
	}
	b = append(b, name...)
	b = append(b, ";dur="...)
	return strconv.AppendFloat(b, float64(d.Nanoseconds())/1e6, 'f', 3, 64)
}
