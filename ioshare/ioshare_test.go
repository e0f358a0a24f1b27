package ioshare

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/plover-run/plover/sched"
	"golang.org/x/sys/unix"
)

// tcpPair is a connected loopback TCP pair.
func tcpPair(t *testing.T) (server, client *net.TCPConn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	acc := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		acc <- c
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	s := <-acc
	if s == nil {
		t.Fatal("accept failed")
	}
	t.Cleanup(func() { c.Close(); s.Close() })
	return s.(*net.TCPConn), c.(*net.TCPConn)
}

// WaitReadable returns once bytes arrive, and takes none of them; past
// the connection's read deadline it returns that deadline's error.
func TestWaitReadable(t *testing.T) {
	s, c := tcpPair(t)
	done := make(chan error, 1)
	go func() { done <- WaitReadable(s) }()
	select {
	case err := <-done:
		t.Fatalf("returned before any byte was sent: %v", err)
	case <-time.After(20 * time.Millisecond): // a wait that ended early is the failure; this only gives it room
	}
	c.Write([]byte("x"))
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 4)
	if n, err := s.Read(b); err != nil || string(b[:n]) != "x" {
		t.Fatalf("read after the wait: %q, %v; want the byte the wait left", b[:n], err)
	}
	s.SetReadDeadline(time.Now().Add(10 * time.Millisecond))
	if err := WaitReadable(s); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("nothing to read past the deadline: %v", err)
	}
}

// WriteSome writes what the socket takes and says 0 once it is full,
// without waiting; WaitWritable returns once the peer read some.
func TestWriteSomeAndWaitWritable(t *testing.T) {
	s, c := tcpPair(t)
	s.SetWriteBuffer(16 << 10)
	c.SetReadBuffer(16 << 10)
	p := make([]byte, 64<<10)
	var sent int
	for i := 0; ; i++ {
		n, err := WriteSome(s, p)
		if err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			break
		}
		sent += n
		if i > 10000 {
			t.Fatal("the socket never filled")
		}
	}
	if sent == 0 {
		t.Fatal("nothing written to an empty socket")
	}
	done := make(chan error, 1)
	go func() { done <- WaitWritable(s) }()
	buf := make([]byte, 1<<20)
	read := 0
	for read < sent {
		select {
		case err := <-done:
			if err != nil {
				t.Fatal(err)
			}
			return // room again, as the peer read
		default:
		}
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		n, err := c.Read(buf)
		if err != nil {
			t.Fatal(err)
		}
		read += n
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// work is a fixed amount of CPU: what a piece costs in these tests.
func work() {
	b := make([]byte, 64<<10)
	for range 20 {
		sum := sha256.Sum256(b)
		b[0] = sum[0]
	}
}

// Backlogged flows get turns' time in proportion to their shares, each charged
// the CPU its turns took, and the charges reach Config.Charge (all
// but the last chargeEvery of them).
func TestTurnsFollowShares(t *testing.T) {
	var mu sync.Mutex
	charged := map[string]time.Duration{}
	// A turn here (work) may take longer than the default Hold on a loaded
	// machine, which would let the next turn start beside it.
	sh := New(Config{Slots: 1, Hold: time.Minute, Charge: func(f *Flow, cpu time.Duration) bool {
		mu.Lock()
		charged[f.name] += cpu
		mu.Unlock()
		return true
	}})
	a, b := sh.Flow("a"), sh.Flow("b")
	a.Set(3, sched.Default)
	b.Set(1, sched.Default)
	var turns [2]int
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var total sync.WaitGroup
	total.Add(400)
	for i, f := range []*Flow{a, a, b, b} { // two clients each: always one waiting
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				tn, err := f.Turn(ctx, time.Time{}, nil, false)
				if err != nil {
					return
				}
				work()
				mu.Lock()
				turns[i/2]++
				n := turns[0] + turns[1]
				mu.Unlock()
				tn.Done()
				if n <= 400 {
					total.Done()
				}
			}
		}()
	}
	total.Wait()
	cancel()
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	// The policy shares the CPU turns take, not their number: a turn
	// that did more work costs more, and its flow gets fewer.
	part := a.Seconds() / (a.Seconds() + b.Seconds())
	if part < 0.68 || part > 0.82 {
		t.Fatalf("a (share 3) had %.2f of the turns' time (%d of %d turns), want about 0.75", part, turns[0], turns[0]+turns[1])
	}
	for _, f := range []*Flow{a, b} {
		spent := time.Duration(f.cpu.Load())
		if owed := spent - charged[f.name]; spent <= 0 || owed < 0 || owed >= chargeEvery {
			t.Fatalf("flow %s: CPU %v, charged %v (owed %v; at most %v may be owed)", f.name, spent, charged[f.name], owed, chargeEvery)
		}
	}
}

// What a flow's pieces cost before anything takes the charge (a function's
// first body, read before its first run makes its device flow) stays owed,
// and reaches Config.Charge whole once something does: none of it is lost.
func TestChargeKeptUntilTaken(t *testing.T) {
	var taken, offered time.Duration
	ready := false // a device flow exists
	sh := New(Config{Off: true, Charge: func(_ *Flow, cpu time.Duration) bool {
		offered += cpu
		if ready {
			taken += cpu
		}
		return ready
	}})
	f := sh.Flow("f")
	piece := func() {
		start := Now()
		for start.Elapsed() < chargeEvery {
		}
		f.MeteredSince(start)
	}
	for range 3 {
		piece()
	}
	if offered == 0 || taken != 0 {
		t.Fatalf("before a device flow: offered %v, taken %v; want offered and none taken", offered, taken)
	}
	ready = true
	piece()
	spent := time.Duration(f.cpu.Load())
	if owed := spent - taken; owed < 0 || owed >= chargeEvery {
		t.Fatalf("spent %v, taken %v once a device flow took charges: want all but less than %v", spent, taken, chargeEvery)
	}
}

// A charge nothing takes (a name that never gets a device flow) is
// offered again once per chargeEvery more owed, not with every piece (each
// offer takes every device scheduler's lock), and what is kept owed stays
// under maxKept however long it goes on.
func TestChargeNeverTakenIsBounded(t *testing.T) {
	calls, most := 0, time.Duration(0)
	sh := New(Config{Off: true, Charge: func(_ *Flow, cpu time.Duration) bool {
		calls++
		most = max(most, cpu)
		return false
	}})
	f := sh.Flow("f")
	const pieces = 1000
	piece := chargeEvery / 10
	for range pieces {
		f.charge(piece)
	}
	if want := pieces / 10; calls > want+1 {
		t.Errorf("%d pieces of %v each: Charge was asked %d times, want about %d (once per %v owed)", pieces, piece, calls, want, chargeEvery)
	}
	for range 20 {
		f.charge(time.Second / 2)
	}
	if most > maxKept+time.Second/2 {
		t.Errorf("an untaken charge grew to %v offered at once, want at most %v kept and the piece's own", most, maxKept)
	}
}

// A piece that may block (TLS, a chunked body) is charged what its bytes
// cost, not the time it waited for its peer: a client trickling a few
// bytes a piece charges its function next to nothing; a piece whose bytes
// are not known is charged its wall time up to Config.Hold, and one that
// moved many bytes fast is charged its wall time.
func TestBlockingPiecesChargeTheirBytes(t *testing.T) {
	const hold = 2 * time.Millisecond
	for _, tc := range []struct {
		name     string
		wait     time.Duration // the piece's wall time, at least
		n        int           // bytes moved (-1: Done)
		min, max time.Duration // what it may be charged
	}{
		{"a trickle", 5 * time.Millisecond, 10, 1, time.Microsecond},
		{"nothing moved", 5 * time.Millisecond, 0, 0, time.Microsecond},
		{"bytes unknown", 5 * time.Millisecond, -1, hold, hold},
		{"many bytes, fast", 0, 64 << 20, 1, hold},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sh := New(Config{Off: true, Hold: hold})
			f := sh.Flow("f")
			start := mono() // before the turn's own start: the charge is within
			tn, err := f.Turn(context.Background(), time.Time{}, nil, true)
			if err != nil {
				t.Fatal(err)
			}
			time.Sleep(tc.wait)
			if tc.n >= 0 {
				tn.DoneMoved(tc.n)
			} else {
				tn.Done()
			}
			wall := mono() - start
			got := time.Duration(f.cpu.Load())
			if got < tc.min || got > tc.max || (tc.n >= 0 && got > wall) {
				t.Fatalf("charged %v for %d bytes in %v; want %v to %v, and no more than the wall time", got, tc.n, wall, tc.min, tc.max)
			}
		})
	}
}

// A piece that may block holds its slot while it waits for its client, and
// the turns' order counts that, though its function is charged only its
// bytes: clients trickling chunked bodies (a few bytes a piece, each
// waiting about 1 ms inside its turn) do not crowd out, at equal shares, a
// flow whose pieces take 1 ms of CPU each (one slot). Charged 1 ns a
// piece, the trickling flow took 442 turns to the other's 5.
func TestTricklingPiecesPayTheirSlotTime(t *testing.T) {
	sh := New(Config{Slots: 1, Hold: 2 * time.Millisecond})
	a, b := sh.Flow("a"), sh.Flow("b")
	var mu sync.Mutex
	var turns [2]int
	ctx, cancel := context.WithCancel(context.Background())
	var wg, enough sync.WaitGroup
	const total = 300
	enough.Add(total)
	for i, f := range []*Flow{a, a, a, b, b} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				tn, err := f.Turn(ctx, time.Time{}, nil, f == a)
				if err != nil {
					return
				}
				if f == a {
					time.Sleep(time.Millisecond) // the client's next chunk
					tn.DoneMoved(10)
				} else {
					for start := mono(); mono()-start < time.Millisecond; {
					}
					tn.Done()
				}
				mu.Lock()
				turns[min(i/3, 1)]++
				n := turns[0] + turns[1]
				mu.Unlock()
				if n <= total {
					enough.Done()
				}
			}
		}()
	}
	enough.Wait()
	cancel()
	wg.Wait()
	if turns[1]*3 < turns[0] {
		t.Fatalf("the CPU flow had %d turns against the trickling flow's %d: a waiting piece's slot time is not counted", turns[1], turns[0])
	}
	if spent := time.Duration(a.cpu.Load()); spent > time.Millisecond {
		t.Fatalf("the trickling flow was charged %v for %d pieces of 10 bytes: want its bytes, not its waits", spent, turns[0])
	}
}

// Non-blocking pieces teach the rate blocking ones are charged at.
func TestBlockingRateIsLearnt(t *testing.T) {
	sh := New(Config{Off: true})
	if got, want := sh.blockingCost(1<<20), time.Duration(1<<20*defaultRate*blockingFactor/1000); got != want {
		t.Fatalf("before any piece: 1 MiB costs %v, want the default's %v", got, want)
	}
	sh.learnRate(4*time.Millisecond, 1<<20) // 3.8 ns a byte
	if got := sh.blockingCost(1 << 20); got < 7*time.Millisecond || got > 9*time.Millisecond {
		t.Fatalf("after a piece at 4 ms a MiB: a blocking MiB costs %v, want 8 ms", got)
	}
	for range 100 {
		sh.learnRate(time.Millisecond, 1<<20)
	}
	if got := sh.blockingCost(1 << 20); got < 1900*time.Microsecond || got > 2100*time.Microsecond {
		t.Fatalf("after many pieces at 1 ms a MiB: a blocking MiB costs %v, want 2 ms", got)
	}
}

// Off: turns are not waited for (a held turn blocks none), and are still
// charged.
func TestOffMovesAsTheyCome(t *testing.T) {
	sh := New(Config{Off: true, Slots: 1})
	f := sh.Flow("f")
	held, err := f.Turn(context.Background(), time.Time{}, nil, false)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	tn, err := f.Turn(ctx, time.Time{}, nil, false)
	if err != nil {
		t.Fatalf("a second turn beside a held one: %v", err)
	}
	work()
	tn.Done()
	held.Done()
	if f.Seconds() <= 0 {
		t.Fatal("a turn's CPU was not counted")
	}
}

// A light function's request (Touch) makes another flow's turns share the
// server's I/O for Config.Recent: a turn moves Piece bytes while the light
// one counts as about, alonePieces of them once it no longer does.
func TestTouchCountsForRecent(t *testing.T) {
	for _, tt := range []struct {
		recent time.Duration
		pieces int
	}{{time.Hour, 1}, {time.Nanosecond, alonePieces}} {
		sh := New(Config{Slots: 2, Recent: tt.recent})
		sh.Flow("light").Touch(time.Now())
		tn, err := sh.Flow("big").Turn(context.Background(), time.Time{}, nil, false)
		if err != nil {
			t.Fatal(err)
		}
		got := tn.Piece()
		tn.Done()
		if want := tt.pieces * sh.Piece(); got != want {
			t.Errorf("Recent %v: a turn beside a touched light flow moves %d bytes, want %d", tt.recent, got, want)
		}
	}
}

// While a light function is about, a flood's pieces leave a slot free for
// it, unless the node keeps none (NoReserve): then they take every slot.
// A function flooding its devices with small requests (Config.Flooding)
// keeps none by its touches: it never needs a turn, and it kept the slot
// from the floods that do for as long as it flooded (a review found it).
func TestNoReserveGivesTheFloodsEverySlot(t *testing.T) {
	for _, tc := range []struct {
		name      string
		noReserve bool
		flooding  bool // the touching function floods its devices
		took      bool // the flood's second piece takes the last slot
	}{
		{"kept for a light function", false, false, false},
		{"no reserve", true, false, true},
		{"a small-request flood touching", false, true, true},
	} {
		sh := New(Config{Slots: 2, Recent: time.Hour, Hold: time.Hour, NoReserve: tc.noReserve,
			Flooding: func(name string) bool { return tc.flooding && name == "light" }})
		sh.Flow("light").Touch(time.Now())
		flood := sh.Flow("flood")
		first, err := flood.Turn(context.Background(), time.Time{}, nil, false)
		if err != nil {
			t.Fatal(err)
		}
		// Kept, the slot stays free however long the second waits: its
		// deadline ends the wait.
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		second, err := flood.Turn(ctx, time.Time{}, nil, false)
		cancel()
		if took := err == nil; took != tc.took {
			t.Errorf("%s: the flood's second piece took the last slot %v (%v), want %v", tc.name, took, err, tc.took)
		}
		second.Done()
		first.Done()
	}
}

// A piece that holds its turn past Hold (blocked) gives its slot up to a
// waiting one.
func TestHeldTurnGivesWay(t *testing.T) {
	sh := New(Config{Slots: 1, Hold: 5 * time.Millisecond})
	a, b := sh.Flow("a"), sh.Flow("b")
	held, err := a.Turn(context.Background(), time.Time{}, nil, false)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Done()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	tn, err := b.Turn(ctx, time.Time{}, nil, false)
	if err != nil {
		t.Fatalf("a turn behind one held past Hold: %v", err)
	}
	tn.Done()
}

// A nil flow's turns and meters do nothing, so that transports need not
// check for one.
func TestNilFlow(t *testing.T) {
	var f *Flow
	tn, err := f.Turn(context.Background(), time.Time{}, nil, false)
	if err != nil {
		t.Fatal(err)
	}
	tn.Done()
	f.MeteredSince(Now())
	f.Metered(time.Second)
}

// Work measured on the flow's clock is charged the time between its
// readings: MeteredSince charges up to the instant it returns, which the
// next step takes as its start, and Metered charges work measured before
// the flow was known (a gRPC call's decoding). Both count in the flow's
// Seconds and reach Config.Charge once chargeEvery is owed.
func TestMeteredCharges(t *testing.T) {
	var charged time.Duration
	sh := New(Config{Charge: func(_ *Flow, cpu time.Duration) bool { charged += cpu; return true }})
	f := sh.Flow("f")
	start := Now()
	for start.Elapsed() < chargeEvery {
	}
	end := f.MeteredSince(start)
	if d := time.Duration(end - start); d < chargeEvery || time.Duration(f.cpu.Load()) != d || charged != d {
		t.Fatalf("MeteredSince: %v to its end, spent %v, charged %v; want both the %v (at least %v)", d, time.Duration(f.cpu.Load()), charged, d, chargeEvery)
	}
	before := time.Duration(f.cpu.Load())
	f.Metered(chargeEvery)
	if got := time.Duration(f.cpu.Load()) - before; got != chargeEvery || charged != before+chargeEvery {
		t.Fatalf("Metered(%v): spent %v more, charged %v in all; want %v more, %v", chargeEvery, got, charged, chargeEvery, before+chargeEvery)
	}
}

// An Instant as a time.Time is when it was read, on the monotonic clock:
// what a start handed to code that takes a time.Time must be.
func TestInstantTime(t *testing.T) {
	t0 := time.Now()
	i := Now()
	t1 := time.Now()
	if got := i.Time(); got.Before(t0) || got.After(t1) {
		t.Fatalf("Now().Time() = %v; want between %v and %v", got, t0, t1)
	}
	if d := time.Since(i.Time()); d < 0 || d > time.Since(t0) {
		t.Fatalf("time.Since(Now().Time()) = %v; want between 0 and %v", d, time.Since(t0))
	}
}

// levels records where Threads put each thread (by thread id).
type levels struct {
	mu    sync.Mutex
	at    map[int]int
	moves int
}

func (l *levels) Base() (int, bool) { return 0, true }
func (l *levels) Set(n int) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.at[unix.Gettid()] = n
	l.moves++
	return nil
}

// TestPiecesMoveAtTheirFlowsLevel: a piece that shares the server's I/O
// moves on a thread at its flow's level (Config.Threads), which is back at
// the server's when the turn is done; a flow alone, or a piece that may
// block, moves at the server's level; levels at or below the server's are
// not taken.
func TestPiecesMoveAtTheirFlowsLevel(t *testing.T) {
	th := &levels{at: map[int]int{}}
	sh := New(Config{Slots: 3, Hold: time.Minute, Threads: th,
		Nice: func(share float64, _ sched.Class) int { return int(10 / share) }})
	heavy, light, other := sh.Flow("heavy"), sh.Flow("light"), sh.Flow("other")
	heavy.Set(1, sched.Default)  // level 10
	light.Set(20, sched.Default) // level 0: the server's
	other.Set(1, sched.Default)
	// other's piece in flight: heavy and light are not alone.
	busy, err := other.Turn(context.Background(), time.Time{}, nil, false)
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name     string
		f        *Flow
		mayBlock bool
		want     int // the piece's thread's level during the turn
		moves    int // Set calls for it
	}{
		{"a heavy piece", heavy, false, 10, 2},
		{"a piece at the server's level", light, false, 0, 0},
		{"a piece that may block", heavy, true, 0, 0},
	} {
		th.mu.Lock()
		th.moves = 0
		th.mu.Unlock()
		done := make(chan error)
		go func() {
			// Locked here too, so that the turn's unlock leaves the
			// goroutine on the thread it moved, to be looked at after.
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			tn, err := tt.f.Turn(context.Background(), time.Time{}, nil, tt.mayBlock)
			if err != nil {
				done <- err
				return
			}
			th.mu.Lock()
			during := th.at[unix.Gettid()]
			th.mu.Unlock()
			tn.Done()
			th.mu.Lock()
			after := th.at[unix.Gettid()]
			th.mu.Unlock()
			if during != tt.want || after != 0 {
				done <- fmt.Errorf("level %d during the turn and %d after, want %d and 0", during, after, tt.want)
				return
			}
			done <- nil
		}()
		if err := <-done; err != nil {
			t.Errorf("%s: %v", tt.name, err)
		}
		th.mu.Lock()
		if th.moves != tt.moves {
			t.Errorf("%s: %d moves, want %d", tt.name, th.moves, tt.moves)
		}
		th.mu.Unlock()
	}
	busy.Done()
}

// TestOneProcessorMovesNothingNiced: with one Go P, no piece moves niced:
// its thread, left waiting by the kernel at a flood's level, would hold
// the only P and with it every other goroutine of the server.
func TestOneProcessorMovesNothingNiced(t *testing.T) {
	for _, procs := range []int{1, 2} {
		t.Run(fmt.Sprint(procs, " P"), func(t *testing.T) {
			defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(procs))
			th := &levels{at: map[int]int{}}
			sh := New(Config{Slots: 3, Hold: time.Minute, Threads: th,
				Nice: func(float64, sched.Class) int { return 10 }})
			a, b := sh.Flow("a"), sh.Flow("b")
			a.Set(1, sched.Default)
			b.Set(1, sched.Default)
			busy, err := b.Turn(context.Background(), time.Time{}, nil, false) // a not alone
			if err != nil {
				t.Fatal(err)
			}
			defer busy.Done()
			tn, err := a.Turn(context.Background(), time.Time{}, nil, false)
			if err != nil {
				t.Fatal(err)
			}
			niced := tn.niced
			tn.Done()
			if niced != (procs > 1) {
				t.Fatalf("with %d P a piece moved niced: %v, want %v", procs, niced, procs > 1)
			}
		})
	}
}

// A non-blocking piece is charged its thread's CPU time, not its wall
// time: a piece whose thread does not run for part of its turn (preempted
// at a light nice level behind heavier work; here, asleep) costs its
// function only what the thread did. Charged its wall time, the sleeping
// piece cost 20 ms.
func TestPiecesChargeTheirThreadsCPU(t *testing.T) {
	for _, tc := range []struct {
		name  string
		sleep time.Duration // inside the turn, on no CPU
		spin  time.Duration // inside the turn, of the thread's own CPU
	}{
		{"asleep", 20 * time.Millisecond, 0},
		{"working", 0, 20 * time.Millisecond},
		{"both", 20 * time.Millisecond, 10 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sh := New(Config{Slots: 2})
			f := sh.Flow("f")
			start := mono()
			tn, err := f.Turn(context.Background(), time.Time{}, nil, false)
			if err != nil {
				t.Fatal(err)
			}
			time.Sleep(tc.sleep)
			for c0 := threadCPU(); threadCPU()-c0 < tc.spin; {
			}
			tn.DoneMoved(64 << 10)
			wall := mono() - start
			got := time.Duration(f.cpu.Load())
			// The clock's reads and the turn's bookkeeping cost the
			// thread a little more than the spin.
			if got < tc.spin || got > tc.spin+5*time.Millisecond || got > wall {
				t.Fatalf("charged %v for a piece of %v asleep and %v of CPU (%v wall)", got, tc.sleep, tc.spin, wall)
			}
		})
	}
}

// spinLevels is a Threads whose moves cost the thread cost of CPU each, as
// a cgroup v1 move costs the server's thread 4-35 us.
type spinLevels struct{ cost time.Duration }

func (spinLevels) Base() (int, bool) { return 0, true }
func (l spinLevels) Set(int) error {
	for c0 := threadCPU(); threadCPU()-c0 < l.cost; {
	}
	return nil
}

// besideAnother is flow f (share 1, level 10) of shares cfg makes (three
// slots, no hold), while another flow's piece moves: f is not alone, and
// its pieces move at its level. The other piece ends with the test.
func besideAnother(t *testing.T, cfg Config) *Flow {
	cfg.Slots, cfg.Hold = 3, time.Minute
	cfg.Nice = func(float64, sched.Class) int { return 10 }
	sh := New(cfg)
	f, other := sh.Flow("f"), sh.Flow("other")
	f.Set(1, sched.Default)
	busy, err := other.Turn(context.Background(), time.Time{}, nil, false)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(busy.Done) // on the test's goroutine, which took the turn (and its thread)
	return f
}

// Moving a piece's thread to its flow's weight and back is the piece's
// CPU, charged to its function: read around the moves, a function's pieces
// cost it none of them (two moves of 2 ms here: 4 ms to the piece).
func TestMovingThePiecesThreadIsItsCost(t *testing.T) {
	const cost = 2 * time.Millisecond
	f := besideAnother(t, Config{Threads: spinLevels{cost}})
	done := make(chan error)
	go func() {
		tn, err := f.Turn(context.Background(), time.Time{}, nil, false)
		if err == nil && !tn.niced {
			err = errors.New("the piece did not move to its flow's weight")
		}
		tn.DoneMoved(64 << 10)
		done <- err
	}()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if got := time.Duration(f.cpu.Load()); got < 2*cost || got > 2*cost+5*time.Millisecond {
		t.Fatalf("charged %v for a piece whose thread's two moves cost %v each", got, cost)
	}
}

// A function deleted while its request's piece moves (Forget), and made
// anew under its name before the piece is done, is another function: the
// piece's CPU is the deleted one's, and must not reach Config.Charge under
// the name, which charges the new function's device flows with it.
func TestForgottenFlowChargesNoOne(t *testing.T) {
	var mu sync.Mutex
	charged := map[string]time.Duration{}
	sh := New(Config{Slots: 2, Charge: func(f *Flow, cpu time.Duration) bool {
		mu.Lock()
		charged[f.name] += cpu
		mu.Unlock()
		return true
	}})
	old := sh.Flow("fn")
	tn, err := old.Turn(context.Background(), time.Time{}, nil, false)
	if err != nil {
		t.Fatal(err)
	}
	sh.Forget("fn")   // deleted mid-request
	_ = sh.Flow("fn") // and deployed anew: its first request
	for c0 := threadCPU(); threadCPU()-c0 < 2*chargeEvery; {
	}
	tn.DoneMoved(64 << 10)
	mu.Lock()
	defer mu.Unlock()
	if got := charged["fn"]; got != 0 {
		t.Fatalf("the deleted function's piece charged %v to the name's new function", got)
	}
	if sh.Lookup("fn").Seconds() != 0 {
		t.Fatal("the new function's I/O time counts the deleted one's piece")
	}
}

// While Config.Weighing says the workers are no longer weighed (their
// weights turned off after a failure: they run at the server's), a piece
// moves at the server's level, not its flow's, where it would wait behind
// them; once it says yes again, at its flow's.
func TestNoPieceMovesLightWhileWorkersAreNotWeighed(t *testing.T) {
	var weighed atomic.Bool
	th := &levels{at: map[int]int{}}
	f := besideAnother(t, Config{Threads: th, Weighing: weighed.Load})
	for _, on := range []bool{false, true} {
		weighed.Store(on)
		moved := make(chan bool)
		go func() {
			tn, err := f.Turn(context.Background(), time.Time{}, nil, false)
			if err != nil {
				t.Error(err)
			}
			niced := tn.niced
			tn.Done()
			moved <- niced
		}()
		if got := <-moved; got != on {
			t.Errorf("workers weighed %v: the piece moved at its flow's level %v, want %v", on, got, on)
		}
	}
}

// A name forgotten (a delete) while it is made anew (the name's next
// function's first request) ends with one flow: the I/O flow the name has
// is the one its scheduler has. Forget let go of the flows' lock before
// it dropped the name's scheduler flow, and a Flow between the two took
// the deleted function's scheduler flow (its place in the turns' order,
// its pieces in flight) for the new function, a flow its scheduler no
// longer knew. Run with -race: charges go on beside.
func TestForgetBesideFlowKeepsOneFlowPerName(t *testing.T) {
	var charges atomic.Int64
	sh := New(Config{Slots: 2, Charge: func(*Flow, time.Duration) bool { charges.Add(1); return true }})
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	run := func(f func()) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				f()
			}
		}()
	}
	run(func() { sh.Forget("fn") })
	run(func() { sh.Flow("fn").charge(chargeEvery) })
	defer func() { cancel(); wg.Wait() }()
	for i := 0; i < 200000; i++ {
		sh.mu.Lock()
		f := sh.flows["fn"]
		bad := f != nil && sh.s.Lookup("fn") != f.f
		sh.mu.Unlock()
		if bad {
			t.Fatalf("after %d looks: the name's I/O flow has a scheduler flow its scheduler does not know by the name", i)
		}
	}
}

// A flow's touches reach its scheduler once in touchEvery at most, on
// the monotonic clock from the process's start: the first always does,
// even within touchEvery of the start.
func TestTouchIsThrottled(t *testing.T) {
	sh := New(Config{})
	f := sh.Flow("f")
	for _, tt := range []struct {
		at    time.Duration // after epoch
		touch bool
	}{
		{time.Millisecond, true}, // the first, within touchEvery of the start
		{2 * time.Millisecond, false},
		{time.Millisecond + touchEvery - 1, false},
		{time.Millisecond + touchEvery, true},
		{time.Millisecond, false}, // a caller's time read earlier
		{3 * touchEvery, true},
	} {
		before := f.touched.Load()
		f.Touch(epoch.Add(tt.at))
		if got := f.touched.Load() != before; got != tt.touch {
			t.Errorf("a touch at epoch+%v: reached the scheduler %v, want %v", tt.at, got, tt.touch)
		}
	}
}

// A panic between a piece's admission and its caller's hold on the turn
// (here in the Weighing callback, as a piece beside another flow's is
// about to take its flow's level) ends the turn: its slot goes to the
// next piece, where it was kept for good.
func TestAPanicTakingATurnGivesItsSlotBack(t *testing.T) {
	th := &levels{at: map[int]int{}}
	sh := New(Config{Slots: 2, NoReserve: true, Hold: time.Minute, Threads: th,
		Nice:     func(float64, sched.Class) int { return 10 },
		Weighing: func() bool { panic("weighing") }})
	a, b := sh.Flow("a"), sh.Flow("b")
	a.Set(1, sched.Default) // level 10
	// b's piece in flight: a is not alone.
	busy, err := b.Turn(context.Background(), time.Time{}, nil, false)
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Done()
	func() {
		defer func() {
			if v := recover(); v != "weighing" {
				t.Fatalf("recovered %v, want the callback's panic", v)
			}
		}()
		a.Turn(context.Background(), time.Time{}, nil, false)
	}()
	if moving, _, _ := a.Pieces(); moving != 0 {
		t.Errorf("%d of a's pieces counted moving after the panic, want 0", moving)
	}
	// The slot a's panicked turn was admitted to is free again.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	tn, err := a.Turn(ctx, time.Time{}, nil, true) // may block: not weighed
	if err != nil {
		t.Fatalf("a turn after the panic: %v; want the slot it held given back", err)
	}
	tn.Done()
}

// panicLevels is a Threads whose Set panics moving a thread to one level.
type panicLevels struct{ at int }

func (panicLevels) Base() (int, bool) { return 0, true }
func (p panicLevels) Set(n int) error {
	if n == p.at {
		panic(fmt.Sprint("set ", n))
	}
	return nil
}

// panicLog is a slog.Handler that panics on every record.
type panicLog struct{}

func (panicLog) Enabled(context.Context, slog.Level) bool  { return true }
func (panicLog) Handle(context.Context, slog.Record) error { panic("log") }
func (h panicLog) WithAttrs([]slog.Attr) slog.Handler      { return h }
func (h panicLog) WithGroup(string) slog.Handler           { return h }

// A Config.Threads whose Set panics, moving a piece's thread to its flow's
// level or back, is a Set that failed: the turn ends, its slot and niced
// thread are given back (the niced count is of a few threads only, and a
// panic in Done kept the slot for good), and pieces move at the server's
// level from then on, which is logged. A logger that panics telling of it
// panics the turn's caller, but only once the turn has ended. (That the
// goroutine keeps the thread whose level is unknown is not looked at: Go
// tells no goroutine how often it is locked.)
func TestAPanicSettingALevelEndsTheTurn(t *testing.T) {
	for _, tt := range []struct {
		name      string
		at        int
		niced     bool // the turn's thread took its flow's level
		logPanics bool
	}{
		{"to the flow's level", 10, false, false},
		{"back to the server's", 0, true, false},
		{"to the flow's level, its log panicking", 10, false, true},
		{"back to the server's, its log panicking", 0, true, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var logged bytes.Buffer
			log := slog.New(slog.NewTextHandler(&logged, nil))
			if tt.logPanics {
				log = slog.New(panicLog{})
			}
			sh := New(Config{Slots: 2, NoReserve: true, Hold: time.Minute, Threads: panicLevels{tt.at},
				Nice: func(float64, sched.Class) int { return 10 }, Log: log})
			a, b := sh.Flow("a"), sh.Flow("b")
			a.Set(1, sched.Default)                                           // level 10
			busy, err := b.Turn(context.Background(), time.Time{}, nil, true) // a not alone
			if err != nil {
				t.Fatal(err)
			}
			done := make(chan error)
			go func() {
				defer func() {
					v := recover()
					switch {
					case v == "log" && tt.logPanics:
						done <- nil
					case v != nil:
						done <- fmt.Errorf("panicked: %v", v)
					}
				}()
				tn, err := a.Turn(context.Background(), time.Time{}, nil, false)
				if err != nil {
					done <- err
					return
				}
				niced := tn.niced
				tn.Done()
				if niced != tt.niced {
					done <- fmt.Errorf("the turn niced %v, want %v", niced, tt.niced)
					return
				}
				if tt.logPanics {
					done <- errors.New("the logger's panic was not seen")
					return
				}
				done <- nil
			}()
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			busy.Done()
			if n := sh.niced.Load(); n != 0 {
				t.Errorf("%d threads counted niced after the turn, want 0", n)
			}
			if moving, _, _ := a.Pieces(); moving != 0 {
				t.Errorf("%d of a's pieces counted moving, want 0", moving)
			}
			// Both slots are free: two pieces take them at once.
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			for range 2 {
				tn, err := a.Turn(ctx, time.Time{}, nil, true)
				if err != nil {
					t.Fatalf("a turn after the panic: %v; want its slot given back", err)
				}
				defer tn.Done()
			}
			if sh.niceOK.Load() {
				t.Error("pieces may still move niced after a thread's level could not be set")
			}
			if want := fmt.Sprintf("level %d: set %d", tt.at, tt.at); !tt.logPanics && strings.Count(logged.String(), want) != 1 {
				t.Errorf("logged %q, want the failed move once", logged.String())
			}
		})
	}
}

// A panic while a piece waits for its turn (here its gone callback),
// recovered by a transport, takes it out of the waiting gauge
// (plover_io_pieces{state="waiting"}), which it stayed in for good, and
// out of its flow's queue in the scheduler.
func TestAPanicWaitingForATurnLeavesNothingWaiting(t *testing.T) {
	sh := New(Config{Slots: 1, NoReserve: true, Hold: time.Minute})
	a, b := sh.Flow("a"), sh.Flow("b")
	busy, err := b.Turn(context.Background(), time.Time{}, nil, true)
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Done()
	func() {
		defer func() {
			if v := recover(); v != "gone" {
				t.Fatalf("recovered %v, want the gone callback's panic", v)
			}
		}()
		a.Turn(context.Background(), time.Time{}, func() bool { panic("gone") }, true)
	}()
	if moving, _, waiting := a.Pieces(); moving != 0 || waiting != 0 {
		t.Errorf("a's pieces after the panic: moving %d, waiting %d; want none", moving, waiting)
	}
	if n := a.f.Waiting(); n != 0 {
		t.Errorf("a's runs queued in the scheduler after the panic: %d, want 0", n)
	}
}

// A piece that may block and stalls while no other piece waits (a client
// that paused its chunked or TLS upload) keeps its slot until the next
// piece comes, and is charged in the turns' order at most Config.Hold for
// it, as DoneMoved would charge it: its flow, backlogged beside another
// from then on, gets its share of the next turns at once. Charged the 5 s
// it stalled, it had none of the next several thousand, about 5 s of the
// other flow's pieces.
func TestStalledPieceChargedAtMostItsHold(t *testing.T) {
	if testing.Short() {
		t.Skip("a 5 s stall")
	}
	sh := New(Config{Slots: 1, Hold: 2 * time.Millisecond})
	a, b := sh.Flow("a"), sh.Flow("b")
	stalled, err := a.Turn(context.Background(), time.Time{}, nil, true)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(5 * time.Second) // its client pauses; nobody else waits
	defer stalled.DoneMoved(1)

	const total = 200
	var mu sync.Mutex
	var order []*Flow
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	for _, f := range []*Flow{a, a, a, a, b, b, b, b} { // each flow always has pieces waiting
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				tn, err := f.Turn(ctx, time.Time{}, nil, false)
				if err != nil {
					return
				}
				work()
				mu.Lock()
				if len(order) < total {
					order = append(order, f)
				} else {
					cancel()
				}
				mu.Unlock()
				tn.Done()
			}
		}()
	}
	wg.Wait()
	na := 0
	for _, f := range order {
		if f == a {
			na++
		}
	}
	if na < total/4 {
		t.Fatalf("after a piece of it stalled 5 s with nobody waiting, flow a had %d of the next %d turns beside b at equal shares, want about half", na, total)
	}
}

// A piece that may block and stalls past Config.Hold while another waits
// gives its slot to that one, and counts stalled from then, not moving
// (plover_io_pieces): it holds no turn. Counted moving, 60 paused chunked
// uploads showed as 60 pieces in turn on a server of 2 slots, for as long
// as they paused. Once it ends it counts nowhere.
func TestStalledPieceCountsStalled(t *testing.T) {
	sh := New(Config{Slots: 1, NoReserve: true, Hold: 2 * time.Millisecond})
	a, b := sh.Flow("a"), sh.Flow("b")
	stalled, err := a.Turn(context.Background(), time.Time{}, nil, true)
	if err != nil {
		t.Fatal(err)
	}
	if moving, st, waiting := a.Pieces(); moving != 1 || st != 0 || waiting != 0 {
		t.Fatalf("a piece in its turn counts moving %d, stalled %d, waiting %d; want 1, 0, 0", moving, st, waiting)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	next, err := b.Turn(ctx, time.Time{}, nil, false) // its slot goes to this one at the hold
	if err != nil {
		t.Fatal(err)
	}
	if moving, st, _ := a.Pieces(); moving != 0 || st != 1 {
		t.Errorf("a piece whose slot went to another at its hold counts moving %d, stalled %d; want 0, 1", moving, st)
	}
	if moving, st, _ := b.Pieces(); moving != 1 || st != 0 {
		t.Errorf("the piece that took its slot counts moving %d, stalled %d; want 1, 0", moving, st)
	}
	next.Done()
	stalled.DoneMoved(1)
	if moving, st, waiting := a.Pieces(); moving != 0 || st != 0 || waiting != 0 {
		t.Errorf("the stalled piece, ended, counts moving %d, stalled %d, waiting %d; want none", moving, st, waiting)
	}
	// Its slot is the scheduler's to lend again, once.
	for range 3 {
		tn, err := a.Turn(ctx, time.Time{}, nil, true)
		if err != nil {
			t.Fatal(err)
		}
		tn.DoneMoved(1)
	}
	if moving, st, _ := a.Pieces(); moving != 0 || st != 0 {
		t.Errorf("after three more pieces: moving %d, stalled %d; want none", moving, st)
	}
}

// A flow's name is kept past the call that made it, here and in the
// device scheduler under it: a caller's string over bytes it reuses (a
// request's path, borrowed) leaves the flow found by the name it had.
func TestFlowKeepsItsOwnName(t *testing.T) {
	buf := []byte("fn-a")
	borrowed := unsafe.String(&buf[0], len(buf))
	sh := New(Config{Off: true, Charge: func(*Flow, time.Duration) bool { return true }})
	f := sh.Flow(borrowed)
	copy(buf, "fn-b") // the request's buffer, another's now
	if sh.Lookup("fn-a") != f || sh.Lookup("fn-b") != nil {
		t.Error("the I/O flow's key changed with the caller's bytes")
	}
	if sh.s.Lookup("fn-a") == nil || sh.s.Lookup("fn-b") != nil {
		t.Error("the device scheduler's flow key changed with the caller's bytes")
	}
}
