package pipeline

import (
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/apierr"
	"github.com/plover-run/plover/call"
	"github.com/plover-run/plover/errdefs"
	"github.com/plover-run/plover/reqmetrics"
)

// metrics are per pipeline and step; the requests themselves are counted
// per pipeline name where every request is (the front end's metrics).
// Pipelines are labelled through a reqmetrics.Table as requests are:
// past reqmetrics.MaxLabels pipelines the rest share _other, their steps'
// functions too (so that its series stay as few as a pipeline's steps). A
// pipeline's series go when it is deleted and when its version changes
// (its steps may be others), and a step's when the function or nested
// pipeline it ran is deleted (Runner.Met, Runner.Forget).
type metrics struct {
	seconds *prometheus.HistogramVec
	errors  *prometheus.CounterVec
	tab     *reqmetrics.Table[steps]
}

// steps are a pipeline's step series (those of its label), made as its
// steps first end.
type steps struct {
	label   string
	mu      sync.RWMutex
	gone    bool // its pipeline forgotten: a request still holding it makes no series
	seconds map[stepKey]prometheus.Observer
	errors  map[stepKey]prometheus.Counter
}

// stepKey is a step series' labels besides the pipeline's.
type stepKey struct {
	index    int
	function string // the step's label: "cnn", "inner/cnn"
	code     int    // errors': the failure's HTTP status
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		seconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "plover_pipeline_step_seconds",
			Help:    "Time of each pipeline step in the engine (queue, load and run), by pipeline, step index and function.",
			Buckets: prometheus.ExponentialBuckets(25e-6, 2, 18),
		}, []string{"pipeline", "step", "function"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "plover_pipeline_step_errors_total",
			Help: "Pipeline steps that failed, by pipeline, step index, function and the HTTP status of the failure's class (4xx: the input's fault; 5xx: the function's or the server's).",
		}, []string{"pipeline", "step", "function", "code"}),
	}
	m.tab = reqmetrics.NewTable(reqmetrics.MaxLabels, func(label string) *steps {
		return &steps{label: label, seconds: map[stepKey]prometheus.Observer{}, errors: map[stepKey]prometheus.Counter{}}
	}, func(s *steps) {
		s.mu.Lock()
		defer s.mu.Unlock()
		s.gone = true
		m.clear(s, nil)
	})
	if reg != nil {
		reg.MustRegister(m.seconds, m.errors)
	}
	return m
}

// stepNames are step indexes as label values, made once.
var stepNames = func() []string {
	s := make([]string, abi.MaxPipelineSteps)
	for i := range s {
		s[i] = strconv.Itoa(i)
	}
	return s
}()

func (m *metrics) observe(pipeline string, index int, function string, d time.Duration, err error) {
	s := m.tab.Take(call.NameOf(pipeline))
	if s.label != pipeline {
		function = s.label // a label many pipelines share: their steps' functions are not told apart
	}
	step := stepNames[index]
	if err != nil {
		code := apierr.Of(errdefs.KindOf(err)).HTTP
		if c := stepSeries(s, s.errors, stepKey{index, function, code}, func() prometheus.Counter {
			return m.errors.WithLabelValues(s.label, step, function, strconv.Itoa(code))
		}); c != nil {
			c.Inc()
		}
		return
	}
	if o := stepSeries(s, s.seconds, stepKey{index, function, 0}, func() prometheus.Observer {
		return m.seconds.WithLabelValues(s.label, step, function)
	}); o != nil {
		o.Observe(d.Seconds())
	}
}

// stepSeries is series[k] of s, made by mk the first time; nil once s is
// forgotten.
func stepSeries[V comparable](s *steps, series map[stepKey]V, k stepKey, mk func() V) V {
	s.mu.RLock()
	v := series[k]
	s.mu.RUnlock()
	var none V
	if v != none {
		return v
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if v = series[k]; v == none && !s.gone {
		v = mk()
		series[k] = v
	}
	return v
}

// clear deletes s's series of the steps whose function label match
// reports (nil: all of them). Called with s.mu held.
func (m *metrics) clear(s *steps, match func(function string) bool) {
	for k := range s.seconds {
		if match == nil || match(k.function) {
			m.seconds.DeleteLabelValues(s.label, stepNames[k.index], k.function)
			delete(s.seconds, k)
		}
	}
	for k := range s.errors {
		if match == nil || match(k.function) {
			m.errors.DeleteLabelValues(s.label, stepNames[k.index], k.function, strconv.Itoa(k.code))
			delete(s.errors, k)
		}
	}
}

// clearAll clears the steps match reports in every pipeline's series.
func (m *metrics) clearAll(match func(function string) bool) {
	m.tab.Range(func(_ string, s *steps) {
		s.mu.Lock()
		defer s.mu.Unlock()
		m.clear(s, match)
	})
}

// Met is told by the engine that name's current version changed on the
// node (engine.Forgetter): a pipeline's steps may be others now, and so
// may those of the pipelines that nest it, so their series go (a request
// still running the old version may make one again, kept until the next
// change); a name deleted before takes a label again.
func (r *Runner) Met(name string) {
	m := r.met
	m.tab.Met(name)
	if s := m.tab.Of(name); s != nil {
		s.mu.Lock()
		m.clear(s, nil)
		s.mu.Unlock()
	}
	m.clearAll(func(function string) bool { return onPath(function, name, false) })
}

// Forget is told by the engine that name's function left the node: its
// series as a pipeline go, with its label's slot, and those of the steps
// that ran it, as a function or a nested pipeline, in other pipelines.
func (r *Runner) Forget(name string) {
	m := r.met
	m.tab.Forget(name)
	m.clearAll(func(function string) bool { return onPath(function, name, true) })
}

// onPath reports whether a step's function label ("cnn", "inner/cnn")
// names name as a nested pipeline or, with last, as its function too.
func onPath(label, name string, last bool) bool {
	for {
		seg, rest, nested := strings.Cut(label, "/")
		if seg == name && (nested || last) {
			return true
		}
		if !nested {
			return false
		}
		label = rest
	}
}
