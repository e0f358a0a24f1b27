package cli

import (
	"context"
	"fmt"
	"os"
	"os/signal"
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
}

// catchSignals starts catching them: those not ignored at the start
// (notifyContext).
func catchSignals() *outSignals {
	ctx, stop := notifyContext(os.Interrupt, syscall.SIGTERM, syscall.SIGHUP)
	return &outSignals{ctx: ctx, stop: stop}
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
		context.AfterFunc(s.ctx, s.stop)
		return
	}
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
// command exits 1, saying so.
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
// given no signal would catch every one).
func notifyContext(sigs ...os.Signal) (context.Context, context.CancelFunc) {
	var caught []os.Signal
	for _, s := range sigs {
		if !signal.Ignored(s) {
			caught = append(caught, s)
		}
	}
	if len(caught) == 0 {
		return context.WithCancel(context.Background())
	}
	return signal.NotifyContext(context.Background(), caught...)
}
