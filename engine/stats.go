package engine

import (
	"sync/atomic"

	"github.com/plover-run/plover/apierr"
	"github.com/plover-run/plover/call"
	"github.com/plover-run/plover/errdefs"
)

// stats are a function's requests on this node (plover ls): a failed one
// is a client error or an error by its class's HTTP status (apierr), 4xx
// or 5xx, as /metrics counts it under its code.
type stats struct {
	requests, clientErrors, errors atomic.Int64
	cold, warm, hot                atomic.Int64
	latencyNs                      atomic.Int64 // sum over successful requests
}

// failed counts a failed request: a client error when its class is a 4xx
// (the request's own fault, a function at capacity, a client that left),
// else an error (the function's or the server's).
func (s *stats) failed(err error) {
	if apierr.Of(errdefs.KindOf(err)).HTTP < 500 {
		s.clientErrors.Add(1)
	} else {
		s.errors.Add(1)
	}
}

// count records how a request that ran found its instance.
func (s *stats) count(start call.Start) {
	switch start {
	case call.Cold:
		s.cold.Add(1)
	case call.Warm:
		s.warm.Add(1)
	default:
		s.hot.Add(1)
	}
}
