package engine

import (
	"log/slog"
	"strings"
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

// The 503 of no room names what the function needs and each device's
// size, never what is free there (other tenants' use of the node), and
// says when no eviction could make the room.
func TestNoRoomSaysNothingOfOthersUse(t *testing.T) {
	h0, h1 := device.NewHost(1<<20), device.NewHost(2<<20)
	for _, c := range []struct {
		name  string
		short []*shortage
		want  []string
	}{
		{"one device", []*shortage{{dev: h0, need: 4096, avail: 777333, total: 1 << 20}},
			[]string{"f needs 4096 bytes on " + h0.Name(), "of 1048576 in all", "idle functions hold too little"}},
		{"in use", []*shortage{{dev: h0, need: 4096, avail: 777333, total: 1 << 20, inUse: true}},
			[]string{"everything else is in use"}},
		{"larger than the device", []*shortage{{dev: h0, need: 2 << 20, avail: 777333, total: 1 << 20}},
			[]string{"needs 2097152 bytes on " + h0.Name() + ", which has 1048576 in all"}},
		{"two devices", []*shortage{{dev: h0, need: 4096, avail: 777333, total: 1 << 20}, {dev: h1, need: 8192, avail: 777444, total: 2 << 20}},
			[]string{"4096 bytes on " + h0.Name() + " (of 1048576 in all)", "8192 bytes on " + h1.Name() + " (of 2097152 in all)"}},
	} {
		msg := noRoom("f", c.short).Error()
		if strings.Contains(msg, "7773") || strings.Contains(msg, "7774") {
			t.Errorf("%s: %q tells the invoker what is free", c.name, msg)
		}
		for _, w := range c.want {
			if !strings.Contains(msg, w) {
				t.Errorf("%s: %q does not say %q", c.name, msg, w)
			}
		}
	}
}
