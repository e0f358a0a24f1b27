package worker

import (
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/plover-run/plover/device"
	"github.com/plover-run/plover/worker/wire"
	"golang.org/x/sys/unix"
)

// With the server polling for the reply (its runs' replies came fast), a
// worker that never answers still costs the request its deadline only, and
// one that dies mid-run is seen as a crash at once, not after a poll or a
// deadline.
func TestPolledHandOver(t *testing.T) {
	for _, tc := range []struct {
		name   string
		kernel string
		check  func(t *testing.T, err error, took time.Duration)
	}{
		{"never answers", "sleep_long", func(t *testing.T, err error, took time.Duration) {
			if !errors.Is(err, device.ErrDeadline) || took > time.Second {
				t.Fatalf("%v after %v, want ErrDeadline at the 100 ms deadline", err, took)
			}
		}},
		{"dies mid-run", "segv", func(t *testing.T, err error, took time.Duration) {
			var pe *ProcessExit
			if !errors.As(err, &pe) || !strings.Contains(pe.Reason, "SIGSEGV") || took > time.Second {
				t.Fatalf("%v after %v, want a ProcessExit naming SIGSEGV at once", err, took)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := newDevice(t, 0)
			p, m := loadHostile(t, d, "echo")
			inst := newInst(t, p, m)
			echo, _ := p.Entry("echo")
			bad, err := p.Entry(tc.kernel)
			if err != nil {
				t.Fatal(err)
			}
			// Echoes until the server polls for replies (a fresh worker's
			// first replies are slow), a thousand at most.
			for k := 0; inst.(*instance).reply.Budget() <= 0; k++ {
				if k == 1000 {
					t.Fatalf("after %d echoes the server does not poll: the case would test nothing", k)
				}
				r := &device.Run{Input: []byte("x"), Output: make([]byte, m.OutBytes), Chain: []device.Step{{Entry: echo, Grid: 1, Block: 1}}}
				if err := inst.Run(r); err != nil {
					t.Fatal(err)
				}
			}
			start := time.Now()
			err = inst.Run(&device.Run{Input: []byte("x"), Output: make([]byte, m.OutBytes),
				Chain: []device.Step{{Entry: bad, Grid: 1, Block: 1}}, Deadline: start.Add(100 * time.Millisecond)})
			tc.check(t, err, time.Since(start))
			// The run leaves the device's count of runs in flight, at once
			// or once its overrun is waited out: no later run is refused
			// its polling.
			waitFor(t, "no run in flight", func() bool { return d.running.Load() == 0 })
		})
	}
}

// A poll gives up the CPU as soon as another run starts (the busy count
// passes its limit), long before its budget, and a message that lands
// while it polls is caught.
func TestPollStopsForAnotherRun(t *testing.T) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fds[0])
	defer unix.Close(fds[1])
	buf := make([]byte, 16)
	var busy atomic.Int32
	busy.Store(1)
	started := make(chan struct{})
	go func() {
		<-started
		busy.Add(1) // another run starts
	}()
	t0 := time.Now()
	close(started)
	if _, err := wire.PollRecv(fds[0], buf, time.Minute, &busy, 1); err != unix.EAGAIN {
		t.Fatalf("poll: %v, want EAGAIN", err)
	}
	if took := time.Since(t0); took > 5*time.Second {
		t.Fatalf("the poll went on %v after another run started", took)
	}
	busy.Store(1)
	go func() { unix.Write(fds[1], []byte("reply")) }()
	n, err := wire.PollRecv(fds[0], buf, time.Minute, &busy, 1)
	if err != nil || string(buf[:n]) != "reply" {
		t.Fatalf("poll: %q %v, want the reply", buf[:n], err)
	}
}

// The run message says whether the device ran nothing else when it was
// sent: the worker polls for the instance's next request only then.
func TestRunMessageAlone(t *testing.T) {
	r := &device.Run{Input: []byte("x"), Output: make([]byte, 8), Chain: []device.Step{{Entry: 0, Grid: 1, Block: 1}}, ZeroOut: true}
	for _, alone := range []bool{false, true} {
		msg := wire.EncodeRun(make([]byte, wire.RunMsgMax), r, alone, 0, 7)
		if wire.SentAlone(msg) != alone {
			t.Fatalf("encoded alone=%v, read %v", alone, wire.SentAlone(msg))
		}
		var got device.Run
		slot := make([]byte, device.SlotSize(16, 16))
		if err := wire.DecodeRun(msg, &got, make([]device.Step, 4), slot, 16, 16); err != nil || !got.ZeroOut || got.ZeroTmp {
			t.Fatalf("decode with alone=%v: %v, %+v", alone, err, got)
		}
		if wire.RunSeq(msg) != 7 {
			t.Fatalf("sequence number %d, want 7", wire.RunSeq(msg))
		}
	}
}
