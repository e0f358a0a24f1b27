package main

import (
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// The echo floor's spin burns its CPU time even when its thread is
// descheduled: on one Go processor beside a busy goroutine, the spin's
// thread runs about half the wall time, and a spin by the wall clock
// (until 2026-12-01) burnt about half what it stood for. The thread's CPU
// is read from getrusage(RUSAGE_THREAD), not from the clock the spin
// reads.
func TestSpinCPUBurnsItsCPUTimeUnderContention(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	var stop atomic.Bool
	done := make(chan struct{})
	go func() { // the competition, on the one processor
		defer close(done)
		for !stop.Load() {
		}
	}()
	defer func() { stop.Store(true); <-done }()
	runtime.Gosched()
	const d = 200 * time.Millisecond
	type reading struct {
		cpu, wall time.Duration
		err       error
	}
	got := make(chan reading)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		var before, after unix.Rusage
		if err := unix.Getrusage(unix.RUSAGE_THREAD, &before); err != nil {
			got <- reading{err: err}
			return
		}
		w := time.Now()
		spinCPU(d)
		wall := time.Since(w)
		if err := unix.Getrusage(unix.RUSAGE_THREAD, &after); err != nil {
			got <- reading{err: err}
			return
		}
		cpu := func(r *unix.Rusage) time.Duration {
			return time.Duration(r.Utime.Nano() + r.Stime.Nano())
		}
		got <- reading{cpu: cpu(&after) - cpu(&before), wall: wall}
	}()
	r := <-got
	if r.err != nil {
		t.Fatal(r.err)
	}
	t.Logf("spun %v: thread CPU %v over %v of wall time", d, r.cpu, r.wall)
	// getrusage's thread times are exact on current kernels; allow
	// a tick either way, a kernel's at 100 Hz too (10 ms; 4 at 250 Hz).
	// The bug this is for burnt about half.
	if r.cpu < d-11*time.Millisecond {
		t.Fatalf("spinCPU(%v) burnt %v of its thread's CPU (over %v of wall time): it stopped by the wall clock", d, r.cpu, r.wall)
	}
}
