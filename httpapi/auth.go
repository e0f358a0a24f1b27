package httpapi

import (
	"bytes"
	"context"
	"errors"
	"net"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/valyala/fasthttp"

	"github.com/plover-run/plover/auth"
	"github.com/plover-run/plover/pipeline/graph"
)

// Tokens finds the principal of a bearer token (auth.Store).
type Tokens interface {
	Lookup(token []byte) *auth.Principal
}

// need is what a route requires: a scope and, for invoke and deploy, the
// function it acts on. open routes (the probes) require nothing.
type need struct {
	scope auth.Scope
	fn    string // aliases the request's path: used while the request lives
	open  bool
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
	case bytes.Equal(path, pathHealthz), bytes.Equal(path, pathReadyz):
		return need{open: true}
	case bytes.HasPrefix(path, []byte("/v2/health/")), bytes.Equal(path, pathV2), bytes.Equal(path, []byte("/v2/")):
		return need{open: true} // probes and server metadata, as /healthz
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
			return need{scope: auth.Invoke, fn: b2s(name)}
		}
		if name, sub, ok := bytes.Cut(rest, []byte{'/'}); ok {
			if string(sub) == "rollback" {
				return need{scope: auth.Deploy, fn: b2s(name)}
			}
			return need{scope: auth.Read}
		}
		if string(method) == fasthttp.MethodPut || string(method) == fasthttp.MethodDelete {
			return need{scope: auth.Deploy, fn: b2s(rest)}
		}
	}
	return need{scope: auth.Read}
}

// authorize lets the request through, or writes 401 (no or unknown token),
// 403 (the token lacks the scope or the function) or 429 (the token is
// over its limits) and returns false. The state it returns, if any, must
// be done when the request ends (the token's concurrency).
func (s *Server) authorize(ctx *fasthttp.RequestCtx) (*tokenState, bool) {
	n := required(ctx.Method(), ctx.Path())
	if n.open {
		return nil, true
	}
	tok, ok := auth.BearerToken(ctx.Request.Header.PeekBytes(hdrAuthorization))
	if !ok {
		s.refuse(ctx, "missing_token", fasthttp.StatusUnauthorized, "unauthenticated",
			"this server needs a token: send Authorization: Bearer TOKEN (plover --token or $PLOVER_TOKEN)")
		return nil, false
	}
	p := s.opts.Tokens.Lookup(tok)
	if p == nil {
		s.refuse(ctx, "unknown_token", fasthttp.StatusUnauthorized, "unauthenticated", "the bearer token is not known to this server")
		return nil, false
	}
	// The name is only matched against globs, not kept: no copy.
	fn := n.fn
	if err := p.Allow(n.scope, fn); err != nil {
		var d *auth.Denied
		msg := err.Error()
		if errors.As(err, &d) {
			msg = d.Msg
		}
		s.refuse(ctx, "forbidden", fasthttp.StatusForbidden, "forbidden", msg)
		return nil, false
	}
	if p.Limits.Any() {
		return s.limit(ctx, p)
	}
	return nil, true
}

// invokeCheck is ctx carrying the check a pipeline's deploy or rollback
// makes of each function it names (graph.WithInvokeCheck): the token must
// have invoke on it, or a pipeline would run what its deployer may not.
// Without tokens there is nothing to check.
func (s *Server) invokeCheck(ctx *fasthttp.RequestCtx) context.Context {
	if s.opts.Tokens == nil {
		return ctx
	}
	tok, _ := auth.BearerToken(ctx.Request.Header.PeekBytes(hdrAuthorization))
	p := s.opts.Tokens.Lookup(tok) // authorize found it: the route needs a token
	return graph.WithInvokeCheck(ctx, func(fn string) error {
		if p == nil {
			return errors.New("no token")
		}
		err := p.Allow(auth.Invoke, fn)
		var d *auth.Denied
		if errors.As(err, &d) {
			return errors.New(d.Msg)
		}
		return err
	})
}

func (s *Server) refuse(ctx *fasthttp.RequestCtx, reason string, code int, name, msg string) {
	s.authFailures.WithLabelValues(reason).Inc()
	writeError(ctx, code, name, msg) // resets the response: headers after it
	if code == fasthttp.StatusUnauthorized {
		ctx.Response.Header.Set("WWW-Authenticate", `Bearer realm="plover"`)
	}
	if s.authLog.allow(ctx.RemoteIP()) {
		s.opts.Log.Warn("request refused", "reason", reason, "client", ctx.RemoteIP().String(),
			"method", string(ctx.Method()), "path", string(ctx.Path()), "status", code)
	}
}

func newAuthFailures(reg prometheus.Registerer) *prometheus.CounterVec {
	c := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "plover_auth_failures_total",
		Help: "Requests refused for authentication (missing_token, unknown_token) or authorization (forbidden).",
	}, []string{"reason"})
	reg.MustRegister(c)
	for _, r := range []string{"missing_token", "unknown_token", "forbidden"} {
		c.WithLabelValues(r) // present at 0, so a rate() sees the first refusal
	}
	return c
}

// perClient lets a log line through at most once a second per client
// address, so a client hammering with bad tokens cannot flood the log.
type perClient struct {
	mu   sync.Mutex
	last map[string]time.Time
}

func (p *perClient) allow(ip net.IP) bool {
	now := time.Now()
	key := string(ip)
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.last == nil || len(p.last) > 4096 {
		p.last = map[string]time.Time{} // bounded: forget everyone at once
	}
	if t, ok := p.last[key]; ok && now.Sub(t) < time.Second {
		return false
	}
	p.last[key] = now
	return true
}
