package httpapi

import (
	"fmt"
	"math"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/valyala/fasthttp"

	"github.com/plover-run/plover/auth"
)

// tokenLimits enforces each token's auth-file limits: a token bucket of
// rate requests per second holding up to burst, and at most concurrency
// requests in flight. State is kept by token name, so a reload of the auth
// file (new limits, the same name) keeps what the token has used.
type tokenLimits struct {
	mu      sync.Mutex
	by      map[string]*tokenState
	limited *prometheus.CounterVec
}

type tokenState struct {
	mu       sync.Mutex
	tokens   float64
	last     time.Time
	inflight int
}

func newTokenLimits(reg prometheus.Registerer) *tokenLimits {
	c := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "plover_token_limited_total",
		Help: "Requests refused with 429 because their token was over its auth-file rate or concurrency.",
	}, []string{"token", "limit"})
	reg.MustRegister(c)
	return &tokenLimits{by: map[string]*tokenState{}, limited: c}
}

func (l *tokenLimits) state(name string) *tokenState {
	l.mu.Lock()
	defer l.mu.Unlock()
	st := l.by[name]
	if st == nil {
		st = &tokenState{tokens: -1}
		l.by[name] = st
	}
	return st
}

// admit takes one request of p's at now. It returns the state whose done
// ends the request (nil when p has no concurrency limit), or, over a
// limit, which one and how long until a retry can succeed.
func (l *tokenLimits) admit(p *auth.Principal, now time.Time) (st *tokenState, over string, retry time.Duration) {
	lim := p.Limits
	st = l.state(p.Name)
	st.mu.Lock()
	defer st.mu.Unlock()
	if lim.Concurrency > 0 && st.inflight >= lim.Concurrency {
		return nil, "concurrency", time.Second
	}
	if lim.Rate > 0 {
		if st.tokens < 0 { // first use: a full bucket
			st.tokens, st.last = float64(lim.Burst), now
		}
		st.tokens = math.Min(float64(lim.Burst), st.tokens+now.Sub(st.last).Seconds()*lim.Rate)
		st.last = now
		if st.tokens < 1 {
			return nil, "rate", time.Duration((1 - st.tokens) / lim.Rate * float64(time.Second))
		}
		st.tokens--
	}
	if lim.Concurrency == 0 {
		return nil, "", 0
	}
	st.inflight++
	return st, "", 0
}

// done ends a request admitted under a concurrency limit.
func (st *tokenState) done() {
	st.mu.Lock()
	st.inflight--
	st.mu.Unlock()
}

// limit admits a request of p's, or writes 429 with Retry-After (whole
// seconds, at least 1) and returns false.
func (s *Server) limit(ctx *fasthttp.RequestCtx, p *auth.Principal) (*tokenState, bool) {
	st, over, retry := s.limits.admit(p, time.Now())
	if over == "" {
		return st, true
	}
	s.limits.limited.WithLabelValues(p.Name, over).Inc()
	secs := max(1, int(math.Ceil(retry.Seconds())))
	var msg string
	if over == "rate" {
		msg = fmt.Sprintf("token %s is over its rate of %g requests/s (burst %d, auth file): retry in %d s", p.Name, p.Limits.Rate, p.Limits.Burst, secs)
	} else {
		msg = fmt.Sprintf("token %s has its %d requests in flight (concurrency, auth file): retry when one ends", p.Name, p.Limits.Concurrency)
	}
	writeError(ctx, fasthttp.StatusTooManyRequests, "rate_limited", msg)
	ctx.Response.Header.Set("Retry-After", strconv.Itoa(secs))
	return nil, false
}
