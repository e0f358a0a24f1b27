// Package gate admits a request's caller, for every transport alike: the
// bearer token, the scope and functions it grants, and the limits of its
// auth-file line (a token bucket of requests per second, requests in
// flight). HTTP and gRPC share one Gate, so a token's rate is one rate
// however the client connects.
package gate

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/time/rate"

	"github.com/plover-run/plover/apierr"
	"github.com/plover-run/plover/auth"
	"github.com/plover-run/plover/netguard"
	"github.com/plover-run/plover/pipedef"
)

// Tokens finds the principal of a bearer token (auth.Store).
type Tokens interface {
	Lookup(token []byte) *auth.Principal
}

// Gate checks tokens against the scope a request needs. A Gate without
// tokens lets everything through.
type Gate struct {
	tokens   Tokens
	failures *prometheus.CounterVec

	mu      sync.Mutex
	by      map[string]*state // by token name: a reload keeps what a token used
	streams map[string]int    // followed log streams open, by holder (Follow); none at 0
	limited *prometheus.CounterVec
}

// New returns a Gate over tokens (nil: no authentication), registering its
// counters on reg.
func New(tokens Tokens, reg prometheus.Registerer) *Gate {
	g := &Gate{tokens: tokens, by: map[string]*state{}, streams: map[string]int{}}
	g.failures = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "plover_auth_failures_total",
		Help: "Requests refused for authentication (missing_token, unknown_token) or authorization (forbidden).",
	}, []string{"reason"})
	g.limited = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "plover_token_limited_total",
		Help: "Requests refused with 429 because their token was over its auth-file rate or concurrency, or held as many followed log streams as it may, its concurrency or 32 (limit streams).",
	}, []string{"token", "limit"})
	if reg != nil {
		reg.MustRegister(g.failures, g.limited)
	}
	for _, r := range []string{"missing_token", "unknown_token", "forbidden"} {
		g.failures.WithLabelValues(r) // present at 0, so a rate() sees the first refusal
	}
	return g
}

// Open reports whether the gate checks nothing (no tokens).
func (g *Gate) Open() bool { return g.tokens == nil }

// Refusal is why a caller may not pass: its status on each transport, a
// reason for the log and the auth metrics, the message for the client and,
// when over a limit, how long until a retry can succeed.
type Refusal struct {
	Status apierr.Status
	Reason string // missing_token, unknown_token, forbidden, rate, concurrency, streams
	Msg    string
	Retry  time.Duration
}

func (r *Refusal) Error() string { return r.Msg }

// Ticket is an admitted request; Done ends it (its token's concurrency).
// A ticket Follow returned holds a followed stream's place instead.
type Ticket struct {
	st     *state
	name   string // a request's: its token's name ("" without tokens), Follow's holder
	g      *Gate  // a stream's: whose streams count it
	stream string // a stream's: its holder, the key of g.streams
}

// Done ends the request (or stream) the ticket admitted; a zero Ticket
// does nothing.
func (t Ticket) Done() {
	switch {
	case t.g != nil:
		t.g.mu.Lock()
		if t.g.streams[t.stream]--; t.g.streams[t.stream] <= 0 {
			delete(t.g.streams, t.stream) // bounded by the streams open, not by the clients ever seen
		}
		t.g.mu.Unlock()
	case t.st != nil:
		t.st.mu.Lock()
		t.st.inflight--
		t.st.mu.Unlock()
	}
}

// MaxStreams is how many followed log streams one token may hold open
// (without tokens, one client: netguard.ClientKey), whatever its
// concurrency. Without it only funclog's bounds held, 32 followers per
// function and 1,024 per node, and one read token of functions "*" could
// take 32 on each of 32 functions: every other tenant's follow was then
// refused.
const MaxStreams = 32

// Follow takes a place among the followed log streams of its holder, the
// token whose request t admitted (without tokens, the client at addr), for
// that request's stream, to hold until the stream ends (Done).
// A holder has MaxStreams places, or its token's concurrency if less.
// Streams are counted apart from requests in flight: a stream open for an
// hour is no request in flight, and a token of concurrency 1 following a
// function's output (the console does, while it polls) may still call;
// but it may hold no more streams than that, or one read token could take
// all of a function's followers. t's own place is given back as its
// handler returns, as any request's. Over the bound it is a 429, counted
// as limit "streams" for a token (not for a client: addresses are too
// many for a metric's labels).
func (g *Gate) Follow(t Ticket, addr net.Addr) (Ticket, *Refusal) {
	if t.g != nil {
		return Ticket{}, nil // a stream's own ticket holds its place already
	}
	// The name Admit found, not a second lookup: that hashes the token
	// again, and a reload since could have it find another answer.
	holder, who, token := netguard.ClientKey(addr), "client ", false
	if g.tokens != nil {
		holder, who, token = t.name, "token ", true
	}
	limit, bound := MaxStreams, fmt.Sprintf("the most one %smay", who)
	if st := t.st; st != nil {
		st.mu.Lock()
		if st.limit < limit {
			limit, bound = st.limit, "as many as its concurrency (auth file)"
		}
		st.mu.Unlock()
	}
	g.mu.Lock()
	full := g.streams[holder] >= limit
	if !full {
		g.streams[holder]++
	}
	g.mu.Unlock()
	if !full {
		return Ticket{g: g, stream: holder}, nil
	}
	if token {
		g.limited.WithLabelValues(holder, "streams").Inc()
	}
	return Ticket{}, &Refusal{Status: apierr.RateLimited, Reason: "streams", Retry: time.Second,
		Msg: fmt.Sprintf("%s%s has %d followed log streams open, %s: retry when one ends", who, holder, limit, bound)}
}

// Admit checks the value of an Authorization header (or gRPC's
// authorization metadata) for scope on function fn (empty for routes of no
// function), and takes one request of the token's limits. fn is only
// matched, never kept. A refusal is counted here.
func (g *Gate) Admit(authorization []byte, scope auth.Scope, fn string) (Ticket, *Refusal) {
	return g.check(authorization, scope, fn, limitRate|limitConcurrency)
}

// Hold admits a call from its headers alone, before its message is read
// (gRPC reads a whole message before any handler runs): the token must be
// known, the call is charged its rate, and it takes a place in the token's
// concurrency from then until the ticket is done, so that calls whose
// messages never come, or never decode (no handler, nor AdmitHeld, sees
// them), count against the token. AdmitHeld checks the rest once the
// message has arrived.
func (g *Gate) Hold(authorization []byte) (Ticket, *Refusal) {
	return g.check(authorization, 0, "", limitConcurrency|limitRate)
}

// AdmitHeld is Admit for a call Hold admitted: scope and function, its
// rate and its place in the token's concurrency taken already.
func (g *Gate) AdmitHeld(authorization []byte, scope auth.Scope, fn string) *Refusal {
	_, r := g.check(authorization, scope, fn, 0)
	return r
}

// AdmitHeldUnnamed is AdmitHeld for a call of scope that names no
// function (its handler refuses it, naming the field): the token and its
// scope, not its globs, which would read the empty name as a store-wide
// operation (403).
func (g *Gate) AdmitHeldUnnamed(authorization []byte, scope auth.Scope) *Refusal {
	_, r := g.check(authorization, scope, "", scopeOnly)
	return r
}

// Check is Admit without the limits: whether the caller authorization
// carries may still do scope on fn. For what outlives its admission: a
// followed log stream asks again as it runs, so that a token removed from
// the auth file, or narrowed away from the function, by a reload ends it.
// It takes nothing of the token's rate or concurrency; a refusal is counted.
func (g *Gate) Check(authorization []byte, scope auth.Scope, fn string) *Refusal {
	_, r := g.check(authorization, scope, fn, 0)
	return r
}

// The limits a check takes, and scopeOnly: the scope without the globs.
const (
	limitRate = 1 << iota
	limitConcurrency
	scopeOnly
)

// check is Admit, Hold and AdmitHeld: the token, then the scope on fn
// (none: scope 0), then the limits named.
func (g *Gate) check(authorization []byte, scope auth.Scope, fn string, limits int) (Ticket, *Refusal) {
	if g.tokens == nil {
		return Ticket{}, nil
	}
	p, r := g.principal(authorization)
	if r != nil {
		return Ticket{}, r
	}
	if scope != 0 {
		allow := p.Allow
		if limits&scopeOnly != 0 {
			allow = func(scope auth.Scope, _ string) error { return p.AllowScope(scope) }
		}
		if err := allow(scope, fn); err != nil {
			msg := err.Error()
			var d *auth.Denied
			if errors.As(err, &d) {
				msg = d.Msg
			}
			return Ticket{}, g.refuse(apierr.Forbidden, "forbidden", msg)
		}
	}
	if !p.Limits.Any() {
		return Ticket{name: p.Name}, nil
	}
	st, over, retry := g.admit(p, time.Now, limits)
	if over == "" {
		return Ticket{st: st, name: p.Name}, nil
	}
	g.limited.WithLabelValues(p.Name, over).Inc()
	secs := max(1, int(math.Ceil(retry.Seconds())))
	var msg string
	if over == "rate" {
		msg = fmt.Sprintf("token %s is over its rate of %g requests/s (burst %d, auth file): retry in %d s", p.Name, p.Limits.Rate, p.Limits.Burst, secs)
	} else {
		msg = fmt.Sprintf("token %s has its %d requests in flight (concurrency, auth file): retry when one ends", p.Name, p.Limits.Concurrency)
	}
	return Ticket{}, &Refusal{Status: apierr.RateLimited, Reason: over, Msg: msg, Retry: time.Duration(secs) * time.Second}
}

// principal is the token authorization carries, looked up once (a reload
// between two lookups could find it gone), or why there is none.
func (g *Gate) principal(authorization []byte) (*auth.Principal, *Refusal) {
	tok, ok := auth.BearerToken(authorization)
	if !ok {
		return nil, g.refuse(apierr.Unauthenticated, "missing_token", noBearer(authorization))
	}
	p := g.tokens.Lookup(tok)
	if p == nil {
		return nil, g.refuse(apierr.Unauthenticated, "unknown_token", "the bearer token is not known to this server")
	}
	return p, nil
}

// noBearer says what is wrong with an authorization that carries no
// bearer token, quoting nothing that may be a secret: a scheme is quoted
// only when it is a short word followed by more.
func noBearer(authorization []byte) string {
	const how = "send the header Authorization: Bearer TOKEN over HTTP, the metadata authorization: Bearer TOKEN over gRPC (plover --token or $PLOVER_TOKEN)"
	if len(authorization) == 0 {
		return "this server needs a token: " + how
	}
	cut := bytes.IndexAny(authorization, " \t")
	if cut < 0 {
		return "the authorization is one word, not a scheme and a token: " + how
	}
	scheme, rest := authorization[:cut], authorization[cut+1:]
	switch {
	case !bytes.EqualFold(scheme, []byte("bearer")) && len(scheme) <= 16 && isWord(scheme):
		return fmt.Sprintf("the authorization's scheme is %q; this server takes only bearer tokens: %s", scheme, how)
	case authorization[cut] == '\t':
		return "the authorization's scheme is followed by a tab; send one space: " + how
	case len(bytes.TrimSpace(rest)) == 0:
		return "the authorization's bearer token is empty: " + how
	}
	return "the authorization is not one bearer token (a token has no spaces or tabs): " + how
}

func isWord(b []byte) bool {
	for _, c := range b {
		if (c|0x20) < 'a' || (c|0x20) > 'z' {
			return false
		}
	}
	return len(b) > 0
}

func (g *Gate) refuse(s apierr.Status, reason, msg string) *Refusal {
	g.failures.WithLabelValues(reason).Inc()
	return &Refusal{Status: s, Reason: reason, Msg: msg}
}

// Sees is which function names the caller authorization carries may learn
// from a did-you-mean: those its token's globs match (auth's Covers: all
// for an admin token or functions "*", and all without tokens); none for a
// token this gate does not know. A token limited to its tenant's functions
// must not learn another tenant's names by mistyping one. Not counted as
// a refusal: the request was refused (or answered) already.
func (g *Gate) Sees(authorization []byte) func(function string) bool {
	return g.View(authorization).Sees
}

// Reads reports whether the caller authorization carries may read the
// server's state (a token of the read scope, deploy's or admin's; anyone
// without tokens): an open probe (/healthz) tells others only whether the
// server is healthy, not what its devices hold, which follows other
// tenants' loads. Not counted as a refusal: the probe is answered.
func (g *Gate) Reads(authorization []byte) bool {
	if g.tokens == nil {
		return true
	}
	tok, _ := auth.BearerToken(authorization)
	return g.tokens.Lookup(tok).AllowScope(auth.Read) == nil
}

// Tenant is whose a deploy by the caller authorization carries makes the
// version: its token's name (never the token), "" without tokens (every
// function one tenant). A token gone since Admit (the auth file reloaded)
// is refused, not taken for the empty tenant.
func (g *Gate) Tenant(authorization []byte) (string, *Refusal) {
	if g.tokens == nil {
		return "", nil
	}
	p, r := g.principal(authorization)
	if r != nil {
		return "", r
	}
	return p.Name, nil
}

// InvokeCheck is ctx carrying the check a pipeline's deploy or rollback
// makes of each function it names (pipedef.WithInvokeCheck): the caller's
// token must have invoke on it, or a pipeline would run what its deployer
// may not. Without tokens there is nothing to check.
func (g *Gate) InvokeCheck(ctx context.Context, authorization []byte) context.Context {
	if g.tokens == nil {
		return ctx
	}
	// Looked up at the first check, not here: an inference naming its
	// model's version carries the check (a pipeline's older version runs
	// under it) but seldom asks it, and a lookup hashes the token. The
	// check runs within its request, in one goroutine (its token's bytes
	// are the request's).
	var p *auth.Principal
	looked := false
	return pipedef.WithInvokeCheck(ctx, func(fn string) error {
		if !looked {
			tok, _ := auth.BearerToken(authorization)
			p, looked = g.tokens.Lookup(tok), true // Admit found it: the route needs a token
		}
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

// state is one token's use of its limits: its bucket
// (golang.org/x/time/rate) and its requests in flight.
type state struct {
	name     string
	mu       sync.Mutex
	bucket   *rate.Limiter // nil until the token first has a rate
	last     time.Time     // the latest time the bucket was given
	inflight int
	limit    int // the concurrency the token's last admission counted against: Follow's bound if less than MaxStreams
}

// Forget drops what the gate keeps for each token name has says is gone
// (a reload removed its line): its use of its limits and its
// plover_token_limited_total series, once nothing of it is in flight (one
// in flight is dropped at a later call). Kept, they outlived the token for
// the server's life, in every scrape.
func (g *Gate) Forget(has func(name string) bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for name, st := range g.by {
		if has(name) {
			continue
		}
		st.mu.Lock()
		idle := st.inflight == 0
		st.mu.Unlock()
		if idle {
			delete(g.by, name)
			g.limited.DeletePartialMatch(prometheus.Labels{"token": name})
		}
	}
}

func (g *Gate) state(name string) *state {
	g.mu.Lock()
	defer g.mu.Unlock()
	st := g.by[name]
	if st == nil {
		st = &state{name: name}
		g.by[name] = st
	}
	return st
}

// admit takes one request of p's at the time clock reads, of the limits
// named (limitRate, limitConcurrency). It returns the
// state whose done ends the request (nil when p has no concurrency limit),
// or, over a limit, which one and how long until a retry can succeed.
//
// The clock is read under the token's lock, and a time older than one the
// bucket has seen counts as that one: a bucket handed an earlier time
// than its last counts the interval between them twice (rate.Limiter
// moves its last update back), and requests racing to the lock carry
// times out of order.
func (g *Gate) admit(p *auth.Principal, clock func() time.Time, limits int) (st *state, over string, retry time.Duration) {
	lim := p.Limits
	if limits&limitRate == 0 {
		lim.Rate = 0
	}
	if limits&limitConcurrency == 0 {
		lim.Concurrency = 0
	}
	st = g.state(p.Name)
	st.mu.Lock()
	defer st.mu.Unlock()
	if lim.Concurrency > 0 && st.inflight >= lim.Concurrency {
		return nil, "concurrency", time.Second
	}
	if lim.Rate > 0 {
		now := clock()
		if now.Before(st.last) {
			now = st.last
		}
		st.last = now
		r := rate.Limit(lim.Rate)
		switch {
		case st.bucket == nil: // first use: a full bucket
			st.bucket = rate.NewLimiter(r, lim.Burst)
		case st.bucket.Limit() != r || st.bucket.Burst() != lim.Burst: // the auth file changed
			st.bucket.SetLimitAt(now, r)
			st.bucket.SetBurstAt(now, lim.Burst)
		}
		if !st.bucket.AllowN(now, 1) { // a refusal takes nothing: what it lacks says when to retry
			// In float, bounded: a slow rate's wait (rate=1e-10: 317
			// years) overflows a Duration, which came out negative.
			wait := (1 - st.bucket.TokensAt(now)) / lim.Rate * float64(time.Second)
			return nil, "rate", time.Duration(min(wait, float64(maxRetry)))
		}
	}
	if lim.Concurrency == 0 {
		return nil, "", 0
	}
	st.inflight++
	st.limit = lim.Concurrency
	return st, "", 0
}

// maxRetry bounds the wait a rate refusal tells (about 146 years): whole
// seconds of it still fit a Duration.
const maxRetry = time.Duration(1 << 62)
