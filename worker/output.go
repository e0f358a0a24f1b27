package worker

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
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
// start says why there).
func (p *proc) readOutput(r *os.File, stream string) {
	defer r.Close()
	said := stream != "stderr"
	defer func() {
		if !said { // nothing on stderr: a start failure need not wait for it
			close(p.said)
		}
	}()
	br := bufio.NewReaderSize(r, api.LogLineMax)
	nl := []byte{'\n'}
	for {
		b, err := br.ReadSlice('\n')
		if len(b) == 0 && err != nil {
			return
		}
		text := string(bytes.TrimSuffix(b, nl))
		cut := 0
		for err == bufio.ErrBufferFull {
			b, err = br.ReadSlice('\n')
			cut += len(bytes.TrimSuffix(b, nl))
		}
		if !said {
			p.said <- text
			close(p.said)
			said = true
		}
		p.output(api.LogLine{Time: time.Now(), Stream: stream, PID: p.pid, Line: text, Truncated: cut})
		if err != nil {
			return
		}
	}
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
