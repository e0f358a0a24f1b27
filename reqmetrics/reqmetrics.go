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

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/call"
	"github.com/plover-run/plover/errdefs"
)

// Metrics counts requests by function and status and times their
// phases. Series are resolved once per function and status, so recording a
// request allocates nothing.
type Metrics struct {
	requests *prometheus.CounterVec
	duration *prometheus.HistogramVec
	copied   *prometheus.CounterVec
	panics   *prometheus.CounterVec

	mu    sync.RWMutex
	byFn  map[string]*fnMetrics
	limit int // distinct function labels kept; beyond it they share "_other"
}

type fnMetrics struct {
	phases [7]prometheus.Observer // queue, sched, load, copy_in, kernels, copy_out, total
	copied prometheus.Counter
	mu     sync.RWMutex
	codes  map[int]prometheus.Counter
	name   string
}

// unknown is the label of requests for names no function has; other, of
// functions met past the limit of labels.
const (
	unknown = "_unknown"
	other   = "_other"
)

var phaseNames = [7]string{"queue", "sched", "load", "copy_in", "kernels", "copy_out", "total"}

// New registers the request metrics on reg.
func New(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "plover_requests_total", Help: "Invoke requests by function and HTTP status code (over gRPC: the HTTP status of the outcome's class).",
		}, []string{"function", "code"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "plover_request_duration_seconds",
			Help: "Successful invoke time by phase: queue, sched (waiting for the device's scheduler), load (cold/warm start), copy_in, kernels, copy_out, total.",
			// 10 µs .. ~50 s
			Buckets: prometheus.ExponentialBuckets(10e-6, 2.5, 17),
		}, []string{"function", "phase"}),
		copied: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "plover_payload_copied_bytes_total",
			Help: "Request and response payload bytes copied on the host, beside reading the body from the socket, writing the response to it and the transfer to and from the device: 0 on the default path (a body that lands in its worker's slot); a small body fasthttp read before the handler ran, or a request whose body did not land where its run read it, shows here.",
		}, []string{"function"}),
		panics: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "plover_panics_total",
			Help: "Requests whose handling panicked (a bug in the server), recovered by their transport: answered 500 (gRPC: Internal), or their connection closed when the answer had begun, and logged; and connections whose accepting (HTTP, gRPC), or whose HTTP read outside a request, closing or state hook panicked, closed and logged.",
		}, []string{"transport"}),
		byFn:  map[string]*fnMetrics{},
		limit: 1000,
	}
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
		name = unknown
	}
	m.count(m.function(call.NameOf(name)), code)
}

func (m *Metrics) known(name string) bool {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return m.byFn[name] != nil
}

// function is name's series; a name not met before is kept (a copy),
// unless it shares one of the labels that are no function's own.
func (m *Metrics) function(name call.Name) *fnMetrics {
	fn := name.Borrow() // for the lookups
	m.mu.RLock()
	fm := m.byFn[fn]
	m.mu.RUnlock()
	if fm != nil {
		return fm
	}
	if fn != unknown && !abi.ValidName(fn) {
		// No function has such a name, and a label that is not UTF-8
		// fails every scrape: whatever a client sent shares one series.
		return m.function(call.NameOf(unknown))
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if fm = m.byFn[fn]; fm != nil {
		return fm
	}
	if len(m.byFn) >= m.limit && fn != unknown {
		// Names past the limit share one series and one entry: a name
		// is not kept once its series is no longer its own.
		if fm = m.byFn[other]; fm != nil {
			return fm
		}
		name = call.NameOf(other)
	}
	label := name.Keep()
	fm = &fnMetrics{codes: map[int]prometheus.Counter{}, name: label, copied: m.copied.WithLabelValues(label)}
	for i, p := range phaseNames {
		fm.phases[i] = m.duration.WithLabelValues(label, p)
	}
	m.byFn[label] = fm
	return fm
}

func (m *Metrics) count(fm *fnMetrics, code int) {
	fm.mu.RLock()
	c := fm.codes[code]
	fm.mu.RUnlock()
	if c == nil {
		fm.mu.Lock()
		if c = fm.codes[code]; c == nil {
			c = m.requests.WithLabelValues(fm.name, strconv.Itoa(code))
			fm.codes[code] = c
		}
		fm.mu.Unlock()
	}
	c.Inc()
}

// Record accounts one invoke, of HTTP status code (its class's, for
// gRPC) and engine kind; t is read only when it succeeded. Unknown functions share one label so that
// probing names cannot grow the series without bound; so do requests
// refused before the engine saw them (400, 415, the gate's 401, 403, 429)
// and those answered 503 (the store unreachable: the name may be anything)
// for names the metrics have not met yet, and those that timed out or whose
// client left before a version was resolved (r.Version empty: the record
// was still being read, so the name is the client's guess): a name takes
// one of the limited labels only once a function of that name has
// answered.
func (m *Metrics) Record(name call.Name, code int, kind errdefs.Kind, r *call.Request) {
	t := &r.Timing
	unresolved := (kind == errdefs.KindTimeout || kind == errdefs.KindGone) && r.Version == ""
	if code == 404 && kind == errdefs.KindNotFound {
		name = call.NameOf(unknown)
	} else if (kind == errdefs.KindBadRequest || kind == errdefs.KindUnavailable || unresolved) && !m.known(name.Borrow()) {
		name = call.NameOf(unknown)
	}
	fm := m.function(name)
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
