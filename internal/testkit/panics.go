package testkit

import (
	"bytes"
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/plover-run/plover/api"
	"github.com/plover-run/plover/call"
	"github.com/plover-run/plover/device"
	"github.com/plover-run/plover/frontdoor"
	"github.com/plover-run/plover/pipeline"
	"github.com/plover-run/plover/sched"
)

// PanicRunner is a request path with bugs, for the transports' recovery
// tests: lending an invoke's body (or a gRPC call's inputs) a slot,
// pinning a model and asking the devices' health panic. It admits every request and keeps the deadline
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
	n, ok := Counter(t, reg, "plover_panics_total", map[string]string{"transport": transport})
	if !ok {
		t.Fatalf("no plover_panics_total{transport=%q}", transport)
	}
	return n
}

// Counter is the counter name{labels} as reg holds it now, and whether it
// has one (labels: some of its labels, each to match).
func Counter(t testing.TB, reg *prometheus.Registry, name string, labels map[string]string) (float64, bool) {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	metrics:
		for _, m := range mf.GetMetric() {
			matched := 0
			for _, l := range m.GetLabel() {
				if v, ok := labels[l.GetName()]; ok {
					if v != l.GetValue() {
						continue metrics
					}
					matched++
				}
			}
			if matched == len(labels) {
				return m.GetCounter().GetValue(), true
			}
		}
	}
	return 0, false
}

// PanicDevice is a device (the one it wraps, the host's) with a bug in its
// Go code: a run whose input starts with PanicInput panics, of Function's
// programs only when it is set. It counts the instances made and closed,
// and the programs closed (a version's, once nothing holds it).
type PanicDevice struct {
	device.Device
	Function       string
	Made, Closed   atomic.Int32
	ProgramsClosed atomic.Int32
	// HealthBug, set, makes the next Health call panic.
	HealthBug atomic.Bool
}

func (d *PanicDevice) Health() error {
	if d.HealthBug.CompareAndSwap(true, false) {
		panic("a device bug in Health")
	}
	return d.Device.Health()
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

// PanicKernel is a kernel whose lookup (a request's chain override) panics
// on a PanicDevice's program with the bug.
const PanicKernel = "panic_in_lookup"

func (p *panicProgram) Close() error {
	p.d.ProgramsClosed.Add(1)
	return p.Program.Close()
}

func (p *panicProgram) Entry(kernel string) (int32, error) {
	if p.bugs && kernel == PanicKernel {
		panic("a device bug in a kernel's lookup")
	}
	return p.Program.Entry(kernel)
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

// PolicyBug is a bug in a scheduler policy (WFQ): once armed with a method
// of sched.Policy, the next call of that method, by any device's policy
// made under the name it was registered as, panics.
type PolicyBug struct {
	mu     sync.Mutex
	method string
}

// RegisterPolicyBug registers name as WFQ with a bug the result arms; call
// it once per name (a package's var).
func RegisterPolicyBug(name string) *PolicyBug {
	b := &PolicyBug{}
	sched.RegisterPolicy(name, func(maxWait time.Duration) sched.Policy {
		base, err := sched.NewPolicy("wfq", maxWait)
		if err != nil {
			panic(err)
		}
		return b.Policy(base)
	})
	return b
}

// Arm makes method's next call panic.
func (b *PolicyBug) Arm(method string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.method = method
}

// Armed reports whether the armed method has not been called yet.
func (b *PolicyBug) Armed() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.method != ""
}

func (b *PolicyBug) hit(method string) {
	b.mu.Lock()
	armed := b.method == method
	if armed {
		b.method = ""
	}
	b.mu.Unlock()
	if armed {
		panic("a bug in the scheduler policy's " + method)
	}
}

// Policy is base with b's bug.
func (b *PolicyBug) Policy(base sched.Policy) sched.Policy { return &buggyPolicy{base, b} }

type buggyPolicy struct {
	sched.Policy
	b *PolicyBug
}

func (p *buggyPolicy) Woke(f *sched.Flow, now time.Time) {
	p.b.hit("Woke")
	p.Policy.Woke(f, now)
}

func (p *buggyPolicy) Started(f *sched.Flow, now time.Time) float64 {
	p.b.hit("Started")
	return p.Policy.Started(f, now)
}

func (p *buggyPolicy) Ended(f *sched.Flow, ran time.Duration, charged float64, now time.Time) {
	p.b.hit("Ended")
	p.Policy.Ended(f, ran, charged, now)
}

func (p *buggyPolicy) Charged(f *sched.Flow, d time.Duration, now time.Time) {
	p.b.hit("Charged")
	p.Policy.Charged(f, d, now)
}

func (p *buggyPolicy) Reweighed(f *sched.Flow, old float64, oc sched.Class, inflight float64, now time.Time) float64 {
	p.b.hit("Reweighed")
	return p.Policy.Reweighed(f, old, oc, inflight, now)
}

func (p *buggyPolicy) Pick(waiting []*sched.Flow, now time.Time) int {
	p.b.hit("Pick")
	return p.Policy.Pick(waiting, now)
}
