package worker

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/device"
	"github.com/plover-run/plover/internal/racebuild"
	"github.com/plover-run/plover/internal/testkit"
)

// A worker's figures come from samples taken in the background: they must
// still be the worker's own, and follow its memory within the sampling
// periods (shortened here): the idle ones while nobody reads them, the
// short ones while someone does.
func TestProcessFiguresFollowTheWorker(t *testing.T) {
	sp := sampling{statsEvery: 100 * time.Millisecond, statsIdle: 1500 * time.Millisecond, pssEvery: 200 * time.Millisecond, pssIdle: 2500 * time.Millisecond}
	d := NewDevice(Options{Exe: os.Args[0], Base: device.NewHost(0), Standby: 1, Landlock: true, StageDir: t.TempDir(),
		Spawner: spawner, sampling: sp})
	t.Cleanup(func() { d.Close() })
	p, m := loadHostile(t, d, "hog_memory")
	in := newInst(t, p, m)
	g := p.(*program)
	root := os.Geteuid() == 0 // PSS needs it: workers are not dumpable

	st := g.Process()
	rss, _, threads, ok := procStatus(st.PID)
	if !ok || st.PID != g.PID() {
		t.Fatalf("Process() = %+v: not the worker's (%d)", st, g.PID())
	}
	// An idle worker: its figures move by a few pages at most.
	if st.RSSBytes < rss*9/10 || st.RSSBytes > rss*11/10 || st.Threads < 2 || st.Threads > threads+2 {
		t.Errorf("Process() = %+v; /proc says %d bytes resident, %d threads", st, rss, threads)
	}
	if root && (st.PSSBytes <= 0 || st.PSSBytes > st.RSSBytes) {
		t.Errorf("PSS %d with %d resident: want 0 < PSS <= RSS", st.PSSBytes, st.RSSBytes)
	}

	// hog_memory holds 64 MiB for 4 s, longer than the idle periods.
	const hog = 64 << 20
	entry, err := p.Entry("hog_memory")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		done <- in.Run(&device.Run{Input: []byte{0}, Output: make([]byte, m.OutBytes), TmpLen: m.TmpBytes,
			Chain: []device.Step{{Entry: entry, Grid: hog >> 20, Block: 400}}})
	}()
	// Unread, the figures follow within the idle periods: watch /proc
	// directly (which asks for nothing) until the hog holds its memory,
	// then read once after each idle period.
	for deadline := time.Now().Add(2 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		if now, _, _, _ := procStatus(st.PID); now >= st.RSSBytes+hog*9/10 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the hog never held its memory")
		}
	}
	held := time.Now()
	slack := 3 * watchEvery // the loop's ticks, and a loaded machine
	time.Sleep(sp.statsIdle + slack)
	if s := g.Process(); s.RSSBytes < st.RSSBytes+hog*9/10 {
		t.Errorf("unread for %v, the resident memory is still from before the hog: %+v (before: %+v)", time.Since(held), s, st)
	}
	time.Sleep(time.Until(held.Add(sp.pssIdle + slack)))
	if s := g.Process(); root && s.PSSBytes < st.PSSBytes+hog*9/10 {
		t.Errorf("unread for %v, PSS is still from before the hog: %+v (before: %+v)", time.Since(held), s, st)
	}
	// Reads in a row are one sample (nothing is read per call), unless the
	// watch loop took the next one in between: try a few pairs.
	same := false
	for range 5 {
		if a, b := g.Process(), g.Process(); a == b {
			same = true
			break
		}
	}
	if !same {
		t.Errorf("five pairs of reads in a row all differed while the hog held still")
	}

	// Read often, they follow within the short periods.
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	waitFigures := func(what string, within time.Duration, cond func(device.ProcessStats) bool) {
		t.Helper()
		deadline := time.Now().Add(within)
		for {
			s := g.Process()
			if cond(s) {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: not within %v: %+v (before the hog: %+v)", what, within, s, st)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	freed := time.Now()
	waitFigures("RSS down after the hog", 2*sp.statsEvery+slack, func(s device.ProcessStats) bool { return s.RSSBytes < st.RSSBytes+hog/2 })
	if root {
		waitFigures("PSS down after the hog", time.Until(freed.Add(2*sp.pssEvery+slack)), func(s device.ProcessStats) bool { return s.PSSBytes < st.PSSBytes+hog/2 })
	}

	// A worker gone reports its pid alone.
	p.Close()
	waitFigures("a closed worker's figures", 5*time.Second, func(s device.ProcessStats) bool { return s == device.ProcessStats{PID: st.PID} })
}

// A worker's instance runs in place on the server's slots, so its own
// input and output buffers on the host device are never touched there:
// they must not be resident. They were zeroed when made, so a function
// whose max_host_memory_mb was sized for its bundle (constants, tmp) but
// whose max_input_bytes or out_bytes was large had its worker killed at
// its first request (about 150 MiB resident besides the slots for 128 MiB
// out, against 22 MiB). And a slot's output began at max_input_bytes, so
// with an input not a multiple of 256 the chain's output was written in
// the instance's own out and copied: out_bytes resident again.
func TestLargeInOutNotResidentInWorker(t *testing.T) {
	if racebuild.Enabled {
		t.Skip("the race detector's memory passes the 64 MiB limit this test gives the worker")
	}
	const big = 128 << 20
	for _, tc := range []struct {
		name    string
		in, out int64
	}{{"out", 1 << 16, big}, {"input", big, 256}, {"both", big, big}, {"out after an unaligned input", 1000, big}} {
		t.Run(tc.name, func(t *testing.T) {
			m := testkit.Manifest("big")
			m.MaxInputBytes, m.OutBytes, m.MaxHostMemoryMB = tc.in, tc.out, 64
			if err := firstRequest(t, load(t, newDevice(t, 0), m), m); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// In checked mode a run is copied through the instance's guarded buffers,
// not run in place on the server's slot: with zero_out its whole out is
// resident in the worker from the first request. The worker device's
// load (FitsHostMemory) must refuse what that request would be killed
// for, and accept what it survives; it counted constants and tmp only,
// and loaded 128 MiB of out under a limit of 64, whose worker the first
// request then passed (150 MiB besides the server's slots).
func TestCheckedWorkerCountsItsOut(t *testing.T) {
	if racebuild.Enabled {
		t.Skip("the race detector's memory passes the 64 MiB limit this test gives the worker")
	}
	for _, tc := range []struct {
		name   string
		out    int64
		refuse bool
	}{{"out over the limit", 128 << 20, true}, {"out within it", 16 << 20, false}} {
		t.Run(tc.name, func(t *testing.T) {
			d := NewDevice(Options{Exe: os.Args[0], Base: device.NewHost(0), Landlock: true, StageDir: t.TempDir(), Spawner: spawner, Checked: true})
			t.Cleanup(func() { d.Close() })
			m := testkit.Manifest("checked")
			m.OutBytes, m.MaxHostMemoryMB = tc.out, 64
			p, err := d.Load(context.Background(), device.ProgramSpec{Dir: testkit.BundleDir(t, m, nil), Manifest: m})
			if tc.refuse {
				if err == nil {
					t.Cleanup(func() { p.Close() })
					t.Fatalf("loaded; its first request: %v", firstRequest(t, p, m))
				}
				var fe *abi.FieldError
				if !errors.As(err, &fe) || fe.Field != "max_host_memory_mb" || !strings.Contains(err.Error(), "checked mode") {
					t.Fatalf("load: %v; want max_host_memory_mb refused for the out checked mode zeroes", err)
				}
				return
			}
			if err != nil {
				t.Fatalf("load: %v", err)
			}
			t.Cleanup(func() { p.Close() })
			if err := firstRequest(t, p, m); err != nil {
				t.Fatalf("loaded, but %v", err)
			}
		})
	}
}

// firstRequest runs on p, of manifest m, one request of a few bytes on a
// lent slot, as the HTTP front door does, with zero_out; then watches two
// samples of the worker's memory taken after it, against which the watch
// loop checked m's max_host_memory_mb. It returns why the worker died,
// or a sample that passed the limit; nil when it lived.
func firstRequest(t *testing.T, p device.Program, m *abi.Manifest) error {
	t.Helper()
	limit := m.MaxHostMemoryMB << 20
	g := p.(*program)
	in := newInst(t, p, m)
	s, ok := p.(device.Lender).Lend(m.MaxInputBytes, m.OutBytes)
	if !ok {
		t.Fatal("no slot lent")
	}
	defer s.Release()
	body := []byte("a small request")
	n := copy(s.Input(), body)
	r := &device.Run{Input: s.Input()[:n], Output: s.Output(), Slot: s, ZeroOut: true, TmpLen: m.TmpBytes,
		Chain: []device.Step{{Entry: 0, Grid: 1, Block: 64}}}
	if err := in.Run(r); err != nil {
		return fmt.Errorf("the first request: %w", err)
	}
	// In place on the slot (but in checked mode): a copy through the
	// instance's own buffers would make them resident in the worker.
	if (r.Timing.Copied != 0 && !g.p.d.opts.Checked) || !bytes.Equal(s.Output()[:n], body) {
		t.Fatalf("%d bytes copied, output %q; want none copied, %q", r.Timing.Copied, s.Output()[:n], body)
	}
	for ran, seen := time.Now(), 0; seen < 2; time.Sleep(10 * time.Millisecond) {
		if !g.Alive() {
			return fmt.Errorf("the worker was killed: %v", g.Death())
		}
		if s := g.p.sample.Load(); s != nil && s.at.After(ran) {
			if rss := g.p.limitedRSS(s.rss, s.shmem, s.read); rss > limit {
				return fmt.Errorf("%d MiB resident besides the slots (rss %d MiB, shmem %d MiB), over max_host_memory_mb %d", rss>>20, s.rss>>20, s.shmem>>20, limit>>20)
			}
			ran, seen = s.at, seen+1
		}
	}
	return nil
}
