package reqmetrics_test

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/plover-run/plover/call"
	"github.com/plover-run/plover/errdefs"
	"github.com/plover-run/plover/reqmetrics"
)

// Recording a request of a function already met: its series resolved, a
// name borrowed from the request's bytes, as the HTTP path records one.
func BenchmarkRecord(b *testing.B) {
	m := reqmetrics.New(prometheus.NewRegistry())
	name := []byte("bench")
	r := &call.Request{Version: "v1"}
	m.Record(call.BorrowName(name), 200, errdefs.KindInternal, r)
	b.ReportAllocs()
	for b.Loop() {
		m.Record(call.BorrowName(name), 200, errdefs.KindInternal, r)
	}
}

// The same with requests of many functions recording at once.
func BenchmarkRecordParallel(b *testing.B) {
	m := reqmetrics.New(prometheus.NewRegistry())
	names := [][]byte{[]byte("a"), []byte("b"), []byte("c"), []byte("d")}
	for _, n := range names {
		m.Record(call.BorrowName(n), 200, errdefs.KindInternal, &call.Request{Version: "v1"})
	}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		r := &call.Request{Version: "v1"}
		i := 0
		for pb.Next() {
			m.Record(call.BorrowName(names[i%len(names)]), 200, errdefs.KindInternal, r)
			i++
		}
	})
}
