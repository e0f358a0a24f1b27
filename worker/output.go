package worker

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/plover-run/plover/api"
	"github.com/plover-run/plover/device"
	"github.com/plover-run/plover/worker/wire"
)

// What a worker writes besides its replies: its stdout and stderr, passed on
// as its function's output (or the server log's), and the fatal mark its
// signal handler leaves on its own pipe as it dies (readMark; blame, in
// tenant.go, goes by it).

// outputPipes makes cmd's stdout and stderr pipes of our own rather than
// io.Writers: Wait must not wait for a forked grandchild that keeps stdout
// or stderr open. pw, cmd's ends, are closed once it started.
func outputPipes(cmd *exec.Cmd) (pr, pw [2]*os.File, err error) {
	for i := range pr {
		if pr[i], pw[i], err = os.Pipe(); err != nil {
			closeAll(pr[:i]...)
			closeAll(pw[:i]...)
			return pr, pw, err
		}
	}
	cmd.Stdout, cmd.Stderr = pw[0], pw[1]
	return pr, pw, nil
}

// readOutput reads what the worker writes to one of its streams ("stdout"
// or "stderr"), line by line (the worker line-buffers C's stdout: package
// inside), to its end. A line over api.LogLineMax is cut there (the rest is
// counted). The first stderr line goes to said (a worker that fails to
// start says why there). Past the worker's line budget what it writes is
// dropped in bulk (skipOutput) and counted: a worker writing empty lines
// as fast as it could had the server spend some fifty times its CPU
// passing each on, at the server's weight, billed to nobody.
func (p *proc) readOutput(r *os.File, stream string) {
	defer r.Close()
	said := stream != "stderr"
	defer func() {
		if !said { // nothing on stderr: a start failure need not wait for it
			close(p.said)
		}
	}()
	src := &outputSource{r: r}
	br := bufio.NewReaderSize(src, api.LogLineMax)
	nl := []byte{'\n'}
	rest := false // the next line read ends one a drop began in
	for {
		b, err := br.ReadSlice('\n')
		if len(b) == 0 && err != nil {
			return
		}
		text := string(bytes.TrimSuffix(b, nl))
		cut := 0
		// A line's rest past api.LogLineMax costs a line of the budget
		// each api.LogLineMax bytes, and past the budget it is dropped
		// with the lines after it: a line that never ended was read
		// whole, at the server's weight, billed to nobody.
		over := false
		for err == bufio.ErrBufferFull {
			if p.d.opts.Output == nil && !p.lines.take(time.Now()) {
				over = true
				break
			}
			b, err = br.ReadSlice('\n')
			cut += len(bytes.TrimSuffix(b, nl))
		}
		if !said {
			p.said <- text
			close(p.said)
			said = true
		}
		now := time.Now()
		switch {
		case rest && !over: // counted with the drop
			rest = false
		case !over && (p.d.opts.Output != nil || p.lines.take(now)): // plover run: the author's own terminal
			p.output(api.LogLine{Time: now, Stream: stream, PID: p.pid, Line: text, Truncated: cut})
		default:
			n, size, midLine, tail, serr := skipOutput(src, br, p.lines.readyAt(now), over)
			kept := lastLines(tail, outputResume)
			n -= len(kept) // the tail's are passed on
			for _, l := range kept {
				size -= len(l) + 1
			}
			switch {
			case !over:
				n++ // the line that began the drop, read whole
			case rest:
				n-- // its end, which the drop counts, was counted with the drop before
			}
			if midLine {
				n++
			}
			rest = midLine
			at := time.Now()
			p.output(api.LogLine{Time: at, Stream: stream, PID: p.pid,
				Line: fmt.Sprintf("[plover: %d lines not kept (%d bytes): this worker printed more than %d lines at once, or %d a second]", n, max(size, 0), outputBurst, outputRate)})
			// The drop's last lines, as a function's log keeps its last:
			// what a worker printed last (as it failed, or finished) is
			// what its author reads first.
			for _, l := range kept {
				p.lines.take(at)
				text, cut := l, 0
				if len(text) > api.LogLineMax {
					text, cut = text[:api.LogLineMax], len(text)-api.LogLineMax
				}
				p.output(api.LogLine{Time: at, Stream: stream, PID: p.pid, Line: string(text), Truncated: cut})
			}
			err = serr
		}
		if err != nil {
			return
		}
	}
}

// skipOutput reads and drops what br (over r) holds until until, when the
// worker's line budget has room again, or r's end: what the server spends
// on it is a read of up to skipRead bytes and a count of their newlines,
// about what the worker spent writing them, not a line's work each. It
// stops at a line's end where it can (the bytes after it go back to br);
// midLine says it stopped within a line, whose rest the caller drops. It
// returns the lines it dropped, each counted at its end, and the bytes
// (a line that never ends is bytes and no line). inLine: it
// begins within a line (an over-long one), whose rest it counts as one
// and keeps none of in tail: it is no whole line.
func skipOutput(src *outputSource, br *bufio.Reader, until time.Time, inLine bool) (lines, size int, midLine bool, tail []byte, err error) {
	r := src.r
	midLine = inLine
	headless := inLine
	// tail is the last tailKeep bytes dropped, ending at a line's end.
	keep := func(b []byte) {
		if headless {
			i := bytes.IndexByte(b, '\n')
			if i < 0 {
				return
			}
			b, headless = b[i+1:], false
		}
		tail = append(tail, b...)
		if len(tail) > 2*tailKeep {
			tail = append(tail[:0:0], tail[len(tail)-tailKeep:]...)
		}
	}
	defer func() {
		end := bytes.LastIndexByte(tail, '\n') + 1
		tail = tail[max(0, end-tailKeep):end]
	}()
	// A pipe takes a deadline (os.Pipe's ends are in the poller): a worker
	// that stopped printing ends the drop when the budget has room. Should
	// it not, the drop ends at the first read after then.
	if r.SetReadDeadline(until) == nil {
		defer r.SetReadDeadline(time.Time{})
	}
	nl := []byte{'\n'}
	if n := br.Buffered(); n > 0 {
		chunk, _ := br.Peek(n)
		lines, midLine, size = bytes.Count(chunk, nl), chunk[n-1] != '\n', n
		keep(chunk)
		br.Discard(n)
	}
	buf := make([]byte, skipRead)
	for read, reads := 0, 0; ; reads++ {
		if read >= skipMax || reads >= skipReads {
			// The rest waits in the pipe, the worker's writes with it,
			// until the budget has room: what a drop costs the server is
			// bounded, whatever the worker spends writing.
			time.Sleep(time.Until(until))
			return lines, size, midLine, tail, nil
		}
		n := copy(buf, src.left)
		src.left = src.left[n:]
		if n == 0 {
			n, err = r.Read(buf)
		}
		if err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) {
				err = nil
			}
			return lines, size, midLine, tail, err
		}
		read += n
		chunk := buf[:n]
		if !time.Now().Before(until) {
			if i := bytes.LastIndexByte(chunk, '\n'); i >= 0 {
				src.left = chunk[i+1:]
				keep(chunk[:i+1])
				return lines + bytes.Count(chunk[:i+1], nl), size + i + 1, false, tail, nil
			}
		}
		size += n
		keep(chunk)
		lines += bytes.Count(chunk, nl)
		midLine = chunk[n-1] != '\n'
	}
}

// lastLines is the last n lines of b (lines ended by newlines, without
// them), b's first line left out unless b holds its start: a tail cut at
// tailKeep bytes may begin within a line. They alias b.
func lastLines(b []byte, n int) [][]byte {
	var out [][]byte
	for end := len(b) - 1; end >= 0 && len(out) < n; {
		start := bytes.LastIndexByte(b[:end], '\n') + 1
		if start == 0 && len(b) >= tailKeep {
			break // may be the rest of a line cut off
		}
		out = append(out, b[start:end])
		end = start - 1
	}
	slices.Reverse(out)
	return out
}

// skipRead is what skipOutput reads at once: a pipe's default capacity;
// skipMax and skipReads are the most a drop reads, in bytes (about a
// millisecond of the server's CPU) and in reads (a worker writing a line
// at a time, as printf does, costs a read a line: some 50 ms), after which
// the worker's writes wait for the drop's end.
const (
	skipRead  = 64 << 10
	skipMax   = 4 << 20
	skipReads = 16 << 10
	// tailKeep is how much of a drop's end is kept, its last lines (up
	// to outputResume) passed on after the count.
	tailKeep = 64 << 10
)

// outputSource is a worker stream read by a bufio.Reader, with what a
// drop read past the line it stopped at (left) read before the rest of r.
type outputSource struct {
	r    *os.File
	left []byte
}

func (l *outputSource) Read(b []byte) (int, error) {
	if len(l.left) > 0 {
		n := copy(b, l.left)
		l.left = l.left[n:]
		return n, nil
	}
	return l.r.Read(b)
}

// lineBudget bounds the lines of a worker's output the server passes on: a
// token bucket of outputBurst lines, refilled at outputRate a second. Past
// it the worker's output is dropped until outputResume lines have room, so
// that a worker printing without end has one line a second say how many
// were dropped.
type lineBudget struct {
	mu     sync.Mutex
	tokens float64
	at     time.Time
}

const (
	outputRate   = 1000
	outputBurst  = 10000
	outputResume = outputRate
)

func (b *lineBudget) fill(now time.Time) {
	if b.at.IsZero() {
		b.tokens = outputBurst
	} else {
		b.tokens = min(outputBurst, b.tokens+now.Sub(b.at).Seconds()*outputRate)
	}
	b.at = now
}

// take spends a line of the budget; false if it has none.
func (b *lineBudget) take(now time.Time) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.fill(now)
	if b.tokens < 1 {
		return false
	}
	b.tokens--
	return true
}

// readyAt is when the budget will hold outputResume lines.
func (b *lineBudget) readyAt(now time.Time) time.Time {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.fill(now)
	return now.Add(time.Duration(max(0, outputResume-b.tokens) / outputRate * float64(time.Second)))
}

// readMark reads the fatal mark a tenant's worker wrote as it died
// (wire.FatalFD) into fatal, and checked mode's report of the fault that
// killed a checked worker into fault. Written by the dying process itself,
// they are in the pipe once the process is dead: what the pipe holds now is
// read, without waiting for its end, which a child the bundle forked
// could hold back. At most markKeep bytes of it are kept, the last.
func (p *proc) readMark() {
	if p.marks == nil {
		return
	}
	defer p.marks.Close()
	rc, err := p.marks.SyscallConn()
	if err != nil {
		return
	}
	var kept []byte
	buf := make([]byte, markKeep)
	rc.Read(func(fd uintptr) bool {
		// os.Pipe's end is non-blocking already, for the poller; said
		// again, as a read that blocked on a pipe a forked child holds
		// would keep the death from ever being reported.
		if unix.SetNonblock(int(fd), true) != nil {
			return true
		}
		for total := 0; total < markRead; {
			n, err := unix.Read(int(fd), buf)
			if err == unix.EINTR {
				continue
			}
			if n <= 0 {
				break // empty (EAGAIN), or its end
			}
			total += n
			kept = append(kept, buf[:n]...)
			kept = kept[max(0, len(kept)-markKeep):]
		}
		return true
	})
	if _, id, ok := wire.ParseFatal(kept); ok {
		p.fatal.Store(id)
	}
	p.fault, _ = wire.ParseFault(kept)
}

// markKeep is how many of the mark pipe's last bytes readMark keeps, many
// marks' worth; markRead bounds what it reads (the pipe holds 64 KiB
// unless the bundle grew it).
const (
	markKeep = 4 << 10
	markRead = 1 << 20
)

// output passes on one line the worker wrote: with Options.Output (plover
// run: the author's terminal) there, marked with its stream; once the
// worker runs a function, to its program's ProgramSpec.Output,
// which the server log traces at a bounded rate; before (a standby's own
// start-up errors), the first startLines to the server log. A bundle
// cannot flood the server's log or its memory.
func (p *proc) output(l api.LogLine) {
	d := p.d
	if w := d.opts.Output; w != nil {
		more := ""
		if l.Truncated > 0 {
			more = fmt.Sprintf(" [%d more bytes cut]", l.Truncated)
		}
		d.outMu.Lock()
		fmt.Fprintf(w, "%s | %s%s\n", l.Stream, l.Line, more)
		d.outMu.Unlock()
		return
	}
	if p.tenant != nil && (p.tenantOutput(l) || p.reported.Load()) {
		return
	}
	if o := p.out.Load(); o != nil {
		o.Add(l)
		return
	}
	if p.startOut.Add(1) <= startLines {
		d.opts.Log.Warn("worker output", "pid", p.pid, "stream", l.Stream, "line", l.Line)
	}
}

// output holds a program's device.Output for an atomic pointer.
type output struct{ device.Output }

// startLines is how many lines of a worker's not yet a function's (or of
// a server that keeps no function output) reach the server log.
const startLines = 20
