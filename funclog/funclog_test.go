package funclog

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/plover-run/plover/api"
)

func line(t0 time.Time, i int) api.LogLine {
	return api.LogLine{Time: t0.Add(time.Duration(i) * time.Millisecond), Stream: "stdout", PID: 7, Line: fmt.Sprintf("line %d", i)}
}

// A function's ring keeps its last RingLines lines, oldest first, and
// Lines filters by time.
func TestRingKeepsTheLastLines(t *testing.T) {
	s := New(nil)
	t0 := time.Now()
	for i := range RingLines + 500 {
		s.Sink("f").Add(line(t0, i))
	}
	got := s.Lines("f", time.Time{})
	if len(got) != RingLines || got[0].Line != "line 500" || got[len(got)-1].Line != fmt.Sprintf("line %d", RingLines+499) {
		t.Fatalf("kept %d lines, %q .. %q", len(got), got[0].Line, got[len(got)-1].Line)
	}
	since := s.Lines("f", t0.Add(1400*time.Millisecond))
	if len(since) != 100 || since[0].Line != "line 1400" {
		t.Fatalf("since: %d lines from %q", len(since), since[0].Line)
	}
	if s.Lines("g", time.Time{}) != nil {
		t.Fatal("a function that printed nothing has lines")
	}
}

// The byte bounds: a ring of long lines keeps RingBytes, and all rings
// together TotalBytes, shared among the functions that print the most,
// the largest losing its oldest lines first.
func TestByteBounds(t *testing.T) {
	s := New(nil)
	s.totalBytes = 3 * RingBytes
	long := strings.Repeat("x", api.LogLineMax-lineOverhead)
	t0 := time.Now()
	for f := range 5 {
		for i := range 200 {
			l := line(t0, f*1000+i)
			l.Line = long
			s.Sink(fmt.Sprint("f", f)).Add(l)
		}
	}
	perRing := RingBytes / api.LogLineMax
	for f := range 5 {
		// Five share three rings' bytes: each keeps about 3/5 of a ring,
		// a quarter of a ring either way (evict trims by quarters).
		if n := len(s.Lines(fmt.Sprint("f", f), time.Time{})); n < perRing*3/5-perRing/4 || n > perRing {
			t.Errorf("f%d keeps %d lines, want about %d", f, n, perRing*3/5)
		}
	}
	if s.bytes > s.totalBytes {
		t.Errorf("%d bytes kept, over %d", s.bytes, s.totalBytes)
	}
}

// A function that printed a few lines long ago keeps them beside many
// functions printing without end (one tenant's, maybe): they share the
// node's bound among themselves. Emptying the function that printed
// least recently took the quiet one's lines first.
func TestQuietFunctionKeepsItsLines(t *testing.T) {
	s := New(nil)
	s.totalBytes = 4 * RingBytes
	t0 := time.Now()
	for i := range 3 {
		s.Sink("quiet").Add(line(t0, i))
	}
	long := strings.Repeat("x", api.LogLineMax-lineOverhead)
	for i := range 2000 {
		l := line(t0.Add(time.Second), i)
		l.Line = long
		s.Sink(fmt.Sprint("chatty", i%20)).Add(l)
	}
	if n := len(s.Lines("quiet", time.Time{})); n != 3 {
		t.Errorf("the quiet function keeps %d of its 3 lines", n)
	}
	if s.bytes > s.totalBytes {
		t.Errorf("%d bytes kept, over %d", s.bytes, s.totalBytes)
	}
	// An emptied ring holds no memory.
	for name, r := range s.fns {
		if r.n == 0 && r.buf != nil {
			t.Errorf("%s: an emptied ring still holds its buffer", name)
		}
	}
}

// A follower gets the backlog and then every new line; one that does not
// read misses lines, and is handed the last it missed, told how many it
// missed before that one, once there is room; Forget ends it.
func TestFollow(t *testing.T) {
	s := New(nil)
	t0 := time.Now()
	s.Sink("f").Add(line(t0, 0))
	back, f, err := s.Follow("f", time.Time{})
	if err != nil || len(back) != 1 {
		t.Fatalf("backlog %v", back)
	}
	for i := 1; i <= followBuffer+10; i++ {
		s.Sink("f").Add(line(t0, i))
	}
	for i := 1; i <= followBuffer; i++ {
		if l := <-f.C; l.Line != fmt.Sprintf("line %d", i) || l.Dropped != 0 {
			t.Fatalf("got %+v, want line %d", l, i)
		}
	}
	s.Sink("f").Add(line(t0, 9999))
	if l := <-f.C; l.Line != fmt.Sprintf("line %d", followBuffer+10) || l.Dropped != 9 {
		t.Fatalf("after a full buffer: %+v, want the last line missed with 9 dropped before it", l)
	}
	if l := <-f.C; l.Line != "line 9999" || l.Dropped != 0 {
		t.Fatalf("after the missed line: %+v, want line 9999", l)
	}
	s.Forget("f")
	if _, ok := <-f.C; ok {
		t.Fatal("the follower of a forgotten function is still open")
	}
	f.Close() // after Forget: harmless
	if s.Lines("f", time.Time{}) != nil || s.bytes != 0 {
		t.Fatalf("forgotten: %d bytes left", s.bytes)
	}

	// Close stops delivery and forgets an empty ring.
	_, f2, _ := s.Follow("g", time.Time{})
	f2.Close()
	s.Sink("g").Add(line(t0, 1))
	if _, ok := <-f2.C; ok {
		t.Fatal("a closed follower got a line")
	}
}

// A follower that fell behind in a burst after which the function goes
// quiet, or is deleted, is still told how many lines it missed, and gets
// the burst's last line (a crash's traceback ends there): Missed hands it
// over once C is emptied, after every line queued before it. Before, the
// count waited for a next line that never came: 300 lines to a follower
// not reading gave it 256 lines and no word of the 44 others.
func TestFollowerMissesNothingUntoldAfterABurst(t *testing.T) {
	for _, deleted := range []bool{false, true} {
		s := New(nil)
		_, f, err := s.Follow("f", time.Time{})
		if err != nil {
			t.Fatal(err)
		}
		t0 := time.Now()
		const printed = 300
		for i := 1; i <= printed; i++ {
			s.Sink("f").Add(line(t0, i))
		}
		if deleted {
			s.Forget("f")
		}
		if _, ok := f.Missed(); ok {
			t.Fatal("Missed gave a line while C still held older ones")
		}
		got := 0
		for len(f.C) > 0 {
			<-f.C
			got++
		}
		m, ok := f.Missed()
		if !ok || m.Line != fmt.Sprintf("line %d", printed) || int(m.Dropped) != printed-got-1 {
			t.Fatalf("deleted %v: after %d lines read of %d printed, Missed gave %+v %v; want line %d with %d dropped before it",
				deleted, got, printed, m, ok, printed, printed-got-1)
		}
		if _, ok := f.Missed(); ok {
			t.Fatal("Missed gave the same line twice")
		}
		f.Close()
	}
}

// Followers that never read hold at most followBytes each, their slots
// and their lines' text, however long the lines: followers joined one
// after another each hold lines the others missed, which the rings let go
// long ago. One that then reads is told how many it missed, and has its
// room again.
func TestFollowersBacklogIsBoundedInBytes(t *testing.T) {
	s := New(nil)
	long := strings.Repeat("x", api.LogLineMax)
	t0 := time.Now()
	const fns = 4
	var fs []*Follower
	printed := map[*Follower]int{} // lines printed since it began to follow
	for fn := range fns {
		name := fmt.Sprint("f", fn)
		for range MaxFollowers {
			_, f, err := s.Follow(name, time.Time{})
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			fs = append(fs, f)
			for i := range followBuffer {
				l := line(t0, i)
				l.Line = long
				s.Sink(name).Add(l)
			}
			for g := range printed {
				if g.name == name {
					printed[g] += followBuffer
				}
			}
			printed[f] = followBuffer
		}
	}
	drain := func(f *Follower) (lines, text int) {
		for len(f.C) > 0 {
			l := <-f.C
			lines++
			text += len(l.Line)
		}
		return lines, text
	}
	first, firstKept := fs[0], 0
	for i, f := range fs {
		lines, text := drain(f)
		// With the line kept back as missed: a slot's worth and its text.
		if held := (followBuffer+1)*followSlot + text + len(f.missed.Line); held > followBytes {
			t.Fatalf("follower %d held %d lines, %d bytes with its slots, over %d", i, lines, held, followBytes)
		}
		if lines == 0 {
			t.Fatalf("follower %d was handed nothing", i)
		}
		if f == first {
			firstKept = lines
		}
	}

	// The first follower, reading now, is told what it missed: all but
	// what it held of the lines printed since it began, and the last of
	// those, kept back for it.
	got, ok := first.Missed()
	if !ok {
		t.Fatal("the slow follower, having read all it held, was handed no missed line")
	}
	if want := int64(printed[first] - firstKept - 1); got.Dropped != want {
		t.Fatalf("the slow follower was told it missed %d lines before the last, want %d", got.Dropped, want)
	}
	l := line(t0, 0)
	l.Line = long
	for range followBuffer {
		s.Sink("f0").Add(l)
	}
	if n, _ := drain(first); n != firstKept {
		t.Fatalf("having read, the follower took %d more lines, want %d as at first", n, firstKept)
	}
}

// syncBuf is a log destination the store's timer may write to.
type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuf) Write(p []byte) (int, error) { b.mu.Lock(); defer b.mu.Unlock(); return b.b.Write(p) }
func (b *syncBuf) String() string              { b.mu.Lock(); defer b.mu.Unlock(); return b.b.String() }

// A flood reaches the server log as traceLines lines per function per
// window, traceTotal in all, then one line saying how many were left out.
func TestTraceIsThrottled(t *testing.T) {
	var out syncBuf
	s := New(slog.New(slog.NewTextHandler(&out, nil)))
	// A window the 10,000 lines below fit in on a loaded machine: one
	// rolled over under them would count them in two summaries.
	s.traceWindow = 2 * time.Second
	t0 := time.Now()
	for i := range 10000 {
		s.Sink("flood").Add(line(t0, 0))
		if i < 3 {
			s.Sink("quiet").Add(line(t0, i))
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(out.String(), "function output not logged") {
		if time.Now().After(deadline) {
			t.Fatalf("no summary of the lines left out:\n%s", out.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	log := out.String()
	if n := strings.Count(log, "function=flood stream=stdout"); n != traceLines {
		t.Errorf("%d of the flood's lines logged, want %d", n, traceLines)
	}
	if n := strings.Count(log, "function=quiet stream=stdout"); n != 3 {
		t.Errorf("%d of the quiet function's lines logged, want 3:\n%s", n, log)
	}
	if !strings.Contains(log, "function=flood lines=9980") || !strings.Contains(log, `read="plover logs flood"`) {
		t.Errorf("summary does not count the lines left out or say where they are:\n%s", log)
	}
	// All functions share traceTotal.
	s2 := New(slog.New(slog.NewTextHandler(&out, nil)))
	for f := range 50 {
		for range traceLines {
			s2.Sink(fmt.Sprint("g", f)).Add(line(t0, 0))
		}
	}
	if n := strings.Count(out.String(), "function=g"); n > traceTotal+50 {
		t.Errorf("%d lines of 50 functions logged in one window, want at most %d (and their summaries)", n, traceTotal)
	}
}

// Followers are bounded per function and per node: each line is handed to,
// encoded for and written to every one. A closed one (twice, or after its
// function was forgotten) frees its place once.
func TestFollowersBounded(t *testing.T) {
	s := New(nil)
	var fs []*Follower
	for i := range MaxFollowers {
		_, f, err := s.Follow("f", time.Time{})
		if err != nil {
			t.Fatalf("follower %d: %v", i, err)
		}
		fs = append(fs, f)
	}
	if _, _, err := s.Follow("f", time.Time{}); !errors.Is(err, ErrTooManyFollowers) || !strings.Contains(err.Error(), "the most a function may") {
		t.Fatalf("follower %d of f: %v, want ErrTooManyFollowers", MaxFollowers+1, err)
	}
	fs[0].Close()
	fs[0].Close()
	_, f, err := s.Follow("f", time.Time{})
	if err != nil {
		t.Fatalf("after one closed: %v", err)
	}
	fs[0] = f
	if _, _, err := s.Follow("f", time.Time{}); err == nil {
		t.Fatal("a place freed twice by one follower's two Closes")
	}
	s.Forget("f")
	for _, f := range fs {
		f.Close()
	}
	for i := range MaxFollowersTotal {
		if _, _, err := s.Follow(fmt.Sprint("g", i%64), time.Time{}); err != nil {
			t.Fatalf("follower %d on the node: %v", i, err)
		}
	}
	if _, _, err := s.Follow("h", time.Time{}); !errors.Is(err, ErrTooManyFollowers) || !strings.Contains(err.Error(), "in all") {
		t.Fatalf("follower %d on the node: %v, want ErrTooManyFollowers", MaxFollowersTotal+1, err)
	}
}

// Followed is the names that have followers, whether or not they printed:
// a follower closed or forgotten takes its name off.
func TestFollowedNames(t *testing.T) {
	s := New(nil)
	s.Sink("printed").Add(api.LogLine{Time: time.Now(), Line: "x"})
	_, a, _ := s.Follow("a", time.Time{})
	_, b, _ := s.Follow("b", time.Time{})
	_, b2, _ := s.Follow("b", time.Time{})
	for _, tc := range []struct {
		step func()
		want string
	}{
		{func() {}, "a b"},
		{b.Close, "a b"},
		{b2.Close, "a"},
		{func() { s.Forget("a") }, ""},
	} {
		tc.step()
		got := s.Followed()
		slices.Sort(got)
		if strings.Join(got, " ") != tc.want {
			t.Errorf("Followed() = %v, want %q", got, tc.want)
		}
	}
	a.Close()
}

// ForgetUnsunk ends a name's followers unless its current life has a sink
// (its function is loaded here): then nothing is forgotten, and what the
// sink brings is still kept and followed.
func TestForgetUnsunk(t *testing.T) {
	for _, sunk := range []bool{false, true} {
		s := New(nil)
		_, f, _ := s.Follow("fn", time.Time{})
		var k *Sink
		if sunk {
			k = s.Sink("fn")
		}
		s.ForgetUnsunk("fn")
		select {
		case _, open := <-f.C:
			if open || sunk {
				t.Fatalf("sunk %v: the follower got a line or ended (open %v)", sunk, open)
			}
		default:
			if !sunk {
				t.Fatal("no sink: the follower is still open")
			}
			k.Add(api.LogLine{Time: time.Now(), Line: "kept"})
			if l := <-f.C; l.Line != "kept" || len(s.Lines("fn", time.Time{})) != 1 {
				t.Fatalf("sunk: the sink's line %q, kept %v", l.Line, s.Lines("fn", time.Time{}))
			}
		}
		f.Close()
	}
}

// Follow keeps a name of its own: a caller's name borrowed over a request
// buffer, which serves another request next, must not become the ring's
// map key, or the function's lines reach a key since rewritten.
func TestFollowKeepsItsOwnName(t *testing.T) {
	s := New(nil)
	buf := []byte("fn")
	_, f, err := s.Follow(unsafe.String(&buf[0], len(buf)), time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	copy(buf, "xx") // the buffer's next request
	s.Sink("fn").Add(line(time.Now(), 1))
	select {
	case l := <-f.C:
		if l.Line != "line 1" {
			t.Fatalf("the follower got %+v", l)
		}
	default:
		t.Fatalf("the follower of fn got nothing; the store's names: %v", s.Followed())
	}
}

// The node's bound holds of the memory the rings take, their arrays'
// slots with their lines: rings trimmed by evict kept their arrays whole,
// and many functions printing short lines held three slots per line
// counted (a review's probe: 186 MiB for 3,000 functions under 64 MiB).
func TestTheBoundCountsTheRingsSlots(t *testing.T) {
	s := New(nil)
	s.totalBytes = 4 << 20
	t0 := time.Now()
	for f := range 300 {
		sink := s.Sink(fmt.Sprintf("f%d", f))
		for i := range RingLines {
			sink.Add(api.LogLine{Time: t0.Add(time.Duration(i) * time.Millisecond), Stream: "stdout", PID: 7})
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	held := 0
	for _, r := range s.fns {
		held += len(r.buf) * int(unsafe.Sizeof(api.LogLine{}))
		for i := range r.n {
			held += len(r.buf[(r.head+i)%len(r.buf)].Line)
		}
	}
	if held > s.totalBytes || s.bytes > s.totalBytes {
		t.Errorf("the rings hold %d KiB (slots and text; %d KiB counted), over the bound's %d KiB", held>>10, s.bytes>>10, s.totalBytes>>10)
	}
}

// Add at the node's bound with many small rings (5,000 functions of 26
// short lines each): evictTo's heap, made once per evictSlack of the
// bound, where a scan of every ring picked each one trimmed.
func BenchmarkAddAtTheBound(b *testing.B) {
	s := New(nil)
	s.totalBytes = 5000 * 26 * (lineOverhead + 12)
	t0 := time.Now()
	sinks := make([]*Sink, 5000)
	for f := range sinks {
		sinks[f] = s.Sink(fmt.Sprintf("f%d", f))
		for i := range 26 {
			sinks[f].Add(line(t0, i))
		}
	}
	b.ResetTimer()
	for i := range b.N {
		sinks[i%len(sinks)].Add(line(t0, 26+i))
	}
}
