package engine

import (
	"sync/atomic"
	"time"

	"github.com/plover-run/plover/apierr"
	"github.com/plover-run/plover/call"
	"github.com/plover-run/plover/errdefs"
)

// stats are a function's requests on this node (plover ls): a failed one
// is a client error or an error by its class's HTTP status (apierr), 4xx
// or 5xx, as /metrics counts it under its code. A request is counted when
// it ends, as plover_requests_total counts it: one still running has no
// outcome yet, and counted at its start it read as a success of no time
// (requests less the failed), which drew the mean latency towards zero
// and showed a mean of 0 where none had succeeded.
type stats struct {
	requests, clientErrors, errors atomic.Int64
	cold, warm, hot                atomic.Int64
	succeeded                      atomic.Int64 // what latencyNs is the sum over
	latencyNs                      atomic.Int64 // sum over successful requests
}

// ended counts a request that ended: failed (err) or succeeded in total.
// Its outcome is counted before the request, so that a reader between the
// two sees one success fewer, never a success that was not.
func (s *stats) ended(err error, total time.Duration) {
	if err != nil {
		s.failed(err)
	} else {
		s.latencyNs.Add(int64(total))
		s.succeeded.Add(1)
	}
	s.requests.Add(1)
}

// meanUs is the mean latency of the successful requests in microseconds,
// 0 when none succeeded.
func (s *stats) meanUs() int64 {
	n := s.succeeded.Load()
	if n <= 0 {
		return 0
	}
	return s.latencyNs.Load() / n / 1000
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
