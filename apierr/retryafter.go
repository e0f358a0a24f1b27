package apierr

import (
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/plover-run/plover/errdefs"
)

// maxRetryAfter is the longest wait RetryAfter gives: 2^31 s, about 68 years.
const maxRetryAfter = 1 << 31 * time.Second

// RetryAfter reads a Retry-After header's value: delay-seconds, or an HTTP
// date (the wait until then, rounded up to a second); 0 for none, one that
// is neither, or a wait already over. It lives here, beside the statuses
// that carry the header (429 busy and rate_limited, a 503), so that the
// CLI's single requests and plover bench's load read it alike: bench
// cannot import the CLI, and two parsers would drift.
func RetryAfter(v string, now time.Time) time.Duration {
	v = strings.TrimSpace(v)
	if n, err := strconv.ParseInt(v, 10, 64); err == nil {
		if n < 0 || n > int64(maxRetryAfter/time.Second) {
			return 0
		}
		return time.Duration(n) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil {
		// A date centuries out saturates Sub at its largest Duration,
		// which rounding up wrapped to a negative wait ("none" to the
		// callers, who act on a positive one): cut at delay-seconds' bound.
		d := min(max(t.Sub(now), 0), maxRetryAfter)
		return (d + time.Second - 1) / time.Second * time.Second
	}
	return 0
}

// RetrySeconds is the wait err tells its client, in whole seconds (rounded
// up, at least 1): until the time it carries (errdefs.RetryAt: a version's
// crash back-off ends then); 0 when it carries none. The transports read
// it alike: HTTP as Retry-After, gRPC, which has no such header, in the
// message.
func RetrySeconds(err error, now time.Time) int64 {
	at := errdefs.RetryAt(err)
	if at.IsZero() {
		return 0
	}
	return max(1, int64((at.Sub(now)+time.Second-1)/time.Second))
}
