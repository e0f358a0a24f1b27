package cli

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"sync"
	"syscall"
)

// outSignals are the signals that end plover invoke and plover run (^C,
// SIGTERM, SIGHUP), caught from before --out's file is made until it is
// committed or removed: ended by a signal's default action, either left
// the temporary file beside FILE, and a FILE it had made, empty.
type outSignals struct {
	ctx  context.Context // done at the first signal
	stop context.CancelFunc
	pipe chan os.Signal // SIGPIPE's, while a temporary file is pending
	// once, while set, gives the signals back their default actions at
	// the first (context.AfterFunc's stop; nil: caught to the end).
	once func() bool
}

// catchSignals starts catching them (those not ignored at the start:
// notifyContext), once: opening --out's FILE can block (a FIFO with no
// reader), and a command caught there for good could be ended by SIGKILL
// alone. pending or hold keep them caught longer.
func catchSignals() *outSignals {
	ctx, stop := notifyContext(os.Interrupt, syscall.SIGTERM, syscall.SIGHUP)
	s := &outSignals{ctx: ctx, stop: stop}
	s.catchOnce()
	return s
}

// catchOnce gives the signals back their default actions at the first.
func (s *outSignals) catchOnce() {
	if s.once == nil {
		s.once = context.AfterFunc(s.ctx, s.stop)
	}
}

// hold keeps the signals caught until release: for what a second signal
// must not cut (a temporary file to remove, a run's clean-up), where no
// write can block meanwhile.
func (s *outSignals) hold() {
	if s.once != nil {
		s.once()
		s.once = nil
	}
}

// pending says what the command writes its output to: of, or stdout where
// of is nil.
//
// Written through (stdout, a FIFO, a device), the output has no temporary
// file to remove, and a write to it can block where the context cannot
// end it (a FIFO whose reader stopped, a stalled terminal): the signals
// are caught once, and a second has its default action.
//
// Held in a temporary file, the output's writes cannot block so, and the
// signals stay caught until the end: a second ^C that killed the process
// during a copy in place left FILE with the new output's start over the
// old one's end, and the temporary file.
//
// And SIGPIPE is caught, which makes a write to a stdout or stderr whose
// reader has gone (--timing 2>&1 | true) fail with EPIPE instead of the Go
// runtime ending the process by SIGPIPE, with the temporary file and an
// empty FILE left behind. Such a write is no failure of the command:
// stdout and stderr carry only what it says about the output, which goes
// to FILE, and a function that has run cannot be run back; a broken pipe
// costing its output would be worse than the message lost. Where the
// output itself goes to stdout, SIGPIPE keeps its default action, which a
// pipeline's head relies on to stop its writer.
func (s *outSignals) pending(of *outFile) {
	if of == nil || !of.whole() {
		s.catchOnce()
		return
	}
	s.hold()
	if !signal.Ignored(syscall.SIGPIPE) { // ignored, a write fails with EPIPE anyway
		s.pipe = make(chan os.Signal, 1) // never read: a signal it has no room for is dropped
		signal.Notify(s.pipe, syscall.SIGPIPE)
	}
}

// release gives the signals back their default actions.
func (s *outSignals) release() {
	s.stop()
	if s.pipe != nil {
		signal.Stop(s.pipe)
	}
}

// beforeCommit runs as commit starts (a variable for the tests: a signal
// that comes after the output is whole).
var beforeCommit = func(sig context.Context) {}

// commit commits of, and says interrupted where a signal came before its
// end. A signal cannot stop a commit midway, which would leave FILE half
// old and half new; nor is a whole output dropped for one that came after
// the last byte (the function has run): FILE gets it whole, and the
// command says so, exiting as the signal's status does.
func (s *outSignals) commit(of *outFile) error {
	beforeCommit(s.ctx)
	if err := of.commit(); err != nil {
		return err
	}
	if s.ctx.Err() != nil && of.whole() {
		return fmt.Errorf("interrupted once the output was whole: --out %s holds all of it", of.name)
	}
	return nil
}

// notifyContext is signal.NotifyContext for those of sigs not ignored at
// the start: catching one that was ignored undoes the ignoring
// (os/signal), and a command run under nohup, or as a background job
// whose ^C is ignored, would then be ended by the hangup or the ^C it was
// meant to outlive. With none left, it catches nothing (NotifyContext
// given no signal would catch every one). The context's cause is the
// signal that came (caughtSignal), which os/signal's does not expose.
func notifyContext(sigs ...os.Signal) (context.Context, context.CancelFunc) {
	var caught []os.Signal
	for _, s := range sigs {
		if !signal.Ignored(s) {
			caught = append(caught, s)
		}
	}
	ctx, cancel := context.WithCancelCause(context.Background())
	if len(caught) == 0 {
		return ctx, func() { cancel(nil) }
	}
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, caught...)
	done := make(chan struct{})
	go func() {
		select {
		case sig := <-ch:
			cancel(caughtSignal{sig})
		case <-done:
		}
	}()
	// Until stop, later signals stay caught (and dropped), as
	// NotifyContext's do.
	return ctx, sync.OnceFunc(func() {
		signal.Stop(ch)
		close(done)
		cancel(nil)
	})
}

// caughtSignal is the cause of a context a signal ended.
type caughtSignal struct{ sig os.Signal }

func (c caughtSignal) Error() string { return c.sig.String() + " signal received" }

// status is the command's error err, with the exit status a shell gives a
// command a signal ended (128 and the signal's number: 130 for ^C) where
// one came before it ended: a script telling an interrupted invoke from a
// failed one read 1 for both.
func (s *outSignals) status(err error) error {
	var c caughtSignal
	if err == nil || !errors.As(context.Cause(s.ctx), &c) {
		return err
	}
	n, ok := c.sig.(syscall.Signal)
	if !ok {
		return err
	}
	return &exitError{128 + int(n), err}
}
