// Package funclog keeps what functions print. Each line a function's worker
// process writes to its stdout or stderr is kept, with its time, stream and
// worker pid, in a ring of that function's last lines (plover logs, GET
// /v1/functions/{name}/logs), handed to whoever follows the function
// (--follow), and traced in the server's own log at a bounded rate.
//
// Everything is bounded: a line at api.LogLineMax bytes (the rest is cut and
// counted), a function's ring at RingLines lines or RingBytes bytes, the
// rings together at TotalBytes, their slots counted (past it the largest
// ring loses a quarter of its lines), a follower's backlog at followBuffer lines and
// followBytes bytes (a follower that reads more slowly misses lines and is
// told how many, and still gets the last line it missed), and the server log at traceLines lines per function and
// traceTotal in all per traceWindow (then one line saying how many were not
// logged). Add never blocks: a function's printf never waits for a reader.
package funclog

import (
	"container/heap"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/plover-run/plover/api"
)

// The bounds (see the package comment).
const (
	RingLines    = 1000
	RingBytes    = 256 << 10
	TotalBytes   = 64 << 20
	followBuffer = 256
	// followBytes is a follower's whole backlog: its channel's slots and
	// the text of the lines queued in them. A line's text can be shared
	// with the ring only while the ring keeps it, and followers reading
	// at different paces hold different lines: bounded by lines alone,
	// 1,024 followers of 4 KiB lines could hold a GiB, past the rings'
	// TotalBytes many times over. With it, a node's logs hold at most
	// TotalBytes + MaxFollowersTotal*followBytes (128 MiB).
	followBytes = 64 << 10
	// followText is what followBytes leaves for the queued lines' text
	// once the slots and the line a full backlog keeps back (Missed: a
	// slot's worth and a whole line's text) are taken out (39 KiB): lines
	// up to 155 bytes still fill every slot, as under the line bound
	// alone; of 4 KiB lines a follower queues 9.
	followText = followBytes - (followBuffer+1)*followSlot - api.LogLineMax
	followSlot = int(unsafe.Sizeof(api.LogLine{}) + unsafe.Sizeof(int32(0))) // a channel slot and its size's record
	// Followers of one function and of all on a node: each line is
	// handed to, encoded for and written to every follower, so that a
	// client holding many that never read multiplied a printing
	// function's cost (300 of them cut another function's throughput to
	// a quarter, its p99 8x).
	MaxFollowers      = 32
	MaxFollowersTotal = 1024
	traceWindow       = 10 * time.Second
	traceLines        = 20
	traceTotal        = 100
	// lineOverhead is what a kept line costs besides its text (the
	// LogLine's fields), counted against the byte bounds.
	lineOverhead = 96
)

// Store holds every function's lines on a node.
type Store struct {
	log *slog.Logger
	// limits: the constants, shortened by tests
	ringLines, ringBytes, totalBytes int
	traceWindow                      time.Duration

	mu        sync.Mutex
	following int // followers not closed
	fns       map[string]*ring
	lives     map[string]*life // the current life of each name with a Sink
	bytes     int              // of all rings: their lines' text and their slots (lineOverhead each)
	// the server log's budget shared by all functions: traced lines in the
	// window that began at winStart
	winStart time.Time
	winCount int
}

// ring is one function's lines, oldest first from head, and its followers.
type ring struct {
	buf     []api.LogLine // circular; grows to ringLines
	head, n int
	bytes   int
	last    time.Time // the newest line's
	follow  map[*Follower]struct{}
	// its share of the server log: lines traced in the window that began
	// at winStart, lines not traced since the last summary, and the timer
	// that writes that summary
	winStart   time.Time
	winCount   int
	suppressed int
	summary    *time.Timer
}

// New returns an empty store that traces lines in log (nil: nowhere).
func New(log *slog.Logger) *Store {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Store{log: log, ringLines: RingLines, ringBytes: RingBytes, totalBytes: TotalBytes, traceWindow: traceWindow,
		fns: map[string]*ring{}, lives: map[string]*life{}}
}

// life is one lifetime of a function's name on this node: from its first
// Sink to its Forget (a delete). Lines a sink of an ended life brings are
// dropped, so that what a deleted function's worker prints as its last
// requests finish is not kept under the name, for whoever deploys it next.
type life struct{ over atomic.Bool }

// Sink is where one worker's output goes: the function it was loaded for,
// in the life of the name it was loaded in.
type Sink struct {
	s    *Store
	name string
	life *life
}

// Sink returns the sink of name's current life (a new life once Forget
// ended the last); nil for a nil Store.
func (s *Store) Sink(name string) *Sink {
	if s == nil {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	l := s.lives[name]
	if l == nil {
		l = &life{}
		s.lives[name] = l
	}
	return &Sink{s: s, name: name, life: l}
}

func size(l *api.LogLine) int { return len(l.Line) + lineOverhead }

// Add keeps l, a line of the function's output, hands it to its followers
// and traces it in the server log if the budget allows, unless the
// function's name was forgotten since the sink was made: then l is
// dropped. It never blocks.
func (k *Sink) Add(l api.LogLine) {
	s, name := k.s, k.name
	if k.life.over.Load() { // a deleted function's worker still printing: no lock
		return
	}
	s.mu.Lock()
	if k.life.over.Load() {
		s.mu.Unlock()
		return
	}
	r := s.fns[name]
	if r == nil {
		r = &ring{}
		s.fns[name] = r
	}
	r.push(s, l)
	for f := range r.follow {
		f.offer(l)
	}
	if s.bytes > s.totalBytes {
		s.evictTo(s.totalBytes - s.totalBytes/evictSlack)
	}
	trace := s.allowTrace(name, r, l.Time)
	s.mu.Unlock()
	if trace {
		s.log.Info("function output", "function", name, "stream", l.Stream, "pid", l.PID, "line", l.Line)
	}
}

// push appends l, dropping the oldest lines past the ring's bounds.
func (r *ring) push(s *Store, l api.LogLine) {
	if r.n == len(r.buf) && len(r.buf) < s.ringLines {
		r.resize(s, min(max(16, 2*len(r.buf)), s.ringLines))
	}
	if r.n == len(r.buf) {
		r.drop(s)
	}
	r.buf[(r.head+r.n)%len(r.buf)] = l
	r.n++
	r.bytes += size(&l)
	s.bytes += len(l.Line)
	r.last = l.Time
	for r.bytes > s.ringBytes && r.n > 1 {
		r.drop(s)
	}
}

// resize moves the ring's lines to an array of n slots (none for 0), at
// least r.n. The node's bound counts a ring's slots, not its lines: a
// ring trimmed by evict kept its array, and rings of many functions
// trimmed in turn held three slots for each line counted (a review's
// probe: 2.4 million slots, 186 MiB, for 3,000 functions under a 64 MiB
// bound).
func (r *ring) resize(s *Store, n int) {
	var buf []api.LogLine
	if n > 0 {
		buf = make([]api.LogLine, n)
		for i := range r.n {
			buf[i] = r.buf[(r.head+i)%len(r.buf)]
		}
	}
	s.bytes += (n - len(r.buf)) * lineOverhead
	r.buf, r.head = buf, 0
}

// drop forgets the oldest line.
func (r *ring) drop(s *Store) {
	old := &r.buf[r.head]
	r.bytes -= size(old)
	s.bytes -= len(old.Line)
	*old = api.LogLine{}
	r.head = (r.head + 1) % len(r.buf)
	r.n--
}

// evictTo trims the ring holding the most bytes (of those alike, the one
// that printed least recently) by a quarter at least, its oldest lines
// first, and again, until the node holds target bytes or fewer (or no
// ring has a line). The largest first, so that a tenant's many chatty
// functions share the node's bound among themselves rather than take a
// quiet function's few lines (its rare errors), as emptying the one that
// printed least recently did; from a heap made once, so that a store at
// its bound with thousands of small rings does not look over all of
// them for every few lines, as picking each ring by a scan did.
func (s *Store) evictTo(target int) {
	h := make(bySize, 0, len(s.fns))
	for name, r := range s.fns {
		if r.n > 0 {
			h = append(h, named{name, r})
		}
	}
	heap.Init(&h)
	for s.bytes > target && len(h) > 0 {
		big := h[0]
		for cut := big.r.bytes * 3 / 4; big.r.n > 0 && big.r.bytes > cut; {
			big.r.drop(s)
		}
		// Its slots go with its lines: under half full, it keeps twice
		// what is left (16 at least), as it would have grown to.
		if big.r.n == 0 {
			big.r.resize(s, 0)
			if len(big.r.follow) == 0 && big.r.summary == nil {
				delete(s.fns, big.name)
			}
			heap.Pop(&h)
			continue
		}
		if 2*big.r.n < len(big.r.buf) && len(big.r.buf) > 16 {
			big.r.resize(s, max(16, 2*big.r.n))
		}
		heap.Fix(&h, 0)
	}
}

// evictSlack is how far under TotalBytes evictTo goes once past it, so
// that it runs once per many lines at the bound, not per line.
const evictSlack = 64

// named is a ring and its function's name, in evictTo's heap.
type named struct {
	name string
	r    *ring
}

// bySize orders rings for evictTo: the most bytes first, then the one
// that printed least recently.
type bySize []named

func (h bySize) Len() int { return len(h) }
func (h bySize) Less(i, j int) bool {
	a, b := h[i].r, h[j].r
	return a.bytes > b.bytes || a.bytes == b.bytes && a.last.Before(b.last)
}
func (h bySize) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *bySize) Push(x any)   { *h = append(*h, x.(named)) }
func (h *bySize) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// allowTrace decides whether a line of name's at now goes to the server
// log; a line that does not is counted, and a summary of those is written
// at the end of the function's window.
func (s *Store) allowTrace(name string, r *ring, now time.Time) bool {
	if now.Sub(s.winStart) >= s.traceWindow {
		s.winStart, s.winCount = now, 0
	}
	if now.Sub(r.winStart) >= s.traceWindow {
		r.winStart, r.winCount = now, 0
	}
	if r.winCount < traceLines && s.winCount < traceTotal {
		r.winCount++
		s.winCount++
		return true
	}
	r.suppressed++
	if r.summary == nil {
		r.summary = time.AfterFunc(s.traceWindow, func() { s.summarize(name, r) })
	}
	return false
}

// summarize logs how many of r's lines the trace left out.
func (s *Store) summarize(name string, r *ring) {
	s.mu.Lock()
	n := r.suppressed
	r.suppressed, r.summary = 0, nil
	if r.n == 0 && len(r.follow) == 0 && s.fns[name] == r {
		delete(s.fns, name)
	}
	s.mu.Unlock()
	if n > 0 {
		s.log.Info("function output not logged", "function", name, "lines", n, "within", s.traceWindow,
			"read", "plover logs "+name)
	}
}

// Lines is name's kept lines from since on (zero: all), oldest first.
func (s *Store) Lines(name string, since time.Time) []api.LogLine {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.linesLocked(name, since)
}

func (s *Store) linesLocked(name string, since time.Time) []api.LogLine {
	r := s.fns[name]
	if r == nil {
		return nil
	}
	var out []api.LogLine
	for i := range r.n {
		l := r.buf[(r.head+i)%len(r.buf)]
		if !l.Time.Before(since) {
			out = append(out, l)
		}
	}
	return out
}

// ErrTooManyFollowers refuses a follower past MaxFollowers of the function
// or MaxFollowersTotal on the node.
var ErrTooManyFollowers = errors.New("too many followers")

// Follow is Lines and, from the same instant, a Follower that receives
// name's later lines, so that none falls between the two. Close it.
func (s *Store) Follow(name string, since time.Time) ([]api.LogLine, *Follower, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r := s.fns[name]
	switch {
	case r != nil && len(r.follow) >= MaxFollowers:
		return nil, nil, fmt.Errorf("%w: its output has %d on this node, the most a function may", ErrTooManyFollowers, MaxFollowers)
	case s.following >= MaxFollowersTotal:
		return nil, nil, fmt.Errorf("%w: this node serves %d in all, the most it may", ErrTooManyFollowers, MaxFollowersTotal)
	}
	lines := s.linesLocked(name, since)
	name = strings.Clone(name) // a map key and the follower's own: it outlives the caller's bytes
	if r == nil {
		r = &ring{}
		s.fns[name] = r
	}
	if r.follow == nil {
		r.follow = map[*Follower]struct{}{}
	}
	ch := make(chan api.LogLine, followBuffer)
	f := &Follower{C: ch, ch: ch, s: s, name: name, r: r}
	r.follow[f] = struct{}{}
	s.following++
	return lines, f, nil
}

// Followed is the names that have followers: a node polls their records
// to end them when the function is deleted elsewhere, though it may never
// have run it.
func (s *Store) Followed() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for name, r := range s.fns {
		if len(r.follow) > 0 {
			out = append(out, name)
		}
	}
	return out
}

// Forget drops name's lines (a deleted function) and ends its followers:
// their channels close; sinks made before it keep nothing more.
func (s *Store) Forget(name string) {
	if s == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.forgetLocked(name)
}

// ForgetUnsunk is Forget unless name's current life has a sink (its
// function is loaded here: whoever loaded it forgets it when it goes).
// It serves a node that follows a function it never ran, told by the
// store that the function was deleted, while a request may load the
// name's next life: that life's output is kept.
func (s *Store) ForgetUnsunk(name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.lives[name] == nil {
		s.forgetLocked(name)
	}
}

func (s *Store) forgetLocked(name string) {
	if l := s.lives[name]; l != nil {
		l.over.Store(true)
		delete(s.lives, name)
	}
	r := s.fns[name]
	if r == nil {
		return
	}
	delete(s.fns, name)
	for r.n > 0 {
		r.drop(s)
	}
	r.resize(s, 0)
	for f := range r.follow {
		f.end()
	}
	r.follow = nil
	if r.summary != nil {
		r.summary.Stop()
		r.summary = nil
	}
}

// Follower receives a function's lines as they are added. A line carries
// in Dropped how many before it the follower missed for reading too slowly.
// C is closed when the function is forgotten; whoever reads it asks
// Missed whenever C is empty, and once C is closed.
type Follower struct {
	C    <-chan api.LogLine
	ch   chan api.LogLine
	s    *Store
	name string
	r    *ring
	// under s.mu
	// The newest line that found the backlog full (missed), and how many
	// lines were missed before it (dropped): it goes out, with the count,
	// as soon as there is room, so that a follower that fell behind is
	// told what it missed, and gets the last of it, though the function
	// then goes quiet, crashes or is deleted. Before, the count waited for
	// the next line to find room, which after a burst's end never came,
	// and the lines lost were the burst's last (a crash's traceback).
	missed    api.LogLine
	hasMissed bool // missed holds a line
	dropped   int64
	closed    bool // its channel
	done      bool // Close was called
	// The text sizes of the lines sent on ch and not yet known to be
	// received, oldest first from sizeHead, and their sum. The reader
	// takes lines without telling: len(ch) says how many are still
	// queued, and those are the newest sizeN of them.
	sizes           [followBuffer]int32
	sizeHead, sizeN int
	held            int
}

// offer hands l over without waiting (under s.mu), after the line missed
// before it, if any; a line the backlog has no room for (past
// followBuffer lines or followText bytes of text) is kept back as missed,
// and the one it replaces counted as dropped.
func (f *Follower) offer(l api.LogLine) {
	f.received()
	if f.hasMissed {
		if !f.room(len(f.missed.Line)) {
			f.dropped++
			f.missed = l
			return
		}
		f.send(f.takeMissed())
	}
	if !f.room(len(l.Line)) {
		f.missed, f.hasMissed = l, true
		return
	}
	f.send(l)
}

// received forgets the sizes of the lines read since the last look
// (under s.mu).
func (f *Follower) received() {
	for f.sizeN > len(f.ch) {
		f.held -= int(f.sizes[f.sizeHead])
		f.sizeHead = (f.sizeHead + 1) % followBuffer
		f.sizeN--
	}
}

// room reports whether a line of n bytes of text fits the backlog.
func (f *Follower) room(n int) bool {
	return f.sizeN < followBuffer && f.held+n <= followText
}

// takeMissed is the missed line, carrying the count missed before it, and
// forgets both (under s.mu).
func (f *Follower) takeMissed() api.LogLine {
	l := f.missed
	l.Dropped = f.dropped
	f.missed, f.hasMissed, f.dropped = api.LogLine{}, false, 0
	return l
}

// send queues l (under s.mu; room said yes).
func (f *Follower) send(l api.LogLine) {
	f.ch <- l // room: only offer sends, and len(ch) <= sizeN < followBuffer
	f.sizes[(f.sizeHead+f.sizeN)%followBuffer] = int32(len(l.Line))
	f.sizeN++
	f.held += len(l.Line)
}

// Missed is the newest line the follower missed for reading too slowly,
// with in Dropped how many it missed before that one, if C is empty (it
// follows every line queued there) and a line was missed since the last
// that C or Missed gave. Its reader asks whenever it has emptied C, and
// once C is closed: the next line offered would bring it, but after a
// burst's end, a crash or a delete none may come.
func (f *Follower) Missed() (api.LogLine, bool) {
	f.s.mu.Lock()
	defer f.s.mu.Unlock()
	if !f.hasMissed || len(f.ch) > 0 {
		return api.LogLine{}, false
	}
	return f.takeMissed(), true
}

// end closes the channel (under s.mu).
func (f *Follower) end() {
	if !f.closed {
		f.closed = true
		close(f.ch)
	}
}

// Close stops following.
func (f *Follower) Close() {
	s := f.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if f.done {
		return
	}
	f.done = true
	s.following--
	delete(f.r.follow, f)
	f.end()
	if f.r.n == 0 && len(f.r.follow) == 0 && f.r.summary == nil && s.fns[f.name] == f.r {
		delete(s.fns, f.name)
	}
}
