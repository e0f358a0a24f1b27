package frontdoor

import (
	"fmt"
	"runtime/debug"
)

// PanicMessage is what a client whose request panicked is told, over
// either transport: not the panic's value nor its stack, which are the
// log's.
const PanicMessage = "internal error: the server failed while handling this request (a bug; it is logged, and counted in plover_panics_total)"

// Panicked records a panic recovered while a transport served a request
// (v: recover's value), which the transport answers itself (500, gRPC's
// Internal, or a closed connection when its answer had begun): counted in
// plover_panics_total{transport} and logged in one line with the route,
// the function (a copy: "" when none is known) and the stack. Called in
// the deferred function that recovered, so that the stack still shows
// where the panic was raised. The lines are capped as the refusals' are
// (netguard.LogThrottle: 20 a second across the transports, the next line
// saying how many the cap held back), not per client: each tells of a
// bug.
func (d *Door) Panicked(transport, route, function string, v any) {
	if d.metrics != nil {
		d.metrics.Panicked(transport)
	}
	ok, unlogged := d.panicLog.AllowLine()
	if !ok {
		return
	}
	// fmt recovers a panic in v's own Error or String and says so.
	attrs := []any{"transport", transport, "route", route, "panic", fmt.Sprint(v), "stack", string(debug.Stack())}
	if function != "" {
		attrs = append(attrs, "function", function)
	}
	if unlogged > 0 {
		attrs = append(attrs, "not_logged", unlogged) // panics the log's cap held back before this one
	}
	d.log.Error("request panicked", attrs...)
}

// PanickedInvoke is Panicked for a request that ran function (an invoke,
// an infer), counted besides as a 500 in plover_requests_total (under
// _unknown for a name with no series yet, as other failures before an
// answer are), so that an error rate on requests sees it. Not in the
// function's counts (plover ls): the engine may have counted the request
// before the panic, and where it panicked is not known here.
func (d *Door) PanickedInvoke(transport, route, function string, v any) {
	d.Panicked(transport, route, function, v)
	if function != "" && d.metrics != nil {
		d.metrics.Failed(function, 500)
	}
}
