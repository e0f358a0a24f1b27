package worker

import (
	"context"
	"errors"
	"os"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/plover-run/plover/worker/wire"
)

// The server counts a program's or an instance's device memory free as it
// closes it (used), but the driver counts it free only once the worker has
// let go of it: an instance's buffers once the worker has read its
// channel's end, run the bundle's plover_instance_fini and freed them (a
// free may wait for the context's running kernels; it says so, wire.Freed),
// a tenant program's once its unload is answered and its last instance's
// channel closed (the worker closes the program with its last reference),
// a function worker's whole context as the process exits. What is on its
// way back is counted (returning),
// so that the ledger's reckoning (MemInfo) sees it as the free memory it
// is about to be, and a load waits for it (WaitFree) before it allocates:
// on a full GPU an allocation right after an eviction failed before.

// returning is a worker's part of its device's returning bytes.
type returning struct {
	mu   sync.Mutex
	n    int64
	gone bool // the process exited: all of it is back, and nothing more comes
}

// give counts n bytes the server gave up as on their way back through p,
// and says whether they are (false: p has exited, its memory is back).
func (p *proc) give(n int64) bool {
	p.ret.mu.Lock()
	defer p.ret.mu.Unlock()
	if p.ret.gone {
		return false
	}
	p.ret.n += n
	p.d.returning.Add(n)
	return true
}

// back counts n of p's returning bytes back (all of what is left where p
// exited meanwhile and allBack took them).
func (p *proc) back(n int64) {
	p.ret.mu.Lock()
	defer p.ret.mu.Unlock()
	p.backLocked(min(n, p.ret.n))
}

// allBack counts all of p's returning bytes back as p exits (its memory
// goes with it) or is known never to be reaped (end: what it holds is the
// driver's to count from then on).
func (p *proc) allBack() {
	p.ret.mu.Lock()
	defer p.ret.mu.Unlock()
	p.ret.gone = true
	p.backLocked(p.ret.n)
}

func (p *proc) backLocked(n int64) {
	if n <= 0 {
		return
	}
	p.ret.n -= n
	p.d.returning.Add(-n)
	p.d.released()
}

// endBound bounds the wait for a worker to close an instance's channel
// (its plover_instance_fini and free): past it the instance's bytes are
// counted back, the driver's figure ruling, so that a fini that never
// returns does not have every later load wait for memory that never comes.
// A variable for tests.
var endBound = 10 * time.Second

// awaitEnd gives an instance's channel fd its end (the worker frees the
// instance as it reads it) and, in the background, counts the instance's
// n bytes back as the worker says it has freed them (wire.Freed), or its
// side closes, or endBound passes; done is called once the side is closed
// (the worker closes it after it let go of the instance's program, and
// closed the program where this was its last reference), the worker died,
// or endBound passed. The wait is parked in the runtime's poller, not on a
// thread of its own.
func (p *proc) awaitEnd(fd int, n int64, done func()) {
	unix.Shutdown(fd, unix.SHUT_WR)
	if err := unix.SetNonblock(fd, true); err != nil {
		unix.Close(fd)
		p.back(n)
		done()
		return
	}
	f := os.NewFile(uintptr(fd), "instance channel")
	f.SetReadDeadline(time.Now().Add(endBound))
	go func() {
		freed := false
		defer done()
		defer func() {
			if !freed { // counted back once: p's count holds others' bytes too
				p.back(n)
			}
		}()
		defer f.Close()
		var b [64]byte
		for {
			// A message it sent first (a late reply) is read and dropped:
			// the end is a read of nothing, or an error once it died.
			k, err := f.Read(b[:])
			if k == 1 && b[0] == wire.Freed && !freed {
				freed = true
				p.back(n)
				continue
			}
			if errors.Is(err, os.ErrDeadlineExceeded) {
				p.d.opts.Log.Warn("a worker has not let go of a closed instance (its plover_instance_fini, or its program's plover_unload, still runs?): its memory is counted as the driver counts it", "pid", p.pid, "bytes", n, "waited", endBound.String())
			}
			if k == 0 || err != nil {
				return
			}
		}
	}()
}

// releaseGrace is how long after memory was seen back (a worker's close,
// an unload's answer, an exit) the driver may still count it used: under
// MPS its server frees a client's memory after the client is gone. A
// variable for tests.
var releaseGrace = 500 * time.Millisecond

// released marks memory seen back now (see releaseGrace).
func (d *Device) released() { d.lastRelease.Store(monoNow()) }

// WaitFree waits until room() bytes of the device are free as its driver
// counts them (Options.Base's MemInfo) while they may yet come: while what
// is on its way back would make them, or within releaseGrace of some
// coming back; and returns at once where they are not coming (the
// allocation after it tells), ctx's error if ctx ends first. room is read
// at each look (the engine's reservations under way come and go). On the
// host device, whose memory the server's own view counts, it never waits;
// nor where the driver has the room.
func (d *Device) WaitFree(ctx context.Context, room func() int64) error {
	var t *time.Timer
	for wait := time.Millisecond; ; wait = min(2*wait, 20*time.Millisecond) {
		need := room()
		f, r := d.opts.Base.MemInfo().Free, d.returning.Load()
		recent := monoSince(d.lastRelease.Load()) < releaseGrace
		if f >= need || !(r > 0 && f+r >= need || recent) {
			return nil // the room is there, or not coming: the allocation tells
		}
		if t == nil {
			t = time.NewTimer(wait)
			defer t.Stop()
		} else {
			t.Reset(wait)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
}
