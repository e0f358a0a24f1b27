package reqmetrics

import (
	"fmt"
	"slices"
	"strconv"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/plover-run/plover/call"
	"github.com/plover-run/plover/errdefs"
)

// series is the function labels of the series on reg, and how many
// series carry one.
func series(t *testing.T, reg *prometheus.Registry) (labels []string, n int) {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		for _, s := range mf.GetMetric() {
			for _, l := range s.GetLabel() {
				if l.GetName() == "function" {
					n++
					if !slices.Contains(labels, l.GetValue()) {
						labels = append(labels, l.GetValue())
					}
				}
			}
		}
	}
	slices.Sort(labels)
	return labels, n
}

// A deleted function's series go and its label's slot comes back for the
// next name met; until a function of its name is on the node again, a
// request of it (one in flight at its delete) counts under _unknown,
// taking no slot.
func TestForgetGivesTheLabelBack(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := New(reg)
	m.fns.limit = 3
	rec := func(name string) func() {
		return func() { m.Record(call.NameOf(name), 200, errdefs.KindInternal, &call.Request{Version: "v"}) }
	}
	for _, step := range []struct {
		what string
		do   func()
		want []string // the function labels with series after it
	}{
		{"three functions answer", func() { rec("a")(); rec("b")(); rec("c")() }, []string{"a", "b", "c"}},
		{"a fourth, past the limit", rec("d"), []string{"_other", "a", "b", "c"}},
		{"a deleted", func() { m.Forget("a") }, []string{"_other", "b", "c"}},
		{"a new function takes its slot", rec("e"), []string{"_other", "b", "c", "e"}},
		{"a request of a, ending after its delete", rec("a"), []string{"_other", "_unknown", "b", "c", "e"}},
		{"a deployed again, past the limit", func() { m.Met("a"); rec("a")() }, []string{"_other", "_unknown", "b", "c", "e"}},
		{"b deleted, a answers", func() { m.Forget("b"); rec("a")() }, []string{"_other", "_unknown", "a", "c", "e"}},
		{"a name never met forgotten", func() { m.Forget("zz") }, []string{"_other", "_unknown", "a", "c", "e"}},
	} {
		step.do()
		if got, _ := series(t, reg); !slices.Equal(got, step.want) {
			t.Fatalf("%s: series of %q, want %q", step.what, got, step.want)
		}
	}
	if got := testutil.ToFloat64(m.requests.WithLabelValues("_other", "200")); got != 2 {
		t.Errorf("_other counted %v requests, want 2 (d, and a met again while the table was full)", got)
	}
}

// Functions deployed, answering and deleted, many more than the limit:
// the series stay those of the live ones, and a function deployed after
// still gets a label of its own, not _other (every name ever met used to
// keep its slot).
func TestChurnKeepsTheSeriesBounded(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := New(reg)
	m.fns.limit = 10
	for i := range 500 {
		name := fmt.Sprintf("pr-%d", i)
		m.Met(name)
		for _, code := range []int{200, 500, 422} {
			m.Record(call.NameOf(name), code, errdefs.KindKernel, &call.Request{Version: "v"})
		}
		m.Forget(name)
	}
	m.Met("victim")
	m.Record(call.NameOf("victim"), 200, errdefs.KindInternal, &call.Request{Version: "v"})
	labels, n := series(t, reg)
	if !slices.Equal(labels, []string{"victim"}) {
		t.Errorf("after 500 functions came and went: series of %q, want victim's alone", labels)
	}
	if n > 9 { // requests_total{200}, 7 phases, copied bytes
		t.Errorf("%d series, want 9 at most", n)
	}
	if len(m.fns.slots) != 1 || len(m.fns.gone.at) > m.fns.limit {
		t.Errorf("%d slots and %d forgotten names kept for a limit of %d, want 1 and at most the limit", len(m.fns.slots), len(m.fns.gone.at), m.fns.limit)
	}
}

// A request that resolved its function's series before the delete and
// records after it (a status not met before) makes no series again: they
// would be no name's, and kept for good.
func TestARequestAcrossItsForgetMakesNoSeries(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := New(reg)
	m.Record(call.NameOf("a"), 200, errdefs.KindInternal, &call.Request{Version: "v"})
	fm := m.fns.Take(call.NameOf("a")) // Record's lookup, before the delete
	m.Forget("a")
	m.count(fm, 500)
	fm.copied.Add(1)
	if labels, _ := series(t, reg); len(labels) != 0 {
		t.Fatalf("series of %q after a's delete, want none", labels)
	}
}

// The names forgotten and not met again are kept to tell a late request
// from a new function's, at most the limit's number: the oldest go first,
// and a name met again is no longer one of them.
func TestForgottenNamesAreBounded(t *testing.T) {
	tab := NewTable(3, func(label string) *int { return new(int) }, func(*int) {})
	for i := range 10 {
		tab.Forget("f" + strconv.Itoa(i))
	}
	tab.Met("f8")
	tab.Forget("f7") // again: now the newest
	var kept []string
	for i := range 10 {
		if tab.gone.has("f" + strconv.Itoa(i)) {
			kept = append(kept, "f"+strconv.Itoa(i))
		}
	}
	if want := []string{"f7", "f9"}; !slices.Equal(kept, want) {
		t.Fatalf("forgotten names kept: %q, want %q", kept, want)
	}
	if tab.Take(call.NameOf("f1")) == tab.Take(call.NameOf(Unknown)) {
		t.Fatal("f1, let go, still counts under _unknown")
	}
}

// Requests recording while their functions are deleted and deployed
// again, over and over: once the last delete is done and the requests
// have ended, none of the names has a series or a slot left (a request
// across a delete makes none again), and the slots never passed the limit.
func TestForgetWhileRecording(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := New(reg)
	m.fns.limit = 4
	names := []string{"n0", "n1", "n2", "n3", "n4", "n5"}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				m.Record(call.NameOf(names[i%len(names)]), 200+i%3, errdefs.KindKernel, &call.Request{Version: "v"})
			}
		}()
	}
	for i := range 2000 {
		n := names[i%len(names)]
		m.Forget(n)
		m.Met(n)
		m.fns.mu.RLock()
		own := m.fns.own
		m.fns.mu.RUnlock()
		if own > m.fns.limit {
			t.Errorf("%d slots taken for a limit of %d", own, m.fns.limit)
		}
	}
	close(stop)
	wg.Wait()
	for _, n := range names {
		m.Forget(n)
	}
	labels, _ := series(t, reg)
	for _, l := range labels {
		if slices.Contains(names, l) {
			t.Errorf("deleted %s still has series", l)
		}
	}
	if m.fns.own != 0 {
		t.Errorf("%d slots taken after every name was deleted", m.fns.own)
	}
}
