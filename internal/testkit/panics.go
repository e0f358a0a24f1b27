package testkit

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/plover-run/plover/api"
	"github.com/plover-run/plover/call"
	"github.com/plover-run/plover/frontdoor"
	"github.com/plover-run/plover/pipeline"
)

// PanicRunner is a request path with bugs, for the transports' recovery
// tests: lending an invoke's body a slot, pinning a model and asking the
// devices' health panic. It admits every request and keeps the deadline
// asked; its other methods are a nil Runner's (they panic too).
type PanicRunner struct{ frontdoor.Runner }

func (PanicRunner) Deadline(d, _ time.Time) time.Time { return d }

func (PanicRunner) Admit(context.Context, string, time.Time) (pipeline.Admission, error) {
	return pipeline.Admission{}, nil
}

func (PanicRunner) Land(string) call.Landing           { panic("a bug in Land") }
func (PanicRunner) Health() (bool, []api.DeviceHealth) { panic("a bug in Health") }

func (PanicRunner) Pin(context.Context, string, time.Time) (pipeline.Pin, error) {
	panic("a bug in Pin")
}

// PanicLines is the lines of a text log about recovered panics.
func PanicLines(log string) []string {
	var lines []string
	for _, l := range strings.Split(log, "\n") {
		if strings.Contains(l, `msg="request panicked"`) {
			lines = append(lines, l)
		}
	}
	return lines
}

// Panics is plover_panics_total{transport} as reg holds it now.
func Panics(t testing.TB, reg *prometheus.Registry, transport string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "plover_panics_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "transport" && l.GetValue() == transport {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	t.Fatalf("no plover_panics_total{transport=%q}", transport)
	return 0
}
