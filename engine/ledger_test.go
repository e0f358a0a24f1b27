package engine

import (
	"log/slog"
	"testing"

	"github.com/plover-run/plover/device"
)

// closeProbe records what the ledger still counts as being freed on its
// device when it is closed.
type closeProbe struct {
	e    *Engine
	dev  device.Device
	seen int64
}

func (c *closeProbe) Run(*device.Run) error { return nil }
func (c *closeProbe) DeviceBytes() int64    { return 50 }
func (c *closeProbe) Close() {
	c.e.mem.mu.Lock()
	c.seen = c.e.mem.freeing[c.dev]
	c.e.mem.mu.Unlock()
}

// An evicted instance's bytes leave the ledger's freeing count before it is
// closed: once closed, the device counts them free, and counting them twice
// let a concurrent reservation promise memory that did not exist.
func TestEvictedBytesLeaveFreeingBeforeClose(t *testing.T) {
	e := &Engine{mem: newLedger()}
	e.mem.log, e.mem.evictions = slog.New(slog.DiscardHandler), &e.evictions
	dev := device.NewHost(100)
	v := &version{fn: &function{name: "f"}}
	v.pool.v, v.pool.refs = v, 2
	a, b := &closeProbe{e: e, dev: dev}, &closeProbe{e: e, dev: dev}
	e.mem.freeing[dev] = 100
	e.mem.free(eviction{dev: dev, bytes: 100, instances: []evictedInstance{
		{&instance{inst: a, bytes: 50}, v}, {&instance{inst: b, bytes: 50}, v},
	}}, 100, 0)
	if a.seen != 50 || b.seen != 0 {
		t.Errorf("freeing seen while closing: %d then %d, want 50 then 0 (each instance's own bytes gone first)", a.seen, b.seen)
	}
	if got := e.mem.freeing[dev]; got != 0 {
		t.Errorf("freeing after the eviction: %d, want 0", got)
	}
	if v.pool.refs != 0 {
		t.Errorf("version refs after the eviction: %d, want 0 (each evicted instance's reference released)", v.pool.refs)
	}
}
