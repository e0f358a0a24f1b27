package pipeline

import (
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
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
	named   *named
}

// steps are a pipeline's step series (those of its label), made as its
// steps first end.
type steps struct {
	label   string
	mu      sync.RWMutex
	gone    bool // its pipeline forgotten: a request still holding it makes no series
	seconds map[stepKey]prometheus.Observer
	errors  map[stepKey]prometheus.Counter
	// byName is the keys of the series (of either map) whose function
	// label mentions a name, kept with them; named lists s under each.
	byName map[mention]map[stepKey]struct{}
	named  *named
}

// mention is a name in a step's function label: the function it ran
// (last) or a nested pipeline on its path.
type mention struct {
	name string
	last bool
}

// mentions calls f with each name in the function label ("cnn",
// "inner/cnn").
func mentions(label string, f func(mention)) {
	for {
		seg, rest, nested := strings.Cut(label, "/")
		f(mention{seg, !nested})
		if !nested {
			return
		}
		label = rest
	}
}

// named is, for each name step series mention, the pipelines' steps that
// have one, so that Met and Forget look at those series alone and not at
// every pipeline's (they are told under the engine's table lock, on every
// version switch of any function). Its lock is taken under a steps' mu,
// never the other way.
type named struct {
	mu       sync.Mutex
	of       map[mention]map[*steps]struct{}
	examined atomic.Int64 // series looked at for a name (the tests')
}

// index notes k, a series of s just made, under the names it mentions.
// Called with s.mu held.
func (s *steps) index(k stepKey) {
	mentions(k.function, func(mn mention) {
		ks := s.byName[mn]
		if ks == nil {
			ks = map[stepKey]struct{}{}
			s.byName[mn] = ks
			s.named.mu.Lock()
			if s.named.of[mn] == nil {
				s.named.of[mn] = map[*steps]struct{}{}
			}
			s.named.of[mn][s] = struct{}{}
			s.named.mu.Unlock()
		}
		ks[k] = struct{}{}
	})
}

// unindex forgets k, whose series of s went. Called with s.mu held.
func (s *steps) unindex(k stepKey) {
	mentions(k.function, func(mn mention) {
		ks, ok := s.byName[mn]
		if !ok {
			return // a name the label mentions twice
		}
		if delete(ks, k); len(ks) > 0 {
			return
		}
		delete(s.byName, mn)
		s.named.mu.Lock()
		if delete(s.named.of[mn], s); len(s.named.of[mn]) == 0 {
			delete(s.named.of, mn)
		}
		s.named.mu.Unlock()
	})
}

// steps are those with a series that mentions mn, as they are now.
func (n *named) steps(mn mention) []*steps {
	n.mu.Lock()
	defer n.mu.Unlock()
	ss := make([]*steps, 0, len(n.of[mn]))
	for s := range n.of[mn] {
		ss = append(ss, s)
	}
	return ss
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
			Name: "plover_pipeline_step_seconds",
			Help: "Time of each pipeline step that succeeded in the engine (queue, load and run), by pipeline, step index and function; failed steps are plover_pipeline_step_errors_total.",
			// 25 µs .. 839 s: a step may take up to its request's
			// deadline (30 s by default, up to --max-timeout's 10 min);
			// ending at 3.3 s, every slower step read as +Inf.
			Buckets: prometheus.ExponentialBuckets(25e-6, 2, 26),
		}, []string{"pipeline", "step", "function"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "plover_pipeline_step_errors_total",
			Help: "Pipeline steps that failed, by pipeline, step index, function and the HTTP status of the failure's class (4xx: the input's fault; 5xx: the function's or the server's).",
		}, []string{"pipeline", "step", "function", "code"}),
		named: &named{of: map[mention]map[*steps]struct{}{}},
	}
	m.tab = reqmetrics.NewTable(reqmetrics.MaxLabels, func(label string) *steps {
		return &steps{label: label, seconds: map[stepKey]prometheus.Observer{}, errors: map[stepKey]prometheus.Counter{},
			byName: map[mention]map[stepKey]struct{}{}, named: m.named}
	}, func(s *steps) {
		s.mu.Lock()
		defer s.mu.Unlock()
		s.gone = true
		m.clear(s)
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
		if c := stepSeries(m, s, s.errors, stepKey{index, function, code}, func() prometheus.Counter {
			return m.errors.WithLabelValues(s.label, step, function, strconv.Itoa(code))
		}); c != nil {
			c.Inc()
		}
		return
	}
	if o := stepSeries(m, s, s.seconds, stepKey{index, function, 0}, func() prometheus.Observer {
		return m.seconds.WithLabelValues(s.label, step, function)
	}); o != nil {
		o.Observe(d.Seconds())
	}
}

// stepSeries is series[k] of s, made by mk the first time; nil once s is
// forgotten.
func stepSeries[V comparable](m *metrics, s *steps, series map[stepKey]V, k stepKey, mk func() V) V {
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
		m.dropOtherKind(s, k)
		v = mk()
		series[k] = v
		s.index(k)
	}
	return v
}

// dropOtherKind drops s's series that take a name k mentions for the
// other kind: "x" as a function where k runs through pipeline x
// ("x/cnn"), or the other way. A name's kind changes only by a deploy,
// whose Met drops the nested kind's series but not a function's, which
// are a step's across its versions. Called with s.mu held.
func (m *metrics) dropOtherKind(s *steps, k stepKey) {
	mentions(k.function, func(mn mention) {
		other := s.byName[mention{mn.name, !mn.last}]
		if len(other) == 0 {
			return
		}
		for _, o := range slices.Collect(maps.Keys(other)) {
			m.drop(s, o)
		}
	})
}

// clear deletes all of s's series. Called with s.mu held.
func (m *metrics) clear(s *steps) {
	for k := range s.seconds {
		m.drop(s, k)
	}
	for k := range s.errors {
		m.drop(s, k)
	}
}

// drop deletes s's series of k, in both maps. Called with s.mu held.
func (m *metrics) drop(s *steps, k stepKey) {
	if _, ok := s.seconds[k]; ok {
		m.seconds.DeleteLabelValues(s.label, stepNames[k.index], k.function)
		delete(s.seconds, k)
	}
	if _, ok := s.errors[k]; ok {
		m.errors.DeleteLabelValues(s.label, stepNames[k.index], k.function, strconv.Itoa(k.code))
		delete(s.errors, k)
	}
	s.unindex(k)
}

// clearNamed clears the steps whose function label mentions mn, in every
// pipeline's series: those named lists, no others.
func (m *metrics) clearNamed(mn mention) {
	for _, s := range m.named.steps(mn) {
		s.mu.Lock()
		for k := range s.byName[mn] {
			m.named.examined.Add(1)
			m.drop(s, k)
		}
		s.mu.Unlock()
	}
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
		m.clear(s)
		s.mu.Unlock()
	}
	m.clearNamed(mention{name, false})
}

// Forget is told by the engine that name's function left the node: its
// series as a pipeline go, with its label's slot, and those of the steps
// that ran it, as a function or a nested pipeline, in other pipelines.
func (r *Runner) Forget(name string) {
	m := r.met
	m.tab.Forget(name)
	m.clearNamed(mention{name, false})
	m.clearNamed(mention{name, true})
}
