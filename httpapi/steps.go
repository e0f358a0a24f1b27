package httpapi

import (
	"github.com/plover-run/plover/pipeline"
	"github.com/valyala/fasthttp"
)

// stepsSeen is which of a pipeline request's steps its caller may learn
// of (reqmetrics.StepShown); nil for a function's request (no steps, and
// err, if any, names none).
func (s *Server) stepsSeen(ctx *fasthttp.RequestCtx, c *exchange, err error) func(string) bool {
	if len(c.req.Steps) == 0 && !pipeline.AtStep(err) {
		return nil
	}
	return s.gate.Sees(ctx.Request.Header.PeekBytes(hdrAuthorization))
}
