package worker

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"golang.org/x/sys/unix"

	"github.com/plover-run/plover/device"
	"github.com/plover-run/plover/worker/wire"
)

// Calls on a worker's control channel: one at a time, each within its
// deadline, and what a channel that fails or hangs up says of the worker.

// failed turns a channel error of g's run or call into its error: past
// its deadline the server kills the process, for g (nil: none).
func (p *proc) failed(g *program, err error, during string) error {
	if errors.Is(err, os.ErrDeadlineExceeded) {
		p.killFor(g, "the request's deadline passed while "+during)
		return fmt.Errorf("%w while %s", device.ErrDeadline, during)
	}
	return p.lost(during)
}

// call sends one control message (with descriptors) and returns the reply,
// within ctx's deadline; past it the worker is killed. The reply is read
// with wire.DecodeControlReply: it is never empty.
func (p *proc) call(ctx context.Context, g *program, c wire.Control, fds []int, during string) ([]byte, error) {
	return p.callTurn(ctx, 0, g, c, fds, during)
}

// runsBundleCode reports whether a control call may run bundle code, so
// that what the worker prints meanwhile may be its program's. A slot's
// registration or drop runs none: counted as its program's, it made a
// sibling's lines in a tenant's worker nobody's (tenantOutput), at every
// idle slot's drop, 30 s after any burst.
func runsBundleCode(op byte) bool { return op != wire.OpSlot && op != wire.OpDropSlot }

// callTurn is call whose own bound, when not 0, starts once the channel is
// its turn: the wait behind a sibling's calls (a tenant's worker) ends with
// ctx, the call itself after bound. A call that would go out with less
// than minCallTime of its deadline left is not sent: it could only time
// out, and a call timing out kills the worker, a tenant's with every
// sibling in it.
func (p *proc) callTurn(ctx context.Context, bound time.Duration, g *program, c wire.Control, fds []int, during string) ([]byte, error) {
	if _, ok := ctx.Deadline(); !ok { // a pre-warm, say: still bounded
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, maxControlWait)
		defer cancel()
	}
	select {
	case p.ctlTok <- struct{}{}:
	default:
		select {
		case p.ctlTok <- struct{}{}:
		case <-ctx.Done():
			return nil, fmt.Errorf("%w, waiting for the worker's control channel (%s)", device.ErrNotStarted, during)
		}
	}
	defer func() { <-p.ctlTok }()
	if bound > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(context.WithoutCancel(ctx), bound)
		defer cancel()
	} else if dl, _ := ctx.Deadline(); time.Until(dl) < p.minCallTime() {
		return nil, fmt.Errorf("%w: too little of its time was left once the worker's control channel was free (%s)", device.ErrNotStarted, during)
	}
	speaks := runsBundleCode(c.Op)
	p.mu.Lock()
	gone := p.ctlGone
	p.ctlBusy, p.calling = !gone, during
	if speaks {
		p.callingProg = g
	}
	p.mu.Unlock()
	if gone {
		return nil, g.lost(during)
	}
	p.cpu.calling(p, 1)
	defer p.cpu.calling(p, -1)
	defer func() {
		if p.tenant != nil && speaks {
			g.callEnded.Store(monoNow())
		}
		p.mu.Lock()
		p.ctlBusy, p.callingProg = false, nil
		gone := p.ctlGone
		p.mu.Unlock()
		if gone {
			p.ctl.Close()
		}
	}()
	// Between calls the worker has nothing to say: a message waiting now
	// is bundle code writing to the channel (or a reply it pushed ahead of
	// the last one), which this call would read as its own reply.
	if p.pending() {
		p.kill("it wrote to its control channel out of turn")
		return nil, g.lost(during)
	}
	dl, _ := ctx.Deadline()
	p.ctl.SetDeadline(dl)
	// Cancellation, too, ends the wait (as a deadline). AfterFunc runs
	// it on a goroutine of its own, which may set the deadline after this
	// call has handed the channel on, and cut the next call: one begun
	// is waited for first.
	fired := make(chan struct{})
	stop := context.AfterFunc(ctx, func() { p.ctl.SetDeadline(time.Now()); close(fired) })
	defer func() {
		if !stop() {
			<-fired
		}
	}()
	var oob []byte
	if len(fds) > 0 {
		oob = unix.UnixRights(fds...)
	}
	_, _, err := p.ctl.WriteMsgUnix(wire.AppendControl(nil, c), oob, nil)
	n := 0
	if err == nil {
		n, err = p.ctl.Read(p.buf)
	}
	// A message of no bytes reads as io.EOF (the net package takes a
	// read of 0 bytes for the end on any socket but a datagram one): with
	// the worker's end still open it is bundle code's (a reply is never
	// empty), ended at once for g as any reply it forged, not waited on
	// for 2 s as a death (p.end), the channel held, then killed for no one.
	if (errors.Is(err, io.EOF) || err == nil && n == 0) && !p.ctlHungUp() {
		p.killFor(g, "it sent an empty message on its control channel while "+during)
		return nil, g.lost(during)
	}
	if err != nil {
		if bound > 0 && errors.Is(err, os.ErrDeadlineExceeded) {
			// Its own bound passed, no request's deadline (a drop has no
			// request): the kill says so. Its reply, were it to come,
			// would be read as the next call's: the worker goes.
			p.killFor(g, fmt.Sprintf("it did not answer within %v while %s", bound, during))
		}
		return nil, g.failed(err, during)
	}
	if n == 0 {
		return nil, g.lost(during)
	}
	return append([]byte(nil), p.buf[:n]...), nil
}

// reply decodes raw, g's worker's answer to op while during. One that
// does not decode ends the worker, as any message out of protocol does:
// it was an invalid-input error naming no function, and the worker served
// on.
func (g *program) reply(op byte, raw []byte, during string) (wire.Reply, error) {
	rep, err := wire.DecodeControlReply(op, raw)
	if err != nil {
		g.p.killFor(g, fmt.Sprintf("it sent a malformed reply while %s (%v)", during, err))
		return rep, g.lost(during)
	}
	return rep, nil
}

// pending reports whether a message waits on the control channel (an
// empty one too), without reading it.
func (p *proc) pending() bool {
	rc, err := p.ctl.SyscallConn()
	if err != nil {
		return false
	}
	waiting := false
	// Control, not Read: Read checks the last call's deadline first, long
	// past by now, and would skip the look. On a closed channel Control
	// does not call the function: the call finds the worker gone its own
	// way.
	rc.Control(func(fd uintptr) {
		pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN | unix.POLLRDHUP}}
		if n, err := unix.Poll(pfd, 0); err != nil || n == 0 || pfd[0].Revents&unix.POLLIN == 0 {
			return
		}
		var b [1]byte
		n, _, err := unix.Recvfrom(int(fd), b[:], unix.MSG_PEEK|unix.MSG_DONTWAIT)
		// Nothing to read with the worker's end closed or shut for writing
		// is the end, not a message.
		ended := pfd[0].Revents&(unix.POLLHUP|unix.POLLRDHUP) != 0
		waiting = err == nil && (n > 0 || !ended)
	})
	return waiting
}

// errEmptyMessage is a message of no bytes on a worker's channel whose
// worker's end is open: bundle code's.
var errEmptyMessage = errors.New("an empty message")

// hungUp reports whether the peer of socket fd closed its end or shut it
// for writing: a read of no bytes was then the end, else an empty message.
// A poll that fails says so too (the end, as before).
func hungUp(fd int) bool {
	pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLRDHUP}}
	for {
		n, err := unix.Poll(pfd, 0)
		if err == unix.EINTR {
			continue
		}
		return err != nil || n > 0 && pfd[0].Revents&(unix.POLLHUP|unix.POLLRDHUP|unix.POLLERR|unix.POLLNVAL) != 0
	}
}

// ctlHungUp is hungUp for the control channel; a channel closed here
// reads as hung up.
func (p *proc) ctlHungUp() bool {
	rc, err := p.ctl.SyscallConn()
	if err != nil {
		return true
	}
	up := true
	if rc.Control(func(fd uintptr) { up = hungUp(int(fd)) }) != nil {
		return true
	}
	return up
}

// instanceGrace is how long past its request's deadline an instance
// creation may take before its worker is stopped.
const instanceGrace = 2 * time.Second

// maxControlWait bounds a control call whose context has no deadline.
const maxControlWait = time.Minute

// minCallTime is the least time left to its deadline with which a control
// call is sent (callTurn); minTenantCallTime in a tenant's worker, where a
// call's timeout ends every sibling: one that waited behind a sibling's
// load (30 s at most) until little of its time was left (an instance's
// creation has its request's deadline and a 2 s grace) fails its request
// instead, where a bundle's plover_instance_init merely slower than what
// was left would have cost them all their worker.
const (
	minCallTime       = 5 * time.Millisecond
	minTenantCallTime = 250 * time.Millisecond
)

func (p *proc) minCallTime() time.Duration {
	if p.tenant != nil {
		return minTenantCallTime
	}
	return minCallTime
}
