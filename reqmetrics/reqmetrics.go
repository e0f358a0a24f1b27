// Package reqmetrics counts invoke requests by function and outcome and
// times their phases, for every transport alike: a request over gRPC is
// counted under the HTTP status of its outcome's class (apierr), so one
// dashboard reads both.
package reqmetrics

import (
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/plover-run/plover/call"
	"github.com/plover-run/plover/errdefs"
)

// Metrics counts requests by function and status and times their
// phases. Series are resolved once per function and status, so recording a
// request allocates nothing. Functions are labelled through a Table of
// 1,000 names; Forget gives a deleted function's back.
type Metrics struct {
	requests *prometheus.CounterVec
	duration *prometheus.HistogramVec
	copied   *prometheus.CounterVec
	panics   *prometheus.CounterVec

	fns *Table[fnMetrics]
}

type fnMetrics struct {
	phases [7]prometheus.Observer // queue, sched, load, copy_in, kernels, copy_out, total
	copied prometheus.Counter
	mu     sync.RWMutex
	codes  map[int]prometheus.Counter
	gone   bool // its name forgotten: no series made for it any more (a request still holding it)
	name   string
}

// MaxLabels is how many names have series of their own in the request
// metrics (and in a pipeline's step metrics): past it, a name shares
// Other's.
const MaxLabels = 1000

var phaseNames = [7]string{"queue", "sched", "load", "copy_in", "kernels", "copy_out", "total"}

// New registers the request metrics on reg.
func New(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "plover_requests_total", Help: "Invoke requests by function and HTTP status code (over gRPC: the HTTP status of the outcome's class).",
		}, []string{"function", "code"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "plover_request_duration_seconds",
			Help: "Successful invoke time by phase: queue, sched (waiting for the device's scheduler), load (cold/warm start), copy_in, kernels, copy_out, total; resolve and dispatch are no phase here, so the phases do not add up to total.",
			// 10 µs .. 909 s: past the longest deadline a client may ask
			// for (plover serve --max-timeout, 10 min), which a request's
			// total may come near (a queue and a cold load that took most
			// of it); ending at 23 s, such requests all read as +Inf, and
			// at 58 s, those of clients asking for minutes.
			Buckets: prometheus.ExponentialBuckets(10e-6, 2.5, 21),
		}, []string{"function", "phase"}),
		copied: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "plover_payload_copied_bytes_total",
			Help: "Request and response payload bytes copied on the host, beside reading the body from the socket, writing the response to it and the transfer to and from the device: 0 on the default path (a body that lands in its worker's slot); a small body fasthttp read before the handler ran, or a request whose body did not land where its run read it, shows here.",
		}, []string{"function"}),
		panics: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "plover_panics_total",
			Help: "Requests whose handling panicked (a bug in the server), recovered by their transport: answered 500 (gRPC: Internal), or their connection closed when the answer had begun, and logged; and connections whose accepting (HTTP, gRPC), or whose HTTP read outside a request, closing or state hook panicked, closed and logged.",
		}, []string{"transport"}),
	}
	m.fns = NewTable(MaxLabels, m.newFn, m.dropFn)
	for _, t := range [...]string{"http", "grpc"} {
		m.panics.WithLabelValues(t) // at 0 from the start, for a rate or an alert to read
	}
	reg.MustRegister(m.requests, m.duration, m.copied, m.panics)
	return m
}

// Panicked counts a request of transport whose handling panicked.
func (m *Metrics) Panicked(transport string) { m.panics.WithLabelValues(transport).Inc() }

// Failed counts a request to name that ended with code and no outcome of
// its own to record (a recovered panic): under _unknown unless name has a
// series already, so that no request makes one for a name it sends.
func (m *Metrics) Failed(name string, code int) {
	if !m.known(name) {
		name = Unknown
	}
	m.count(m.fns.Take(call.NameOf(name)), code)
}

func (m *Metrics) known(name string) bool { return m.fns.Of(name) != nil }

func (m *Metrics) newFn(label string) *fnMetrics {
	fm := &fnMetrics{codes: map[int]prometheus.Counter{}, name: label, copied: m.copied.WithLabelValues(label)}
	for i, p := range phaseNames {
		fm.phases[i] = m.duration.WithLabelValues(label, p)
	}
	return fm
}

// dropFn deletes fm's series; a request still holding fm makes none again
// (count).
func (m *Metrics) dropFn(fm *fnMetrics) {
	fm.mu.Lock()
	defer fm.mu.Unlock()
	fm.gone = true
	for code := range fm.codes {
		m.requests.DeleteLabelValues(fm.name, strconv.Itoa(code))
	}
	for _, p := range phaseNames {
		m.duration.DeleteLabelValues(fm.name, p)
	}
	m.copied.DeleteLabelValues(fm.name)
}

// Met is told by the engine that a function of name is on the node
// (engine.Forgetter): a name deleted before takes a label again.
func (m *Metrics) Met(name string) { m.fns.Met(name) }

// Forget is told by the engine that name's function left the node
// (deleted, here or on another node sharing the store): its series go and
// its label's slot is free for the next name met.
func (m *Metrics) Forget(name string) { m.fns.Forget(name) }

func (m *Metrics) count(fm *fnMetrics, code int) {
	fm.mu.RLock()
	c := fm.codes[code]
	fm.mu.RUnlock()
	if c == nil {
		fm.mu.Lock()
		if c = fm.codes[code]; c == nil && !fm.gone {
			c = m.requests.WithLabelValues(fm.name, strconv.Itoa(code))
			fm.codes[code] = c
		}
		fm.mu.Unlock()
		if c == nil {
			return // forgotten meanwhile: its series went, and stay gone
		}
	}
	c.Inc()
}

// Record accounts one invoke, of HTTP status code (its class's, for
// gRPC) and engine kind; r's timing is read only when it succeeded. Names
// no function has share one label, Unknown, so that probing names cannot
// grow the series without bound: a 404's (but for one from a version the
// name resolved to: a pipeline whose step was deleted), and for names not met yet a
// request refused before the engine saw it (400, 415), one answered 503
// (the store unreachable: the name may be anything), and one that timed
// out or whose client left before a version was resolved (r.Version empty:
// the record was still being read, so the name is the client's guess);
// not one answered after a version was resolved (r.Version set: /v2's 400
// for JSON data over 16 MiB comes after the function ran), whose name is
// a function's. A
// name takes one of the limited labels only once a function of that name
// has answered; one whose function was deleted (Forget) counts under
// Unknown until a function of the name is on the node again. The gate's
// refusals (401, 403, a token's 429) are not invokes that reach here: the
// gate counts them (plover_auth_failures_total, plover_token_limited_total).
func (m *Metrics) Record(name call.Name, code int, kind errdefs.Kind, r *call.Request) {
	t := &r.Timing
	guess := r.Version == "" && (kind == errdefs.KindBadRequest || kind == errdefs.KindUnavailable ||
		kind == errdefs.KindTimeout || kind == errdefs.KindGone)
	if code == 404 && kind == errdefs.KindNotFound && r.Version == "" {
		name = call.NameOf(Unknown)
	} else if guess && !m.known(name.Borrow()) {
		name = call.NameOf(Unknown)
	}
	fm := m.fns.Take(name)
	m.count(fm, code)
	if r.Copied > 0 {
		fm.copied.Add(float64(r.Copied))
	}
	if code != 200 {
		return
	}
	for i, d := range [7]time.Duration{t.Queue, t.Sched, t.Load, t.CopyIn, t.Kernels, t.CopyOut, t.Total} {
		fm.phases[i].Observe(d.Seconds())
	}
}
