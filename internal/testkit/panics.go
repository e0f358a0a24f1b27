package testkit

import (
	"bytes"
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/plover-run/plover/api"
	"github.com/plover-run/plover/call"
	"github.com/plover-run/plover/device"
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

// PanicDevice is a device (the one it wraps, the host's) with a bug in its
// Go code: a run whose input starts with PanicInput panics, of Function's
// programs only when it is set. It counts the instances made and closed.
type PanicDevice struct {
	device.Device
	Function     string
	Made, Closed atomic.Int32
}

// PanicInput starts the input of a run that panics on a PanicDevice: an
// item of the batching test bundle too (0xdead, no sleep).
var PanicInput = []byte{0xad, 0xde, 0, 0, 0, 0, 0, 0}

type panicProgram struct {
	device.Program
	d    *PanicDevice
	bugs bool
}

type panicInstance struct {
	device.Instance
	d    *PanicDevice
	bugs bool
}

func (d *PanicDevice) Load(ctx context.Context, spec device.ProgramSpec) (device.Program, error) {
	p, err := d.Device.Load(ctx, spec)
	if err != nil {
		return nil, err
	}
	return &panicProgram{Program: p, d: d, bugs: d.Function == "" || d.Function == spec.Manifest.Name}, nil
}

func (p *panicProgram) NewInstance(cfg device.InstanceConfig) (device.Instance, error) {
	i, err := p.Program.NewInstance(cfg)
	if err != nil {
		return nil, err
	}
	p.d.Made.Add(1)
	return &panicInstance{Instance: i, d: p.d, bugs: p.bugs}, nil
}

func (i *panicInstance) Run(r *device.Run) error {
	if i.bugs && bytes.HasPrefix(r.Input, PanicInput) {
		panic("a device bug")
	}
	return i.Instance.Run(r)
}

func (i *panicInstance) Close() {
	i.d.Closed.Add(1)
	i.Instance.Close()
}
