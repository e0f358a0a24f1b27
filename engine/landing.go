package engine

import (
	"sync/atomic"

	"github.com/plover-run/plover/call"
	"github.com/plover-run/plover/device"
)

// landing is a slot Land lent, with the reference it holds on the version
// it was lent for (f's v).
type landing struct {
	device.Slot
	e    *Engine
	f    *function
	v    *version
	done atomic.Bool // the reference dropped: a second Release drops none
}

// Release and Discard give the slot back, then drop the reference, also
// where giving the slot back panics (a bug its caller recovers): else the
// version would be held for good, never torn down nor evicted.
func (l *landing) Release() {
	defer l.drop()
	l.Slot.Release()
}

func (l *landing) Discard() {
	defer l.drop()
	l.Slot.Discard()
}

func (l *landing) drop() {
	if l.done.CompareAndSwap(false, true) {
		l.v.pool.unref()
	}
}

// slotOf is the device's slot a request's landing is (Land's, or one a
// caller lent itself), nil for none.
func slotOf(l call.Landing) device.Slot {
	if ld, ok := l.(*landing); ok {
		return ld.Slot
	}
	s, _ := l.(device.Slot)
	return s
}

// landed is the function and version l was lent for, with a reference
// taken for one call, when l is a landing of this engine's for name and
// not released; false otherwise (resolve name).
func (e *Engine) landed(name string, l call.Landing) (*function, *version, bool) {
	ld, ok := l.(*landing)
	if !ok || ld.e != e || ld.f.name != name || ld.done.Load() || !ld.v.pool.ref() {
		return nil, nil, false
	}
	return ld.f, ld.v, true
}
