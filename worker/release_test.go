package worker

import (
	"context"
	"errors"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/device"
	"github.com/plover-run/plover/internal/testkit"
)

// driverView is the server's view of a device whose free memory the test
// sets, as a driver that frees a worker's memory only once the worker has
// let go of it would show it; it counts the reads.
type driverView struct {
	*device.Host
	free, reads atomic.Int64
	// counted, where set, is the free memory as the driver counts it
	// (free is not read): what the worker freed, before the server counts
	// it back.
	counted atomic.Pointer[func() int64]
}

func (v *driverView) MemInfo() device.MemInfo {
	v.reads.Add(1)
	if f := v.counted.Load(); f != nil {
		return device.MemInfo{Total: 1 << 30, Free: (*f)()}
	}
	return device.MemInfo{Total: 1 << 30, Free: v.free.Load()}
}

// hooksProgram loads the hooks bundle (built with defs) with 4 KiB of
// constants into d, for tenant ("": a worker of its own).
func hooksProgram(t *testing.T, d *Device, tenant string, defs ...string) (device.Program, *abi.Manifest) {
	t.Helper()
	m := testkit.Manifest("hooks")
	m.Library, m.Constants = "hooks.so", "w.bin"
	m.Chain = []abi.Launch{{Kernel: "report", Grid: 1, Block: 1}}
	dir := testkit.BundleDir(t, m, make([]byte, 4096))
	testkit.BuildLib(t, testkit.HooksSource(), dir, m.Library, defs...)
	return loadDir(t, d, tenant, dir, m, nil), m
}

// What the server gave up is counted as on its way back until its worker
// has let go of it: an instance until the worker closed its channel's side
// (after its plover_instance_fini and free) or exited, a tenant program
// until its unload is answered; and then for releaseGrace. Meanwhile the
// device's MemInfo counts it free (the ledger's reckoning) and WaitFree
// waits for the driver to count it free too; WaitFree does not wait where
// nothing is coming back, or not enough. Without it a load right after an
// eviction allocated before its victim's memory was back and, on a full
// GPU, failed.
func TestWaitFreeWaitsForMemoryOnItsWayBack(t *testing.T) {
	defer func(g, w, e time.Duration) { releaseGrace, unloadWaited, endBound = g, w, e }(releaseGrace, unloadWaited, endBound)
	type setup struct {
		need    int64
		room    *atomic.Int64 // read at each look where set, else need
		release func()        // lets it come back; nil: nothing holds it
	}
	nothing := func() {} // it comes back by itself
	cases := []struct {
		name       string
		tenant     bool
		grace, end time.Duration // releaseGrace, endBound (0: its own)
		give       func(t *testing.T, d *Device, view *driverView) setup
		// atOnce: WaitFree returns nil at once; want: its error once
		// released (context.Canceled where the test cancels instead).
		atOnce bool
		want   error
	}{
		{name: "an instance until its worker lets it go", give: func(t *testing.T, d *Device, view *driverView) setup {
			p, m := hooksProgram(t, d, "", "-DHANG_FINI")
			in := newInst(t, p, m)
			w := p.(*program).p
			in.Close() // its fini hangs: the worker never closes its side
			return setup{need: in.DeviceBytes(), release: func() { w.kill("the test") }}
		}},
		{name: "a tenant program until its unload is answered", tenant: true, give: func(t *testing.T, d *Device, view *driverView) setup {
			p, _ := hooksProgram(t, d, "t")
			loadFor(t, d, "t", "", testkit.Manifest("sibling"), nil) // keeps the worker
			w := p.(*program).p
			w.ctlTok <- struct{}{} // as a sibling's load holds the channel
			unloadWaited = 10 * time.Millisecond
			p.Close()
			return setup{need: 4096, release: func() { <-w.ctlTok }}
		}},
		{name: "a tenant program until its last instance's end after its unload", tenant: true, give: func(t *testing.T, d *Device, view *driverView) setup {
			// The unload is answered while the instance's fini runs, and
			// the program, with its constants, closes with the instance.
			p, m := hooksProgram(t, d, "t", "-DSLOW_FINI_MS=3000")
			loadFor(t, d, "t", "", testkit.Manifest("sibling"), nil)
			in := newInst(t, p, m)
			need := in.DeviceBytes() + 4096
			unloadWaited = 10 * time.Millisecond
			in.Close()
			p.Close()
			// The driver counts free what comes back as it comes: the
			// instance's bytes before the program's, counted back in two
			// steps, between which a look at a driver that freed nothing
			// took the rest (4 KiB) for all that was coming and returned
			// (a CI run under load).
			back := d.returning.Load()
			counted := func() int64 { return back - d.returning.Load() }
			view.counted.Store(&counted)
			return setup{need: need, release: nothing}
		}},
		{name: "an instance whose fini never returns, for endBound", end: 300 * time.Millisecond, give: func(t *testing.T, d *Device, view *driverView) setup {
			p, m := hooksProgram(t, d, "", "-DHANG_FINI")
			in := newInst(t, p, m)
			in.Close()
			w := p.(*program).p
			return setup{need: in.DeviceBytes(), release: func() {
				waitFor(t, "the count back at endBound", func() bool { return d.returning.Load() == 0 })
				if !w.alive() {
					t.Error("the worker was ended for its fini")
				}
			}}
		}},
		{name: "a room that falls as another load is done", give: func(t *testing.T, d *Device, view *driverView) setup {
			p, m := hooksProgram(t, d, "", "-DHANG_FINI")
			in := newInst(t, p, m)
			in.Close()
			room := new(atomic.Int64)
			room.Store(in.DeviceBytes()) // with another load's, which then allocates its part
			return setup{room: room, release: func() { room.Store(0) }}
		}},
		{name: "memory seen back, for the grace", grace: time.Minute, give: func(t *testing.T, d *Device, view *driverView) setup {
			p, m := hooksProgram(t, d, "")
			newInst(t, p, m).Close()
			waitFor(t, "the instance's memory back", func() bool { return d.returning.Load() == 0 })
			return setup{need: 4096, release: func() { view.free.Store(4096) }}
		}},
		{name: "nothing on its way back", atOnce: true, give: func(t *testing.T, d *Device, view *driverView) setup {
			p, m := hooksProgram(t, d, "")
			newInst(t, p, m).Close()
			waitFor(t, "the instance's memory back", func() bool { return d.returning.Load() == 0 })
			return setup{need: 4096}
		}},
		{name: "not enough on its way back", atOnce: true, give: func(t *testing.T, d *Device, view *driverView) setup {
			p, m := hooksProgram(t, d, "", "-DHANG_FINI")
			in := newInst(t, p, m)
			in.Close()
			return setup{need: in.DeviceBytes() + 1}
		}},
		{name: "until its context ends", want: context.Canceled, give: func(t *testing.T, d *Device, view *driverView) setup {
			p, m := hooksProgram(t, d, "", "-DHANG_FINI")
			in := newInst(t, p, m)
			in.Close()
			return setup{need: in.DeviceBytes()}
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			releaseGrace, unloadWaited, endBound = c.grace, time.Second, 10*time.Second
			if c.end > 0 {
				endBound = c.end
			}
			view := &driverView{Host: device.NewHost(0)}
			view.free.Store(1 << 30)
			d := NewDevice(Options{Exe: os.Args[0], Base: view, Landlock: true, StageDir: t.TempDir(), Spawner: spawner, TenantScope: c.tenant})
			t.Cleanup(func() { d.Close() })
			view.free.Store(0)
			s := c.give(t, d, view)
			if s.release != nil {
				var once sync.Once
				release := s.release
				s.release = func() { once.Do(release) }
				defer s.release() // if the test ends before it
			}
			if r := d.returning.Load(); r > 0 {
				if f := d.MemInfo().Free; f != r {
					t.Errorf("MemInfo's free memory with %d bytes on their way back and none free as the driver counts: %d, want %d", r, f, r)
				}
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			done := make(chan error, 1)
			reads := view.reads.Load()
			room := func() int64 { return s.need }
			if s.room != nil {
				room = s.room.Load
			}
			go func() { done <- d.WaitFree(ctx, room) }()
			if c.atOnce {
				select {
				case err := <-done:
					if err != nil {
						t.Fatalf("WaitFree: %v, want nil at once", err)
					}
				case <-time.After(10 * time.Second):
					t.Fatal("WaitFree waits for memory that is not coming back")
				}
				return
			}
			// It looks a few times and waits on.
			waitFor(t, "WaitFree's looks at the driver's figure", func() bool {
				select {
				case err := <-done:
					t.Fatalf("WaitFree returned (%v) while the memory was on its way back", err)
				default:
				}
				return view.reads.Load() >= reads+3
			})
			if c.want == nil {
				s.release()
			} else {
				cancel()
			}
			select {
			case err := <-done:
				if !errors.Is(err, c.want) || (err == nil) != (c.want == nil) {
					t.Fatalf("WaitFree: %v, want %v", err, c.want)
				}
				if c.want == nil && d.returning.Load() != 0 && view.MemInfo().Free < s.need {
					t.Fatalf("WaitFree returned with %d bytes still on their way back", d.returning.Load())
				}
			case <-time.After(30 * time.Second):
				t.Fatal("WaitFree still waits 30 s after the memory came back")
			}
		})
	}
}

// Everything given up comes back to the count, whichever way it goes: a
// function's worker killed as its program is closed, a tenant's last
// program ending its worker, a worker that died before its program and
// instance were closed. A count left above 0 would have MemInfo count
// memory free that the driver never will, for good.
func TestReturningComesBackToZero(t *testing.T) {
	for _, c := range []struct {
		name   string
		tenant string
		died   bool // the worker dies before the closes
	}{
		{name: "a function's worker"},
		{name: "a tenant's last program", tenant: "t"},
		{name: "a worker dead before the closes", died: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			d := NewDevice(Options{Exe: os.Args[0], Base: device.NewHost(0), Landlock: true, StageDir: t.TempDir(), Spawner: spawner, TenantScope: c.tenant != ""})
			t.Cleanup(func() { d.Close() })
			p, m := hooksProgram(t, d, c.tenant)
			in := newInst(t, p, m)
			w := p.(*program).p
			if c.died {
				w.kill("the test")
				<-w.done
			}
			in.Close()
			p.Close()
			if !c.died && d.returning.Load() == 0 {
				t.Fatal("nothing counted on its way back after the closes")
			}
			select {
			case <-w.done:
			case <-time.After(10 * time.Second):
				t.Fatal("the worker still runs 10 s after its last program was closed")
			}
			waitFor(t, "the count of memory on its way back at 0", func() bool { return d.returning.Load() == 0 })
			if got := d.MemInfo(); got.Free != got.Total-got.Used {
				t.Fatalf("MemInfo %+v: free is not what the server does not hold", got)
			}
		})
	}
}

// An instance that holds its program's last reference in a tenant's
// worker (the unload answered while its fini ran) is counted back once the
// worker says it is freed (wire.Freed), and the program's constants once
// the program is closed after it, its plover_unload (2 s here) done: not
// both at the channel's close, which comes after the hook.
func TestAnInstanceIsBackBeforeItsProgramsUnloadHook(t *testing.T) {
	defer func(w time.Duration) { unloadWaited = w }(unloadWaited)
	unloadWaited = 10 * time.Millisecond
	d := NewDevice(Options{Exe: os.Args[0], Base: device.NewHost(0), Landlock: true, StageDir: t.TempDir(), Spawner: spawner, TenantScope: true})
	t.Cleanup(func() { d.Close() })
	p, m := hooksProgram(t, d, "t", "-DSLOW_FINI_MS=1000", "-DSLOW_UNLOAD_MS=2000")
	loadFor(t, d, "t", "", testkit.Manifest("sibling"), nil) // keeps the worker
	in := newInst(t, p, m)
	in.Close()
	p.Close()
	if r := d.returning.Load(); r != in.DeviceBytes()+4096 {
		t.Fatalf("on their way back after the closes: %d bytes, want the instance's and the constants' %d", r, in.DeviceBytes()+4096)
	}
	waitFor(t, "the instance's bytes back while the unload hook runs", func() bool { return d.returning.Load() == 4096 })
	waitFor(t, "the constants back once the program is closed", func() bool { return d.returning.Load() == 0 })
}
