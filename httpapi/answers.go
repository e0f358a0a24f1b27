package httpapi

// Error and JSON answers, written whole (an answer in pieces is pieces.go's).

import (
	"encoding/json"
	"strconv"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/plover-run/plover/apierr"
)

// fail writes the answer to a request that failed, other than an invoke
// (finish ends those): classified and logged by the front door.
func (s *Server) fail(ctx *fasthttp.RequestCtx, err error) {
	st, msg := s.door.Fail(err, "http", string(ctx.Path()), ctx.Request.Header.PeekBytes(hdrAuthorization))
	writeFailure(ctx, st, msg, err)
}

// writeFailure writes the answer to err, st and msg as the front door
// classified it, with Retry-After when err says when the same request may
// succeed (a crash back-off's end: apierr.RetrySeconds).
func writeFailure(ctx *fasthttp.RequestCtx, st apierr.Status, msg string, err error) {
	writeError(ctx, st.HTTP, st.Name, msg) // resets the response: headers after it
	if n := apierr.RetrySeconds(err, time.Now()); n > 0 {
		ctx.Response.Header.Set("Retry-After", strconv.FormatInt(n, 10))
	}
}

type errorBody struct {
	Error struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

// writeError writes Plover's error object, or under /v2 the protocol's:
// clients of the Open Inference Protocol read {"error": "..."} on every
// status there, refusals before routing (auth, method) included.
func writeError(ctx *fasthttp.RequestCtx, code int, name, msg string) {
	if isV2(ctx.Path()) {
		v2Error(ctx, code, msg)
		return
	}
	var e errorBody
	e.Error.Code, e.Error.Message = name, msg
	writeJSON(ctx, code, e)
}

func writeJSON(ctx *fasthttp.RequestCtx, code int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		code, b = fasthttp.StatusInternalServerError, []byte(`{"error":{"code":"internal","message":"encoding the response failed"}}`)
	}
	closing := ctx.Response.ConnectionClose() // a decision made before the error stands
	ctx.Response.Reset()
	if closing {
		ctx.Response.SetConnectionClose()
	}
	ctx.SetStatusCode(code)
	ctx.SetContentType("application/json")
	if code == fasthttp.StatusTooManyRequests {
		// Every 429 says when to retry (a caller that knows better, the
		// token limits, sets its own after).
		ctx.Response.Header.Set("Retry-After", "1")
	}
	ctx.SetBody(append(b, '\n'))
}
