package gate

import (
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc/codes"

	"github.com/plover-run/plover/apierr"
	"github.com/plover-run/plover/auth"
)

// The token bucket over explicit times: a full burst at first, then the
// rate, and the wait a refused request is told; concurrency counts
// requests until done.
func TestTokenLimitsAdmit(t *testing.T) {
	l := New(nil, prometheus.NewRegistry())
	p := &auth.Principal{Name: "t", Limits: auth.Limits{Rate: 4, Burst: 2}}
	t0 := time.Unix(1000, 0)
	steps := []struct {
		at    time.Duration
		over  string
		retry time.Duration
	}{
		{0, "", 0}, {0, "", 0}, // the burst
		{0, "rate", 250 * time.Millisecond}, // empty: a token in 1/4 s
		{100 * time.Millisecond, "rate", 150 * time.Millisecond},
		{250 * time.Millisecond, "", 0},        // refilled one
		{time.Hour, "", 0}, {time.Hour, "", 0}, // refills to the burst, not beyond
		{time.Hour, "rate", 250 * time.Millisecond},
	}
	for i, st := range steps {
		_, over, retry := l.admit(p, at(t0.Add(st.at)), limitRate|limitConcurrency)
		if over != st.over || (over != "" && (retry < st.retry-time.Millisecond || retry > st.retry+time.Millisecond)) {
			t.Fatalf("step %d at %v: over %q retry %v; want %q %v", i, st.at, over, retry, st.over, st.retry)
		}
	}
	c := &auth.Principal{Name: "c", Limits: auth.Limits{Concurrency: 2}}
	a, _, _ := l.admit(c, at(t0), limitRate|limitConcurrency)
	b, _, _ := l.admit(c, at(t0), limitRate|limitConcurrency)
	if _, over, _ := l.admit(c, at(t0), limitRate|limitConcurrency); over != "concurrency" {
		t.Fatalf("third in flight: over %q", over)
	}
	Ticket{st: a}.Done()
	if _, over, _ := l.admit(c, at(t0), limitRate|limitConcurrency); over != "" {
		t.Fatalf("after one ended: over %q", over)
	}
	Ticket{st: b}.Done()
}

// A followed stream's place (Follow) is counted apart from the token's
// requests in flight, up to its concurrency: the request that opened it
// gives its own place back and the token calls on; a second stream is
// refused (limit streams) until the first is done.
func TestFollow(t *testing.T) {
	reg := prometheus.NewRegistry()
	g := New(table{"c-secret": {Name: "c", Scopes: auth.Read, Limits: auth.Limits{Concurrency: 1}}}, reg)
	bearer := []byte("Bearer c-secret")
	admit := func() Ticket {
		t.Helper()
		tk, r := g.Admit(bearer, auth.Read, "f")
		if r != nil {
			t.Fatalf("a call: %v", r)
		}
		return tk
	}
	req := admit()
	stream, r := g.Follow(req, nil)
	if r != nil {
		t.Fatalf("the first stream: %v", r)
	}
	req.Done() // its handler returns
	req2 := admit()
	if _, r := g.Follow(req2, nil); r == nil || r.Reason != "streams" || r.Status != apierr.RateLimited || !strings.Contains(r.Msg, "1 followed log streams open") {
		t.Fatalf("a second stream: %+v, want 429 naming the streams", r)
	}
	if n := testutil.ToFloat64(g.limited.WithLabelValues("c", "streams")); n != 1 {
		t.Errorf("plover_token_limited_total{limit=streams}: %v, want 1", n)
	}
	req2.Done()
	stream.Done() // its stream's place, not a request's (checked below)
	req3 := admit()
	if again, r := g.Follow(req3, nil); r != nil {
		t.Fatalf("a stream after the first ended: %v", r)
	} else {
		again.Done()
	}
	if req3.st.inflight != 1 || len(g.streams) != 0 {
		t.Errorf("in flight %d, streams %v; want 1 and none", req3.st.inflight, g.streams)
	}
	req3.Done()
}

// Every holder of followed streams has MaxStreams places, with or without
// a concurrency limit: a token of none (its ticket holds no place), or
// each client of a server without tokens. Before, only a token's
// concurrency bounded them, and one read token of functions "*" could
// hold 32 on each of 32 functions, the 1,024 a node serves: every other
// tenant's follow was refused. The refusal names the token, never the
// token itself, or the client; another holder still follows, and the
// places go back as streams end.
func TestFollowBoundsEveryHolder(t *testing.T) {
	for _, tc := range []struct {
		name          string
		tokens        Tokens
		auth, other   string
		addr, another net.Addr
		says          string
	}{
		{"a token without limits", table{"s3cr3t-wide": {Name: "wide", Scopes: auth.Read}, "s3cr3t-other": {Name: "other", Scopes: auth.Read}},
			"Bearer s3cr3t-wide", "Bearer s3cr3t-other", nil, nil, "token wide has 32 followed log streams open"},
		{"a client without tokens", nil, "", "",
			&net.TCPAddr{IP: net.IPv4(10, 0, 0, 1), Port: 5000}, &net.TCPAddr{IP: net.IPv4(10, 0, 0, 2), Port: 5000},
			"client 10.0.0.1 has 32 followed log streams open"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := New(tc.tokens, prometheus.NewRegistry())
			conns := 0
			follow := func(authorization string, addr net.Addr) (Ticket, *Refusal) {
				// The port differs each time, as each connection's does.
				if a, ok := addr.(*net.TCPAddr); ok {
					conns++
					addr = &net.TCPAddr{IP: a.IP, Port: a.Port + conns}
				}
				req, r := g.Admit([]byte(authorization), auth.Read, "f")
				if r != nil {
					t.Fatalf("a call: %v", r)
				}
				defer req.Done()
				return g.Follow(req, addr)
			}
			var held []Ticket
			for i := range MaxStreams {
				tk, r := follow(tc.auth, tc.addr)
				if r != nil {
					t.Fatalf("stream %d of %d: %v", i+1, MaxStreams, r)
				}
				held = append(held, tk)
			}
			_, r := follow(tc.auth, tc.addr)
			if r == nil || r.Reason != "streams" || r.Status != apierr.RateLimited || !strings.Contains(r.Msg, tc.says) {
				t.Fatalf("stream %d: %+v, want 429 saying %q", MaxStreams+1, r, tc.says)
			}
			if strings.Contains(r.Msg, "s3cr3t") {
				t.Fatalf("the refusal quotes the token: %q", r.Msg)
			}
			if other, r := follow(tc.other, tc.another); r != nil {
				t.Fatalf("another holder was refused: %v", r)
			} else {
				other.Done()
			}
			held[0].Done()
			if again, r := follow(tc.auth, tc.addr); r != nil {
				t.Fatalf("a stream after one ended: %v", r)
			} else {
				held[0] = again
			}
			for _, tk := range held {
				tk.Done()
			}
			if len(g.streams) != 0 {
				t.Errorf("with every stream ended the gate still counts %v", g.streams)
			}
		})
	}
}

// at is a clock stopped at t.
func at(t time.Time) func() time.Time { return func() time.Time { return t } }

// A bucket handed times out of order (requests racing to its lock read
// the clock before they get it) admits no more than burst + rate*T over
// any span T. Before, an earlier time made the elapsed time negative, the
// count fell below zero and was taken for a first use: a full burst.
func TestBucketOutOfOrderTimes(t *testing.T) {
	for _, tc := range []struct {
		name        string
		rate        float64
		burst       int
		jitter      time.Duration // how far back a time may be
		step, total time.Duration
	}{
		{"small jitter", 200, 200, 50 * time.Microsecond, 100 * time.Microsecond, 6 * time.Second},
		{"large jitter", 500, 5000, 30 * time.Millisecond, 20 * time.Microsecond, 2 * time.Second},
		{"burst of one", 10, 1, time.Millisecond, 10 * time.Microsecond, time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := New(nil, prometheus.NewRegistry())
			p := &auth.Principal{Name: "t", Limits: auth.Limits{Rate: tc.rate, Burst: tc.burst}}
			t0 := time.Unix(1000, 0)
			admitted := 0
			for i, now := 0, time.Duration(0); now < tc.total; i, now = i+1, now+tc.step {
				back := time.Duration(i*7919%101) * tc.jitter / 100 // a deterministic scatter of earlier times
				if _, over, _ := g.admit(p, at(t0.Add(now-back)), limitRate); over == "" {
					admitted++
				}
			}
			if limit := tc.burst + int(tc.rate*tc.total.Seconds()); admitted > limit {
				t.Fatalf("admitted %d in %v, over burst + rate*T = %d", admitted, tc.total, limit)
			}
			if admitted < tc.burst {
				t.Fatalf("admitted %d, fewer than the burst %d", admitted, tc.burst)
			}
		})
	}
}

// The same bound through Admit on the real clock, 64 clients at once.
func TestBucketBoundUnderConcurrency(t *testing.T) {
	p := &auth.Principal{Name: "app", Scopes: auth.Invoke, Functions: []string{"*"}, Limits: auth.Limits{Rate: 200, Burst: 200}}
	g := New(table{"tok": p}, prometheus.NewRegistry())
	const clients, each = 64, 400
	var admitted atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range each {
				if _, r := g.Admit([]byte("Bearer tok"), auth.Invoke, "f"); r == nil {
					admitted.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	limit := p.Limits.Burst + int(p.Limits.Rate*elapsed.Seconds()) + 1
	if n := int(admitted.Load()); n > limit || n < p.Limits.Burst {
		t.Fatalf("%d clients x %d requests in %v: admitted %d, want %d..%d (burst .. burst + rate*T)", clients, each, elapsed, n, p.Limits.Burst, limit)
	}
}

type table map[string]*auth.Principal

func (t table) Lookup(tok []byte) *auth.Principal { return t[string(tok)] }

// Admit's answers: each refusal's class, reason and status on both
// transports, from the header alone.
func TestAdmit(t *testing.T) {
	tokens := table{
		"reader":  {Name: "reader", Scopes: auth.Read},
		"invoker": {Name: "invoker", Scopes: auth.Invoke, Functions: []string{"cnn*"}},
		"slow":    {Name: "slow", Scopes: auth.Invoke, Limits: auth.Limits{Rate: 0.001, Burst: 1}},
	}
	g := New(tokens, prometheus.NewRegistry())
	for _, tc := range []struct {
		name, header string
		scope        auth.Scope
		fn           string
		reason       string // "": admitted
		http         int
		grpc         codes.Code
		msg          string // in the refusal's message
	}{
		{"no header", "", auth.Read, "", "missing_token", 401, codes.Unauthenticated, "needs a token"},
		{"not bearer", "Basic eDp5", auth.Read, "", "missing_token", 401, codes.Unauthenticated, `scheme is "Basic"`},
		{"a token alone", "s3cr3t-token", auth.Read, "", "missing_token", 401, codes.Unauthenticated, "one word"},
		{"bearer, empty", "Bearer  ", auth.Read, "", "missing_token", 401, codes.Unauthenticated, "empty"},
		{"bearer, then a tab", "Bearer\tsecret", auth.Read, "", "missing_token", 401, codes.Unauthenticated, "a tab"},
		{"bearer, two words", "Bearer ab cd", auth.Read, "", "missing_token", 401, codes.Unauthenticated, "no spaces or tabs"},
		{"a long scheme is not quoted", "eDp5eDp5eDp5eDp5eDp5eDp5 x", auth.Read, "", "missing_token", 401, codes.Unauthenticated, "no spaces or tabs"},
		{"unknown", "Bearer nobody", auth.Read, "", "unknown_token", 401, codes.Unauthenticated, ""},
		{"read", "Bearer reader", auth.Read, "", "", 0, 0, ""},
		{"read cannot invoke", "Bearer reader", auth.Invoke, "cnn", "forbidden", 403, codes.PermissionDenied, ""},
		{"invoke in glob", "Bearer invoker", auth.Invoke, "cnn-large", "", 0, 0, ""},
		{"invoke outside glob", "Bearer invoker", auth.Invoke, "vecadd", "forbidden", 403, codes.PermissionDenied, ""},
		{"rate: the burst", "Bearer slow", auth.Invoke, "x", "", 0, 0, ""},
		{"rate: over", "Bearer slow", auth.Invoke, "x", "rate", 429, codes.ResourceExhausted, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tk, r := g.Admit([]byte(tc.header), tc.scope, tc.fn)
			defer tk.Done()
			switch {
			case tc.reason == "" && r != nil:
				t.Fatalf("refused: %v", r)
			case tc.reason == "":
			case r == nil:
				t.Fatalf("admitted, want %s", tc.reason)
			case r.Reason != tc.reason || r.Status.HTTP != tc.http || r.Status.GRPC != tc.grpc || r.Msg == "" || !strings.Contains(r.Msg, tc.msg):
				t.Fatalf("refusal %+v, want %s %d %v saying %q", r, tc.reason, tc.http, tc.grpc, tc.msg)
			case tc.reason == "missing_token" && (strings.Contains(r.Msg, "eDp5") || strings.Contains(r.Msg, "s3cr3t")):
				t.Fatalf("a refusal quoted what may be a secret: %q", r.Msg)
			case tc.reason == "rate" && (r.Retry < time.Second || !strings.Contains(r.Msg, "retry in")):
				t.Fatalf("a rate refusal without its retry delay: %+v", r)
			}
		})
	}
	if tk, r := New(nil, prometheus.NewRegistry()).Admit(nil, auth.Deploy, "x"); r != nil {
		t.Fatalf("a gate without tokens refused: %v", r)
	} else {
		tk.Done()
	}
}

// Check asks again what Admit asked, for a request already admitted (a
// followed log stream): the token, its scope and its functions, as the
// auth file holds them now; it takes nothing of the token's rate or
// concurrency, however often it is asked.
func TestCheckTakesNoLimits(t *testing.T) {
	const tok = "a-token-for-check"
	line := auth.Line("dash", auth.Read, auth.Hash(tok), []string{"f"}, auth.Limits{Rate: 1, Burst: 1, Concurrency: 1})
	table, err := auth.Parse(strings.NewReader(line+"\n"), "tokens")
	if err != nil {
		t.Fatal(err)
	}
	g := New(table, prometheus.NewRegistry())
	bearer := []byte("Bearer " + tok)
	tk, r := g.Admit(bearer, auth.Read, "f") // the burst and the one place
	if r != nil {
		t.Fatal(r)
	}
	defer tk.Done()
	for i := range 5 {
		if r := g.Check(bearer, auth.Read, "f"); r != nil {
			t.Fatalf("check %d of an admitted token with its limits spent: %v", i, r)
		}
	}
	for _, c := range []struct {
		name          string
		authorization []byte
		scope         auth.Scope
		fn            string
		reason        string
	}{
		{"another function", bearer, auth.Read, "g", "forbidden"},
		{"a scope it lacks", bearer, auth.Deploy, "f", "forbidden"},
		{"an unknown token", []byte("Bearer not-this-one"), auth.Read, "f", "unknown_token"},
		{"no token", nil, auth.Read, "f", "missing_token"},
	} {
		if r := g.Check(c.authorization, c.scope, c.fn); r == nil || r.Reason != c.reason {
			t.Errorf("%s: %v, want %s", c.name, r, c.reason)
		}
	}
}

// A token with a very slow rate (the auth file takes any rate above 0)
// is told the wait it has, however long: rate=1e-10 overflowed the
// duration, the wait came out negative, and the 429 said "retry in 1 s"
// (Retry-After: 1) to a client that would be refused for centuries.
func TestSlowRateRetry(t *testing.T) {
	g := New(table{
		"frozen": {Name: "frozen", Scopes: auth.Invoke, Limits: auth.Limits{Rate: 1e-10, Burst: 1}},
	}, prometheus.NewRegistry())
	if tk, r := g.Admit([]byte("Bearer frozen"), auth.Invoke, "x"); r != nil {
		t.Fatalf("the burst refused: %v", r)
	} else {
		tk.Done()
	}
	_, r := g.Admit([]byte("Bearer frozen"), auth.Invoke, "x")
	if r == nil || r.Reason != "rate" {
		t.Fatalf("over the rate: %+v, want a rate refusal", r)
	}
	if year := 365 * 24 * time.Hour; r.Retry < year || strings.Contains(r.Msg, "retry in 1 s") {
		t.Fatalf("over a rate of one request per 317 years: retry %v (%q), want a year or more", r.Retry, r.Msg)
	}
}

// A token a reload removed leaves nothing behind once idle: its limits'
// state and its plover_token_limited_total series go; one still in flight
// stays until a later call; those the table holds are kept.
func TestForgetDropsRemovedTokens(t *testing.T) {
	reg := prometheus.NewRegistry()
	lim := auth.Limits{Concurrency: 1}
	g := New(table{"a-secret": {Name: "a", Scopes: auth.Invoke, Limits: lim}, "b-secret": {Name: "b", Scopes: auth.Invoke, Limits: lim}}, reg)
	for _, tok := range []string{"a", "b"} {
		tk, r := g.Admit([]byte("Bearer "+tok+"-secret"), auth.Invoke, "f")
		if r != nil {
			t.Fatal(r)
		}
		if _, r := g.Admit([]byte("Bearer "+tok+"-secret"), auth.Invoke, "f"); r == nil {
			t.Fatalf("%s: a second call past its concurrency was admitted", tok)
		}
		if tok == "a" {
			tk.Done()
		} else {
			defer tk.Done()
		}
	}
	series := func() int { return testutil.CollectAndCount(g.limited) }
	if n := series(); n != 2 {
		t.Fatalf("%d series before, want a's and b's", n)
	}
	g.Forget(func(string) bool { return false }) // both removed; b's call still in flight
	if _, ok := g.by["a"]; ok || series() != 1 {
		t.Errorf("after the reload: a's state kept %v, %d series; want a's gone, b's (in flight) kept", ok, series())
	}
	g.Forget(func(name string) bool { return name == "b" })
	if _, ok := g.by["b"]; !ok || series() != 1 {
		t.Errorf("b still in the table: state kept %v, %d series; want both kept", ok, series())
	}
}
