// Package ioshare moves the server's own I/O on functions' bytes by their
// shares: a request's body is read, and its answer written, a piece at a
// time, each piece in its function's turn, ordered by the same policy that
// orders device runs (share, priority class; package sched), so that the
// tenant with the largest bodies cannot take the server's CPU from the
// others. A flow whose body is not read waits in its own socket: TCP flow
// control stops its sender there, at no cost to the server.
//
// The mechanism is sched's: a Scheduler whose slots are pieces in flight
// (Config.Slots, one kept for light functions unless Config.NoReserve:
// the CPUs their requests need besides the pieces), whose runs are pieces,
// charged the CPU time the server's thread spent on them (its thread's
// clock: not the waits of a thread preempted in its turn), each holding
// its slot at most
// Config.Hold (a piece that blocks past it, a TLS record or a chunk still
// arriving, gives its slot up, so no client holds another's turn). Every
// request touches its function's flow (Flow.Touch), so that a light one
// counts as about though its bytes need no turn. While it moves a piece
// the server's thread runs at the function's CPU weight (Config.Nice), not
// the server's: the kernel then weighs the server's work on a tenant's
// bytes as it weighs that tenant's worker. What a function's pieces cost
// is its I/O time (Flow.Seconds), also charged to its runs' share on every
// device (Config.Charge), so that a function that costs the server more
// gets fewer turns there too. Moving a piece in turn is conn.go's.
package ioshare

import (
	"context"
	"log/slog"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/plover-run/plover/cgrouplimit"
	"github.com/plover-run/plover/sched"
)

// Config configures the server's I/O shares.
type Config struct {
	// Off moves bytes as they come, unscheduled (for comparison, and
	// plover serve --sched off); pieces are still counted and charged.
	Off bool
	// Slots is how many pieces move at once (default: the CPUs), one of
	// them kept for light functions where there are two or more (none
	// with NoReserve).
	Slots int
	// NoReserve keeps no slot for light functions: every slot goes to
	// whichever piece waits (plover serve --sched fair-no-reserve, as on
	// the devices).
	NoReserve bool
	// Nice, when set, is the level (a nice level's scale: higher is
	// lighter) the server's thread takes while it moves a piece of a
	// function of that share and priority class; where the server cannot
	// take its threads back (no CAP_SYS_NICE for nice levels) it is not
	// used.
	Nice func(share float64, class sched.Class) int
	// Threads moves the thread to a level and back (nil: nice levels,
	// NiceLevels).
	Threads Threads
	// Piece is the most bytes one turn moves (default 256 KiB): what a
	// latency-class piece waits for at most, a slot's worth.
	Piece int
	// Hold bounds a turn (default 2 ms): a piece that blocks past it
	// gives its slot up, charged what it held.
	Hold time.Duration
	// Weighing, when set, reports whether the workers are still weighed:
	// while it says no (their weights turned off after a failure: they
	// run at the server's weight), no piece moves at a function's, where
	// it would wait behind them.
	Weighing func() bool
	// Log hears of a thread whose level could not be set (Threads.Set
	// failed or panicked), after which pieces move at the server's level
	// (nil: not told).
	Log *slog.Logger
	// Policy orders waiting pieces ("": sched.DefaultPolicy).
	Policy string
	// Flooding, when set, reports whether the function named floods its
	// devices (two or more runs at once, lately; a pipeline by its first
	// step's function): its touches keep no slot for it. A flood of small requests never needs a turn, and
	// counted light by its touches it kept a slot from the floods of
	// large bodies for as long as it flooded.
	Flooding func(name string) bool
	// Recent is how long a light function's request keeps the slot kept
	// for light functions (sched.Config.Recent; 0: sched.DefaultRecent).
	Recent time.Duration
	// Charge, when set, is told each piece's CPU time with its flow: the
	// engine charges the function's device flows with it. The flow, not
	// its name: a charge may be on its way as its function is deleted
	// and made anew under the name (Forget and Flow), and the name's next
	// function must not pay; the callee checks that f is still its
	// name's, atomically with its charge. It
	// reports whether any took it: a function's first body is read before
	// it has a device flow, and what it cost stays owed until one does
	// (at most maxKept of it, offered again with each chargeEvery more).
	Charge func(f *Flow, cpu time.Duration) bool
}

// Shares is a node's I/O shares: a flow per function.
type Shares struct {
	cfg Config
	s   *sched.Scheduler

	mu    sync.Mutex
	flows map[string]*Flow
	base  int // the server's threads' nice level (Config.Nice)

	// niceOK is set while pieces may move niced (Config.Nice, and every
	// level taken back so far); niced counts the threads niced now, kept
	// below the Go scheduler's Ps (nice.go).
	niceOK atomic.Bool
	niced  atomic.Int32
	// lostLogged says stopNicing logged: the failure is logged once.
	lostLogged atomic.Bool

	// rate is what a byte of a non-blocking piece costs the server's
	// thread, in ps (0: not learnt yet): the bound of what a piece that
	// may block is charged (blockingCost).
	rate atomic.Int64
}

// New returns the shares cfg describes.
func New(cfg Config) *Shares {
	if cfg.Slots <= 0 {
		cfg.Slots = cgrouplimit.CPUs()
	}
	if cfg.Piece <= 0 {
		cfg.Piece = 256 << 10
	}
	if cfg.Hold <= 0 {
		cfg.Hold = 2 * time.Millisecond
	}
	reserve := 1
	if cfg.NoReserve {
		reserve = 0
	}
	sh := &Shares{cfg: cfg, flows: map[string]*Flow{},
		s: sched.New(sched.Config{MaxRuns: cfg.Slots, Reserve: reserve, PolicyName: cfg.Policy, Recent: cfg.Recent})}
	if cfg.Threads == nil {
		sh.cfg.Threads = NiceLevels{}
	}
	if cfg.Nice != nil {
		var ok bool
		sh.base, ok = sh.cfg.Threads.Base()
		sh.niceOK.Store(ok)
	}
	return sh
}

// Threads puts the calling thread at a CPU weight while it moves a piece:
// its nice level (NiceLevels), or a CPU group of that weight where the
// server's threads are weighed by group (package worker's).
type Threads interface {
	// Base is the server's threads' level, and whether a thread moved
	// to another can be taken back to it (tried once, at start).
	Base() (level int, ok bool)
	// Set moves the calling thread, locked to its goroutine, to level
	// (Base's: back). The level is over Base's.
	Set(level int) error
}

// CanWeigh reports whether this process may move pieces at their
// functions' CPU weights by nice level: raise a thread's nice level and
// take it back.
func CanWeigh() bool {
	_, ok := NiceLevels{}.Base()
	return ok
}

// Weighed reports whether pieces move at their functions' CPU weights
// (Config.Nice, where the server may).
func (s *Shares) Weighed() bool { return s.niceOK.Load() }

// Piece is the most bytes a turn moves.
func (s *Shares) Piece() int { return s.cfg.Piece }

// Flow returns the flow of the function called name, creating it (with a
// copy of name: it is kept).
func (s *Shares) Flow(name string) *Flow {
	s.mu.Lock()
	defer s.mu.Unlock()
	f := s.flows[name]
	if f == nil {
		name = strings.Clone(name) // not a borrowed request's bytes
		f = &Flow{sh: s, name: name, f: s.s.Flow(name)}
		s.flows[name] = f
	}
	return f
}

// Lookup returns name's flow, or nil: no piece of it moved yet.
func (s *Shares) Lookup(name string) *Flow {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.flows[name]
}

// Forget drops name's flow (a deleted function); its turns in flight end
// as they would. The scheduler's flow goes under s.mu too: a Flow of the
// name between the two would take the deleted function's scheduler flow
// for the next one.
func (s *Shares) Forget(name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if f := s.flows[name]; f != nil {
		f.gone.Store(true)
	}
	delete(s.flows, name)
	s.s.Forget(name)
}

// Flow is one function's share of the server's I/O.
type Flow struct {
	sh   *Shares
	name string
	f    *sched.Flow
	cpu  atomic.Int64 // ns the server's threads spent on its pieces
	owed atomic.Int64 // ns of it not yet passed to Config.Charge
	kept atomic.Int64 // ns Config.Charge did not take: offered with the next owed

	moving, waiting atomic.Int32                // its pieces in turn, and waiting for one
	bodies, landed  atomic.Int32                // its request bodies being read, and of them those in a slot (Bodies)
	nice            atomic.Int32                // the level its pieces move at (Config.Nice)
	set             atomic.Pointer[weightClass] // what Set applied last
	setMu           sync.Mutex                  // Set's changes, one at a time
	touched         atomic.Int64                // its last Touch, ns since epoch (0: none)
	// gone is set once its function is deleted (Forget): its pieces still
	// in flight pass nothing to Config.Charge, which charges by name, and
	// the name's next function is another.
	gone atomic.Bool
}

// Name is the name of the function the flow is (or was, once Forget
// dropped it) the share of.
func (f *Flow) Name() string { return f.name }

// Forgotten reports whether the flow's function was deleted (Forget): a
// holder that outlives requests (a connection's) takes no more turns in
// it.
func (f *Flow) Forgotten() bool { return f.gone.Load() }

type weightClass struct {
	w float64
	c sched.Class
}

// Set gives the flow its function's weight (share) and class; the same
// again costs a load (it comes with every request). Requests that read two
// versions of a redeployed function may race here: applied under setMu and
// cached last, the cache always says what was applied, so the newer
// version's next request applies it if the older one's came last.
func (f *Flow) Set(weight float64, class sched.Class) {
	if wc := f.set.Load(); wc != nil && wc.w == weight && wc.c == class {
		return
	}
	f.setMu.Lock()
	defer f.setMu.Unlock()
	if wc := f.set.Load(); wc != nil && wc.w == weight && wc.c == class {
		return
	}
	f.f.Set(weight, class)
	if n := f.sh.cfg.Nice; n != nil {
		f.nice.Store(int32(max(n(weight, class), f.sh.base)))
	}
	f.set.Store(&weightClass{weight, class})
}

// Touch says the flow's function has a request now, though none of its
// bytes need a turn (a small body, read with the headers): a light
// function keeps the slots kept for light functions free of floods while
// it is about (sched.Flow.Touch). now is the request's time, already read.
func (f *Flow) Touch(now time.Time) {
	if f == nil || f.sh.cfg.Off {
		return
	}
	// Once in touchEvery is as good as every time: it marks the flow
	// about for sched's Recent (Config.Recent, a second by default). On
	// the monotonic clock: a wall clock stepped back an hour would skip
	// every touch for that hour.
	at := int64(now.Sub(epoch))
	if last := f.touched.Load(); last != 0 && at-last < int64(touchEvery) || !f.touched.CompareAndSwap(last, at) {
		return
	}
	if fl := f.sh.cfg.Flooding; fl != nil && fl(f.name) {
		return
	}
	f.f.Touch()
}

// touchEvery is how often a flow's requests touch its scheduler.
const touchEvery = 10 * time.Millisecond

// alonePieces is how many pieces' bytes a turn moves while its flow has
// the server's I/O to itself: as few system calls as reading and writing
// unscheduled (a 4 MB body in 256 KiB pieces cost 0.6x an echo floor's
// 4-client throughput against 0.8x in 1 MiB windows, BENCHMARKS.md).
const alonePieces = 4

// Seconds is the server's CPU time on the flow's bytes so far.
func (f *Flow) Seconds() float64 { return time.Duration(f.cpu.Load()).Seconds() }

// Pieces is how many of the flow's pieces move now (hold a turn), how
// many stalled (a piece that may block, blocked on its client past
// Config.Hold while another piece waited: its slot went to that one, and
// it holds none, though it has not ended), and how many wait for a turn.
// A stalled piece counted moving was a chunked or TLS upload that paused,
// shown moving for as long as it paused, up to the read timeout.
func (f *Flow) Pieces() (moving, stalled, waiting int) {
	m := int(f.moving.Load())
	// At most every piece counted: a piece's slot may expire between its
	// admission and its count (Turn), its turn's end is counted after its
	// ticket's (endTurn).
	st := min(f.f.Overran(), m)
	return m - st, st, int(f.waiting.Load())
}

// Reading counts one of the flow's request bodies whose reading past what
// came with its headers starts (1) or ends (-1); Landed counts one of
// them that is read into a slot of its function's worker as it is lent
// (1) and as it is given back or the body ends (-1). The transport
// counts them; a nil flow counts nothing.
func (f *Flow) Reading(n int) {
	if f != nil {
		f.bodies.Add(int32(n))
	}
}

// Landed: see Reading.
func (f *Flow) Landed(n int) {
	if f != nil {
		f.landed.Add(int32(n))
	}
}

// Bodies is how many of the flow's request bodies are being read now past
// what came with their headers: into a slot of its function's worker,
// and into the server's memory (no slot lent, not yet, or given back).
func (f *Flow) Bodies() (inSlot, inMemory int) {
	all, landed := int(f.bodies.Load()), int(f.landed.Load())
	inSlot = min(max(landed, 0), max(all, 0)) // the two are read one after the other
	return inSlot, max(all, 0) - inSlot
}

// Turn is a flow's turn to move one piece; Done ends it, deferred where
// what moves the piece may panic: until then its thread may be at the
// function's CPU weight and locked to its goroutine, which a recovered
// panic leaves serving other work there.
type Turn struct {
	f      *Flow
	t      sched.Ticket
	start  time.Duration // mono()
	niced  bool          // its thread took the flow's nice level (and is locked)
	cpu0   time.Duration // its thread's CPU time at its start (threadCPU; -1: not read)
	alone  bool          // its flow had the server's I/O to itself when it began
	blocks bool          // its piece may block (Turn's mayBlock)
}

// Piece is the most bytes the turn moves: Config.Piece, or, while its flow
// has the server's I/O to itself, alonePieces of them (work conserving:
// alone, a flow reads and writes as fast as unscheduled). Its flow's
// pieces move at the server's CPU weight then too: its weight is to share
// the CPU with others' work, and there is none.
func (t Turn) Piece() int {
	if t.f == nil {
		return 0
	}
	if t.alone {
		return alonePieces * t.f.sh.cfg.Piece
	}
	return t.f.sh.cfg.Piece
}

// Alone reports whether the turn's flow had the server's I/O to itself
// when it began (Piece is then alonePieces of them): work conserving, a
// reader may take more than it was asked for.
func (t Turn) Alone() bool { return t.alone }

// admit waits for the piece's slot, counted waiting meanwhile. The count
// comes down in a defer: a panic while the piece waits (its gone callback,
// the policy), recovered by a transport, would otherwise leave the
// plover_io_pieces{state="waiting"} gauge up for good.
func (f *Flow) admit(ctx context.Context, deadline time.Time, gone func() bool) (sched.Ticket, error) {
	f.waiting.Add(1)
	defer f.waiting.Add(-1)
	t, _, err := f.f.AdmitHold(ctx, deadline, f.sh.cfg.Hold, gone)
	return t, err
}

// Turn waits for the flow's turn to move a piece: at once while a slot is
// free and no piece waits; otherwise when the policy picks it. It fails
// when ctx ends, deadline passes (sched.ErrDeadline) or gone says the
// client left (sched.ErrGone). mayBlock says the piece may wait for its
// peer inside the turn (TLS, a chunked body: no socket readiness to wait on
// first): its cost is then counted by its bytes (DoneMoved), at most
// Config.Hold, and its thread is never niced (a thread locked while its
// piece waits would be one held per slow client). A nil flow's turn counts
// nothing: transports need not check.
func (f *Flow) Turn(ctx context.Context, deadline time.Time, gone func() bool, mayBlock bool) (Turn, error) {
	if f == nil {
		return Turn{}, nil
	}
	var t sched.Ticket
	if !f.sh.cfg.Off {
		var err error
		t, err = f.admit(ctx, deadline, gone)
		if err != nil {
			return Turn{}, err
		}
	}
	f.moving.Add(1)
	tn := Turn{f: f, t: t, blocks: mayBlock, cpu0: -1, start: mono()}
	// Until the caller holds the turn (and defers its Done), a panic here
	// (the policy's Alone, the Weighing callback) would keep its slot for
	// good: the turn ends, and the thread is let go, before it goes on.
	locked := false
	defer func() {
		if v := recover(); v != nil {
			f.moving.Add(-1)
			t.Done()
			if locked {
				runtime.UnlockOSThread()
			}
			panic(v)
		}
	}()
	tn.alone = f.sh.cfg.Off || f.f.Alone()
	if !mayBlock {
		// Its thread is its own until Done, so that the thread's CPU
		// time is the piece's, moving it to the flow's weight and back
		// included (a cgroup v1 move takes 4-35 us).
		runtime.LockOSThread()
		locked = true
		tn.cpu0 = threadCPU()
		if !tn.alone {
			tn.niced = f.sh.nice(int(f.nice.Load()))
		}
	}
	return tn, nil
}

// Done ends the turn: its slot goes to the next piece, and the flow is
// charged the piece's time: the server's CPU on it, its thread's CPU time
// for a non-blocking system call (the wait of a thread preempted while it
// held the turn is not the function's), or at most Config.Hold of a piece
// that may block. DoneMoved is better where the piece's bytes are known.
func (t Turn) Done() { t.DoneMoved(-1) }

// DoneMoved is Done for a piece that moved n bytes. A piece that may block
// holds its slot its wall time (at most Config.Hold), and is charged that
// in the turns' order: the slot was not another flow's. Its function is
// charged no more than n bytes cost the server, at the rate its
// non-blocking pieces cost (blockingCost): its wall time is mostly its
// peer's, and a client trickling a chunked or TLS body a few bytes at a
// time must not charge its function's I/O time and device share 2 ms a
// piece. A non-blocking piece of at least rateSample bytes, moved at the
// server's own weight, teaches the rate (one moved to its flow's weight
// and back also paid for the moves).
//
// A non-blocking piece is charged its thread's CPU time, in the turns'
// order too: a flow whose pieces are preempted (at a light weight, behind
// heavier work) has not had the server's CPU while it waited. But one that
// held its slot past Config.Hold while another flow waited was charged
// Config.Hold when the slot went to the next (sched's expiry): in the
// turns' order a piece pays for its slot's time up to the hold, and no
// more for a stall nobody waited behind, whether it blocked (its client
// paused) or not; its function's I/O time is still its CPU, or its
// bytes' cost.
func (t Turn) DoneMoved(n int) {
	if t.f == nil {
		return
	}
	sh := t.f.sh
	var lost error
	if t.niced {
		lost = sh.unnice() // first: the move back is the piece's CPU too
	}
	end := mono()
	held := end - t.start
	cpu := held
	if t.blocks {
		held = min(held, sh.cfg.Hold)
		cpu = held
		if n >= 0 {
			cpu = min(cpu, sh.blockingCost(n))
		}
	} else {
		if c := threadCPU(); c >= 0 && t.cpu0 >= 0 {
			cpu = min(c-t.cpu0, held)
		}
		held = cpu
		if n >= rateSample && !t.niced {
			sh.learnRate(cpu, n)
		}
		runtime.UnlockOSThread()
	}
	t.f.endTurn(t.t, Instant(end).Time(), max(held, 1)) // 0 would charge the slot time
	t.f.charge(cpu)
	if lost != nil {
		sh.stopNicing(lost)
	}
}

// endTurn ends a turn's ticket, then counts the turn ended: a piece whose
// slot expired leaves the scheduler's Overran first, so that for the
// instant between the two it counts moving (Pieces), not as stalled in
// another piece's place, which moves. Deferred: a panic in the policy (the
// ticket's end) must not leave the plover_io_pieces gauge up for good.
func (f *Flow) endTurn(t sched.Ticket, end time.Time, used time.Duration) {
	defer f.moving.Add(-1)
	t.DoneUsed(end, used)
}

// A piece that may block is charged its bytes at blockingFactor times the
// rate non-blocking pieces cost the server's thread (a system call and a
// copy, per byte, learnt as they move): TLS decrypts its records beside the
// copy (about as much again, AES-GCM at 5.6 GB/s on the 2-core machine of
// BENCHMARKS.md), a chunked body is parsed. defaultRate is that rate before
// any piece taught it (and under TLS, where no piece is non-blocking): a
// copy at 2 GB/s.
const (
	blockingFactor = 2
	defaultRate    = 500 // ps a byte
	rateSample     = 16 << 10
)

// blockingCost is what n bytes moved by a piece that may block cost.
func (s *Shares) blockingCost(n int) time.Duration {
	r := s.rate.Load()
	if r == 0 {
		r = defaultRate
	}
	return time.Duration(int64(n) * r * blockingFactor / 1000)
}

// learnRate moves the per-byte rate an eighth of the way to what a
// non-blocking piece of n bytes cost. Pieces race here: one's sample may
// be lost, which a rate does not notice.
func (s *Shares) learnRate(cpu time.Duration, n int) {
	sample := int64(cpu) * 1000 / int64(n)
	r := s.rate.Load()
	if r == 0 {
		r = sample
	}
	s.rate.Store(r + (sample-r)/8)
}

// Instant is a reading of the clock the server's work on a function's
// bytes is measured on: the monotonic clock since the process began, at
// about half a time.Now (which reads the wall clock too). A request reads
// it at each step's end and takes that as the next step's start: decoding
// its body, finding its function, laying its inputs out and encoding its
// answer cost a microsecond or two together, and each clock read on this
// machine tens of nanoseconds.
type Instant time.Duration

// Now reads the clock.
func Now() Instant { return Instant(mono()) }

// Elapsed is the time since i.
func (i Instant) Elapsed() time.Duration { return mono() - time.Duration(i) }

// Time is i as a time.Time with its monotonic reading, for code that
// takes a start or a deadline as one.
func (i Instant) Time() time.Time { return epoch.Add(time.Duration(i)) }

// MeteredSince charges the flow the work on its bytes since start that
// needed no turn (decoding a body already read, encoding an answer), as
// Done charges a turn's time (the flow's Seconds, Config.Charge), and
// returns the clock's reading at its end. A nil flow's charges nothing.
func (f *Flow) MeteredSince(start Instant) Instant {
	now := Now()
	f.Metered(time.Duration(now - start))
	return now
}

// Metered charges the flow d of work on its bytes that needed no turn,
// measured before the flow was known (a gRPC call's message is decoded
// before the call is admitted and its function found, package grpcapi):
// as MeteredSince charges. A request that never finds its function's flow
// (refused, unknown) charges no one. A nil flow's charges nothing.
func (f *Flow) Metered(d time.Duration) {
	if f != nil {
		f.charge(d)
	}
}

// chargeEvery is how much of a flow's I/O time is passed to Config.Charge
// at once: a small request's decoding costs a microsecond or two, and
// charging the device flows takes their schedulers' locks; a share does
// not move by less.
const chargeEvery = 100 * time.Microsecond

// epoch makes mono (Instant's clock).
var epoch = time.Now()

// mono is the monotonic time since epoch.
func mono() time.Duration { return time.Since(epoch) }

// maxKept bounds what a flow keeps owed that nothing took: the device
// policy moves a flow at most a second of device time ahead of the others
// for charges beside its runs (sched.WFQ.Charged), so more would be cut
// there anyway, and a name that never gets a device flow (a function
// whose requests all fail before a run) owes no more for ever.
const maxKept = time.Second

func (f *Flow) charge(cpu time.Duration) {
	f.cpu.Add(int64(cpu))
	c := f.sh.cfg.Charge
	if c == nil || f.gone.Load() || f.owed.Add(int64(cpu)) < int64(chargeEvery) {
		return
	}
	// What was not taken waits apart, out of owed: it is offered again
	// once chargeEvery more is owed, not with every piece (each offer
	// takes every device scheduler's lock).
	if owed := f.owed.Swap(0) + f.kept.Swap(0); owed > 0 && !c(f, time.Duration(owed)) {
		f.kept.Add(min(owed, int64(maxKept)))
	}
}
