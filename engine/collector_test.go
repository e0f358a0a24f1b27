package engine_test

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/device"
	"github.com/plover-run/plover/engine"
	"github.com/plover-run/plover/internal/testkit"
)

// pinningGPU is a host device that says it is a GPU pinning host memory
// for its slots, as a CUDA device does: the collector reads its Pinning.
type pinningGPU struct {
	device.Device
	name string
	pin  device.Pinning
}

func (d pinningGPU) Target() string          { return abi.TargetCUDA }
func (d pinningGPU) Name() string            { return d.name }
func (d pinningGPU) Pinning() device.Pinning { return d.pin }

// The bound on a device's pinned host memory is a metric, as /healthz's
// pinned_host_limit_bytes: with tokens, /healthz withholds it from anyone
// without one, and the console reads a device's figures from /metrics. A
// device with no bound has no series (not a 0, which would read as a
// bound of nothing).
func TestPinnedHostLimitMetric(t *testing.T) {
	e := testkit.Engine(t, engine.Config{Devices: []device.Device{
		pinningGPU{device.NewHost(0), "gpu0", device.Pinning{Bytes: 1 << 20, Limit: 8 << 20, Refused: 1}},
		pinningGPU{device.NewHost(0), "gpu1", device.Pinning{Bytes: 2 << 20}},
	}})
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(e.Collector())
	want := `
# HELP plover_pinned_host_limit_bytes What the device's pool slots may bring plover_pinned_host_bytes to (no series: no bound).
# TYPE plover_pinned_host_limit_bytes gauge
plover_pinned_host_limit_bytes{device="gpu0"} 8.388608e+06
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "plover_pinned_host_limit_bytes"); err != nil {
		t.Error(err)
	}
}
