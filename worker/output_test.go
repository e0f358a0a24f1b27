package worker

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/api"
	"github.com/plover-run/plover/device"
	"github.com/plover-run/plover/funclog"
	"github.com/plover-run/plover/internal/testkit"
)

// loadOutput loads the printing test kernels (testkit.OutputSource) with
// the one kernel as its chain.
func loadOutput(t *testing.T, d *Device, kernel string, grid, block int) (device.Program, *abi.Manifest) {
	t.Helper()
	m := testkit.OutputManifest("talker", kernel, grid, block)
	return loadSource(t, d, testkit.OutputSource(), m), m
}

// loadSource builds src as m's library and loads the bundle into a worker.
func loadSource(t testing.TB, d *Device, src string, m *abi.Manifest) device.Program {
	t.Helper()
	dir := t.TempDir()
	testkit.BuildLib(t, src, dir, m.Library)
	testkit.WriteManifest(t, dir, m)
	var out device.Output
	if s, ok := kept.Load(d); ok {
		out = s.(*funclog.Store).Sink(m.Name)
	}
	p, err := d.Load(context.Background(), device.ProgramSpec{Dir: dir, Manifest: m, Output: out})
	if err != nil {
		t.Fatalf("load: %v", err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

// kept is the store of each keptDevice: programs loadSource loads on it
// print there, as the engine's do in its store.
var kept sync.Map // *Device -> *funclog.Store

// keptDevice is a worker device whose programs' output is kept in a store.
func keptDevice(t *testing.T) (*Device, *funclog.Store) {
	t.Helper()
	d := newDevice(t, 0)
	s := funclog.New(nil)
	kept.Store(d, s)
	t.Cleanup(func() { kept.Delete(d) })
	return d, s
}

func runOnce(t *testing.T, p device.Program, m *abi.Manifest, in []byte, deadline time.Duration) error {
	t.Helper()
	inst := newInst(t, p, m)
	l := m.Chain[0]
	return inst.Run(&device.Run{Input: in, Output: make([]byte, m.OutBytes), TmpLen: m.TmpBytes,
		Chain: []device.Step{{Entry: 0, Grid: int32(l.Grid), Block: int32(l.Block)}}, Deadline: time.Now().Add(deadline)})
}

// waitLines polls the store until want holds of the function's lines.
func waitLines(t *testing.T, s *funclog.Store, name string, want func([]api.LogLine) bool) (lines []api.LogLine) {
	t.Helper()
	poll(t, 10*time.Second, func() (bool, string) {
		lines = s.Lines(name, time.Time{})
		return want(lines), fmt.Sprintf("lines of %s never as expected: %+v", name, lines)
	})
	return lines
}

// poll calls done every 5 ms until it says true, and fails the test with
// what it said last once within has passed.
func poll(t *testing.T, within time.Duration, done func() (ok bool, last string)) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		ok, last := done()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal(last)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func hasLine(lines []api.LogLine, stream, text string) bool {
	for _, l := range lines {
		if l.Stream == stream && l.Line == text {
			return true
		}
	}
	return false
}

// What a function's entry and its kernels print on stdout and stderr is
// kept under the function's name, line by line, with stream and pid.
func TestOutputIsKeptPerFunction(t *testing.T) {
	d, s := keptDevice(t)
	p, m := loadOutput(t, d, "say", 1, 4)
	if err := runOnce(t, p, m, []byte("hello"), 10*time.Second); err != nil {
		t.Fatal(err)
	}
	lines := waitLines(t, s, "talker", func(ls []api.LogLine) bool { return len(ls) >= 6 })
	pid := p.(*program).PID()
	for _, want := range []struct{ stream, text string }{{"stdout", "say: hello"}, {"stderr", "warn: hello"},
		{"stdout", "kernel 7 thread 0 of 4"}, {"stdout", "kernel 7 thread 3 of 4"}} {
		if !hasLine(lines, want.stream, want.text) {
			t.Errorf("no %s line %q in %+v", want.stream, want.text, lines)
		}
	}
	for _, l := range lines {
		if l.PID != pid || l.Time.IsZero() {
			t.Errorf("line %+v: want pid %d and a time", l, pid)
		}
	}
}

// What a worker prints after its function was deleted (a request that was
// in flight finishing) is dropped, not kept under the name for whoever
// deploys it next; a worker of the redeployed function is heard. The line
// is printed before the run returns, and the store is read only once the
// worker's output was read to its end (it crashes, printing a last line).
func TestOutputOfADeletedFunctionIsDropped(t *testing.T) {
	d, s := keptDevice(t)
	for _, deleted := range []bool{false, true} {
		p, m := loadOutput(t, d, "say_later", 200, 1)
		ran := make(chan error, 1)
		inst := newInst(t, p, m) // here: it may t.Fatal
		l := m.Chain[0]
		go func() {
			ran <- inst.Run(&device.Run{Input: []byte("SECRET of the old owner"), Output: make([]byte, m.OutBytes), TmpLen: m.TmpBytes,
				Chain: []device.Step{{Entry: 0, Grid: int32(l.Grid), Block: int32(l.Block)}}, Deadline: time.Now().Add(10 * time.Second)})
		}()
		if deleted {
			s.Forget("talker") // while the entry sleeps
		}
		if err := <-ran; err != nil {
			t.Fatal(err)
		}
		// The worker ends by itself, and its output is read to the end:
		// the later line has been kept or dropped by now.
		crash, err := p.Entry("say_then_crash")
		if err != nil {
			t.Fatal(err)
		}
		newInst(t, p, m).Run(&device.Run{Input: []byte("x"), Output: make([]byte, m.OutBytes), Chain: []device.Step{{Entry: crash, Grid: 1, Block: 1}}})
		waitHeard(t, p)
		kept := hasLine(s.Lines("talker", time.Time{}), "stdout", "later: SECRET of the old owner")
		if kept == deleted {
			t.Fatalf("deleted %v: the line kept %v: %+v", deleted, kept, s.Lines("talker", time.Time{}))
		}
		s.Forget("talker")
	}
	p, m := loadOutput(t, d, "say", 1, 1) // the name deployed again
	if err := runOnce(t, p, m, []byte("new owner"), 10*time.Second); err != nil {
		t.Fatal(err)
	}
	waitLines(t, s, "talker", func(ls []api.LogLine) bool { return hasLine(ls, "stdout", "say: new owner") })
}

// A line printed just before a crash, with no fflush, still arrives (C's
// stdout is line-buffered in a worker), and the death is seen as it
// happens: Exited closes, Death says how and while doing what.
func TestOutputSurvivesACrashAndTheDeathIsSeen(t *testing.T) {
	d, s := keptDevice(t)
	p, m := loadOutput(t, d, "say_then_crash", 1, 1)
	err := runOnce(t, p, m, []byte("x"), 10*time.Second)
	var pe *ProcessExit
	if !errors.As(err, &pe) {
		t.Fatalf("run: %v, want the worker's death", err)
	}
	// The line is kept before the death is reported.
	if !hasLine(s.Lines("talker", time.Time{}), "stdout", "last words") {
		t.Fatalf("the line printed before the crash is lost: %+v", s.Lines("talker", time.Time{}))
	}
	g := p.(*program)
	select {
	case <-g.Exited():
	default:
		t.Fatal("Exited is open after the worker died")
	}
	death := g.death()
	if death == nil || !strings.Contains(death.Reason, "SIGSEGV") || death.During != "running the chain" || death.Killed {
		t.Fatalf("Death() = %+v, want SIGSEGV while running the chain", death)
	}
}

// A chain past its deadline: the worker is killed after the grace, and its
// death is seen then (no further request), as the server's doing, while
// the chain ran. A program closed on purpose reports no death.
func TestDeadlineKillIsSeenAtOnce(t *testing.T) {
	d := newDevice(t, 0)
	p, m := loadOutput(t, d, "say_then_spin", 1, 1)
	if err := runOnce(t, p, m, []byte("x"), 100*time.Millisecond); !errors.Is(err, device.ErrDeadline) {
		t.Fatalf("run: %v, want ErrDeadline", err)
	}
	g := p.(*program)
	select {
	case <-g.Exited():
	case <-time.After(10 * time.Second):
		t.Fatal("the worker of a chain past its deadline was not ended")
	}
	death := g.death()
	if death == nil || !death.Killed || !strings.Contains(death.Reason, "deadline") || death.During != "running the chain" {
		t.Fatalf("Death() = %+v, want the server's kill for the deadline while running the chain", death)
	}

	q, _ := loadOutput(t, d, "say", 1, 1)
	q.Close()
	<-q.(*program).Exited()
	if death := q.(*program).death(); death != nil {
		t.Fatalf("a closed program's worker reported a death: %+v", death)
	}
}

// A flood keeps the function's last lines only, a line over
// api.LogLineMax is cut there (the rest counted), and what follows it is
// whole.
func TestOutputFloodIsBounded(t *testing.T) {
	d, s := keptDevice(t)
	p, m := loadOutput(t, d, "flood", 5000, 1)
	if err := runOnce(t, p, m, []byte("x"), 20*time.Second); err != nil {
		t.Fatal(err)
	}
	lines := waitLines(t, s, "talker", func(ls []api.LogLine) bool { return hasLine(ls, "stdout", "flood done") })
	if len(lines) > funclog.RingLines {
		t.Errorf("%d lines kept, over %d", len(lines), funclog.RingLines)
	}
	big := lines[len(lines)-2]
	if len(big.Line) != api.LogLineMax || big.Truncated != 10000-api.LogLineMax || strings.Trim(big.Line, "y") != "" {
		t.Errorf("the long line: %d bytes kept, %d cut; want %d and %d", len(big.Line), big.Truncated, api.LogLineMax, 10000-api.LogLineMax)
	}
}

// plover run's device (Options.Output): every line goes there as it comes,
// marked with its stream.
func TestOutputToWriter(t *testing.T) {
	var mu sync.Mutex
	var buf bytes.Buffer
	w := writerFunc(func(b []byte) (int, error) { mu.Lock(); defer mu.Unlock(); return buf.Write(b) })
	d := NewDevice(Options{Exe: os.Args[0], Base: device.NewHost(0), Landlock: true, StageDir: t.TempDir(), Spawner: spawner, Output: w})
	t.Cleanup(func() { d.Close() })
	p, m := loadOutput(t, d, "say", 1, 2)
	if err := runOnce(t, p, m, []byte("hi"), 10*time.Second); err != nil {
		t.Fatal(err)
	}
	poll(t, 10*time.Second, func() (bool, string) {
		mu.Lock()
		out := buf.String()
		mu.Unlock()
		return strings.Contains(out, "stdout | say: hi\n") && strings.Contains(out, "stderr | warn: hi\n") && strings.Contains(out, "stdout | kernel 7 thread 1 of 2\n"), "output:\n" + out
	})
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(b []byte) (int, error) { return f(b) }

// heldOutput passes lines on to a store's sink, the first one only once
// released: the server reading a worker's output behind what it printed.
type heldOutput struct {
	sink    *funclog.Sink
	once    sync.Once
	started chan struct{}
	release chan struct{}
}

func (h *heldOutput) Add(l api.LogLine) {
	h.once.Do(func() { close(h.started); <-h.release })
	h.sink.Add(l)
}

// What a request printed is the function's even when its program is
// unloaded (an idle unload, a version replaced by a redeploy) before the
// server read it all: the lines still in the pipe when Close stops the
// worker are kept under the function, not lost to the server log.
func TestOutputPrintedBeforeCloseIsKept(t *testing.T) {
	d := newDevice(t, 0)
	s := funclog.New(nil)
	h := &heldOutput{sink: s.Sink("talker"), started: make(chan struct{}), release: make(chan struct{})}
	m := testkit.OutputManifest("talker", "say", 1, 4)
	dir := t.TempDir()
	testkit.BuildLib(t, testkit.OutputSource(), dir, m.Library)
	testkit.WriteManifest(t, dir, m)
	p, err := d.Load(context.Background(), device.ProgramSpec{Dir: dir, Manifest: m, Output: h})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if err := runOnce(t, p, m, []byte("bye"), 10*time.Second); err != nil {
		t.Fatal(err)
	}
	<-h.started // the server reads the first line, and has not kept it yet
	p.Close()
	close(h.release)
	waitHeard(t, p)
	lines := s.Lines("talker", time.Time{})
	for _, want := range []struct{ stream, text string }{{"stdout", "say: bye"}, {"stderr", "warn: bye"},
		{"stdout", "kernel 7 thread 0 of 4"}, {"stdout", "kernel 7 thread 3 of 4"}} {
		if !hasLine(lines, want.stream, want.text) {
			t.Errorf("the %s line %q printed before the program closed is lost: %+v", want.stream, want.text, lines)
		}
	}
}

// waitHeard waits until the program's worker output has been read to its
// end, failing the test after 10 s rather than hanging it.
func waitHeard(t *testing.T, p device.Program) {
	t.Helper()
	select {
	case <-p.(*program).p.heard:
	case <-time.After(10 * time.Second):
		t.Fatal("the worker's output not read to its end 10 s on")
	}
}

// countedOutput is a device.Output that counts the lines passed on and
// sums the drops they report.
type countedOutput struct {
	mu                    sync.Mutex
	passed, report, bytes int
	lines                 []api.LogLine
}

var notKept = regexp.MustCompile(`^\[plover: (\d+) lines not kept \((\d+) bytes\): `)

func (c *countedOutput) Add(l api.LogLine) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if m := notKept.FindStringSubmatch(l.Line); m != nil {
		n, _ := strconv.Atoi(m[1])
		b, _ := strconv.Atoi(m[2])
		c.report += n
		c.bytes += b
	} else {
		c.passed++
	}
	c.lines = append(c.lines, l)
}

func (c *countedOutput) counts() (passed, dropped int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.passed, c.report
}

// A worker printing past its line budget (outputBurst at once, then
// outputRate a second) has the rest dropped in bulk and counted, every
// line either passed on or counted in a "not kept" line; once the budget
// has room again, its lines are passed on again.
func TestOutputPastItsBudgetIsDroppedAndCounted(t *testing.T) {
	d := newDevice(t, 0)
	const flood = 50000
	m := testkit.OutputManifest("talker", "flood", flood, 1)
	dir := t.TempDir()
	testkit.BuildLib(t, testkit.OutputSource(), dir, m.Library)
	testkit.WriteManifest(t, dir, m)
	out := &countedOutput{}
	p, err := d.Load(context.Background(), device.ProgramSpec{Dir: dir, Manifest: m, Output: out})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	start := time.Now()
	if err := runOnce(t, p, m, []byte("x"), 20*time.Second); err != nil {
		t.Fatal(err)
	}
	const printed = flood + 2 // and the long line, and "flood done"
	deadline := time.Now().Add(20 * time.Second)
	for {
		passed, dropped := out.counts()
		if passed+dropped == printed && dropped > 0 {
			// What passed is the burst and what the rate gave while the
			// flood was read, not the flood.
			if bound := outputBurst + int(time.Since(start).Seconds()*outputRate) + 1; passed > bound {
				t.Errorf("%d lines passed on, over the budget's %d", passed, bound)
			}
			// The drop's last lines are passed on after its count, as a
			// log keeps its last: the flood's end among them.
			out.mu.Lock()
			last := out.lines[len(out.lines)-1].Line
			out.mu.Unlock()
			if last != "flood done" {
				t.Errorf("the last line passed on is %.60q, want the flood's last, %q", last, "flood done")
			}
			break
		}
		if passed+dropped > printed || time.Now().After(deadline) {
			t.Fatalf("%d lines passed on and %d counted dropped, want %d in all with some dropped", passed, dropped, printed)
		}
		time.Sleep(5 * time.Millisecond)
	}
	// The drop ended with the flood (the report came once the budget had
	// room): the next lines are kept.
	before, _ := out.counts()
	if err := runOnce(t, p, m, []byte("x"), 20*time.Second); err != nil {
		t.Fatal(err)
	}
	poll(t, 20*time.Second, func() (bool, string) {
		passed, _ := out.counts()
		return passed-before >= outputResume-1, fmt.Sprintf("%d lines of the second flood passed on, want the %d the budget had room for", passed-before, outputResume)
	})
}

// A line that does not end costs the budget a line each api.LogLineMax
// bytes and, past it, is dropped in bulk with what follows and counted,
// as a flood of lines is: it was read to its end, however long, at the
// server's weight, and passed on as one line (a review measured 2 s of
// the server's CPU for 3 s of a worker writing one, against 0.12 s for
// empty lines).
func TestAnUnendingLineIsWithinTheBudget(t *testing.T) {
	d := newDevice(t, 0)
	const mib = 48 // 12,288 times LogLineMax: past outputBurst
	m := testkit.OutputManifest("talker", "long_line", mib, 1)
	dir := t.TempDir()
	testkit.BuildLib(t, testkit.OutputSource(), dir, m.Library)
	testkit.WriteManifest(t, dir, m)
	out := &countedOutput{}
	p, err := d.Load(context.Background(), device.ProgramSpec{Dir: dir, Manifest: m, Output: out})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	if err := runOnce(t, p, m, []byte("x"), 60*time.Second); err != nil {
		t.Fatal(err)
	}
	var report, passed, dropped int
	poll(t, 20*time.Second, func() (bool, string) {
		out.mu.Lock()
		defer out.mu.Unlock()
		var last string
		if n := len(out.lines); n > 0 {
			last = out.lines[n-1].Line
		}
		report, passed, dropped = out.report, out.passed, out.bytes
		return last == "long line done", fmt.Sprintf("the output's last line %.60q, want %q; %d passed on, %d counted dropped", last, "long line done", passed, report)
	})
	// The line and "long line done": the line dropped and counted (its
	// start is not passed on), the last passed on.
	if report != 1 || passed != 1 {
		t.Errorf("%d lines passed on and %d counted dropped, want the last passed and the long one dropped", passed, report)
	}
	// The drop says its bytes: the line's rest past the budget, megabytes
	// where its count alone said one line (or none, for a drop that ended
	// before the line did).
	if dropped < 1<<20 || dropped > mib<<20 {
		t.Errorf("the drops report %d bytes not kept, want the long line's rest past the budget, 1 to %d MiB", dropped, mib)
	}
}

// A drop that begins within an over-long line (the budget ran out while
// its rest was read) counts that line once and passes none of it on,
// whatever comes after: its end in the drop's first read, or after the
// drop ended (a pause past the budget's refill). The drop took its rest
// for a whole line: it counted 0 (or -1 for a line a drop before began)
// and passed the rest on as a line of its own (a review's trace).
func TestAnOverLongLineDroppedMidwayIsCountedOnce(t *testing.T) {
	long := strings.Repeat("a", api.LogLineMax)
	for _, tc := range []struct {
		name   string
		writes []string      // written in turn to the worker's stream
		pause  time.Duration // between the writes
		passed []string      // the lines passed on besides the report
	}{
		{"its end in the drop", []string{long + strings.Repeat("b", 100) + "\nnext\n"}, 0, []string{"next"}},
		{"its end after the drop", []string{long + "x", "\nnext\n"}, 1500 * time.Millisecond, []string{"next"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, w, err := os.Pipe()
			if err != nil {
				t.Fatal(err)
			}
			out := &countedOutput{}
			p := &proc{d: &Device{}, pid: 1}
			p.out.Store(&output{out})
			p.lines.take(time.Now())
			p.lines.mu.Lock()
			p.lines.tokens = 0 // spent: the next line's rest goes to a drop
			p.lines.mu.Unlock()
			done := make(chan struct{})
			go func() { defer close(done); p.readOutput(r, "stdout") }()
			for i, s := range tc.writes {
				if i > 0 {
					time.Sleep(tc.pause)
				}
				if _, err := w.WriteString(s); err != nil {
					t.Fatal(err)
				}
			}
			w.Close()
			<-done
			out.mu.Lock()
			defer out.mu.Unlock()
			var passed []string
			for _, l := range out.lines {
				if !notKept.MatchString(l.Line) {
					passed = append(passed, l.Line)
				}
			}
			if out.report != 1 || !slices.Equal(passed, tc.passed) {
				t.Errorf("%d lines counted dropped and %q passed on, want 1 and %q", out.report, passed, tc.passed)
			}
		})
	}
}
