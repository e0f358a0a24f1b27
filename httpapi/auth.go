package httpapi

import (
	"bytes"
	"context"
	"strconv"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/plover-run/plover/auth"
	"github.com/plover-run/plover/call"
	"github.com/plover-run/plover/gate"
	"github.com/plover-run/plover/pipedef"
)

// need is what a route requires: a scope and, for invoke and deploy, the
// function it acts on. open routes (the probes) require nothing.
type need struct {
	scope auth.Scope
	fn    call.Name // the path's bytes, borrowed
	open  bool
	// shows: open to a caller that sends no token (a probe); one that
	// sends one is admitted as any route's caller (known, within its
	// limits: scope 0), since what the route shows depends on the token
	// (/healthz: Gate.Reads). Answered open, it told anyone whether a
	// token was valid, uncounted and unlogged, and let a token past its
	// rate poll the devices' state (a review's probe).
	shows bool
}

var (
	hdrAuthorization = []byte("Authorization")
	pathHealthz      = []byte("/healthz")
	pathReadyz       = []byte("/readyz")
)

// required is the scope a request needs, from its method and path. It
// mirrors Handle's routes; a route Handle does not know needs read (and
// then gets its 404), so an unauthenticated client learns nothing of it.
func required(method, path []byte) need {
	switch {
	case bytes.Equal(path, pathHealthz):
		return need{open: true, shows: true}
	case bytes.Equal(path, pathReadyz):
		return need{open: true}
	case bytes.HasPrefix(path, []byte("/v2/health/")), bytes.Equal(path, pathV2), bytes.Equal(path, []byte("/v2/")):
		return need{open: true} // probes and server metadata, as /healthz
	case bytes.HasPrefix(path, pathRepository):
		// Load and unload change what the node serves: admin, as the
		// extension's control of a whole server; the index is a listing.
		if _, _, ok := repositoryAction(path); ok {
			return need{scope: auth.Admin}
		}
		return need{scope: auth.Read}
	case bytes.HasPrefix(path, []byte("/v2/models/")):
		// The route's own parser: "/infer" at the end of a path is not
		// always the infer action (a model named infer).
		if name, _, action, ok := parseV2Model(path[len("/v2/models/"):]); ok && action == "infer" {
			return need{scope: auth.Invoke, fn: name}
		}
		return need{scope: auth.Read}
	case bytes.Equal(path, []byte("/v1/gc")):
		return need{scope: auth.Deploy}
	case bytes.HasPrefix(path, pathFunctions) && len(path) > len(pathFunctions)+1 && path[len(pathFunctions)] == '/':
		rest := path[len(pathFunctions)+1:]
		if name, ok := bytes.CutSuffix(rest, suffixInvoke); ok && bytes.IndexByte(name, '/') < 0 {
			return need{scope: auth.Invoke, fn: call.BorrowName(name)}
		}
		if name, sub, ok := bytes.Cut(rest, []byte{'/'}); ok {
			if string(sub) == "rollback" {
				return need{scope: auth.Deploy, fn: call.BorrowName(name)}
			}
			if string(sub) == "logs" { // its output is the tenant's data
				return need{scope: auth.Read, fn: call.BorrowName(name)}
			}
			return need{scope: auth.Read}
		}
		if string(method) == fasthttp.MethodPut || string(method) == fasthttp.MethodDelete {
			return need{scope: auth.Deploy, fn: call.BorrowName(rest)}
		}
	}
	return need{scope: auth.Read}
}

// authorize lets the request through, or writes 401 (no or unknown token),
// 403 (the token lacks the scope or the function) or 429 (the token is
// over its limits) and returns false. The ticket it returns must be done
// when the request ends (the token's concurrency).
func (s *Server) authorize(ctx *fasthttp.RequestCtx) (gate.Ticket, bool) {
	n := required(ctx.Method(), ctx.Path())
	authorization := ctx.Request.Header.PeekBytes(hdrAuthorization)
	if n.open && (!n.shows || len(authorization) == 0) {
		return gate.Ticket{}, true
	}
	// The name is only matched against globs, not kept: no copy.
	tk, r := s.gate.Admit(authorization, n.scope, n.fn.Borrow())
	if r != nil {
		s.refuse(ctx, r)
		return tk, false
	}
	return tk, true
}

// runCheck is the context an inference pins its model's version in: with
// a version named, the caller's invoke check, which a pipeline's version
// other than its current one runs under (oip.PinVersion); none else (a
// request's current version asks nothing more, and pays nothing more).
func (s *Server) runCheck(ctx *fasthttp.RequestCtx, version string) context.Context {
	if version == "" {
		return context.Background()
	}
	return s.gate.InvokeCheck(context.Background(), ctx.Request.Header.PeekBytes(hdrAuthorization))
}

// invokeCheck is ctx carrying the check a pipeline's deploy or rollback
// makes of each function it names (gate.InvokeCheck), and the pipelines
// its caller may learn of, which its warnings and refusals name
// (pipedef.WithSees).
func (s *Server) invokeCheck(ctx *fasthttp.RequestCtx) context.Context {
	c := s.gate.InvokeCheck(callCtx(ctx), ctx.Request.Header.PeekBytes(hdrAuthorization))
	return pipedef.WithSees(c, s.view(ctx).Sees)
}

// refuse writes a gate's refusal: 401 with WWW-Authenticate, 403, or 429
// with Retry-After (whole seconds, at least 1). Authentication failures
// are logged, once a second per client at most.
func (s *Server) refuse(ctx *fasthttp.RequestCtx, r *gate.Refusal) {
	code := r.Status.HTTP
	writeError(ctx, code, r.Status.Name, r.Msg) // resets the response: headers after it
	switch code {
	case fasthttp.StatusUnauthorized:
		ctx.Response.Header.Set("WWW-Authenticate", `Bearer realm="plover"`)
	case fasthttp.StatusTooManyRequests:
		ctx.Response.Header.Set("Retry-After", strconv.Itoa(max(1, int(r.Retry/time.Second))))
		return // a client over its limits is counted, not logged
	}
	if ok, unlogged := s.authLog.Allow(ctx.RemoteAddr()); ok {
		attrs := []any{"reason", r.Reason, "client", ctx.RemoteIP().String(),
			"method", string(ctx.Method()), "path", string(ctx.Path()), "status", code}
		if unlogged > 0 {
			attrs = append(attrs, "not_logged", unlogged) // refusals the log's cap held back before this one
		}
		s.opts.Log.Warn("request refused", attrs...)
	}
}
