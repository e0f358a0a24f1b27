package httpapi

// The deadline a request asks for in X-Plover-Timeout-Ms; "timeout_ms" in
// a JSON body is read the same way (parseInvoke).

import (
	"errors"
	"math"
	"strconv"
	"time"
	"unsafe"

	"github.com/valyala/fasthttp"
)

var hdrTimeout = []byte("X-Plover-Timeout-Ms")

// headerDeadline is the deadline X-Plover-Timeout-Ms asks for, or zero.
func headerDeadline(ctx *fasthttp.RequestCtx) (time.Time, error) {
	h := ctx.Request.Header.PeekBytes(hdrTimeout)
	if len(h) == 0 {
		return time.Time{}, nil
	}
	ms, err := strconv.ParseUint(unsafe.String(unsafe.SliceData(h), len(h)), 10, 64)
	if errors.Is(err, strconv.ErrRange) {
		ms, err = maxTimeoutMs, nil // cut to --max-timeout as any long one
	}
	if err != nil || ms == 0 {
		return time.Time{}, badField("X-Plover-Timeout-Ms", strconv.Quote(string(h))+" must be a positive number of milliseconds")
	}
	return time.Now().Add(timeoutOf(min(ms, maxTimeoutMs))), nil
}

// maxTimeoutMs is the most milliseconds a request's timeout is read as:
// past it a time.Duration would overflow, and any timeout longer than the
// server's --max-timeout is cut to it anyway.
const maxTimeoutMs = uint64(math.MaxInt64 / int64(time.Millisecond))

// timeoutOf is ms milliseconds (at most maxTimeoutMs) as a duration.
func timeoutOf(ms uint64) time.Duration { return time.Duration(ms) * time.Millisecond }
