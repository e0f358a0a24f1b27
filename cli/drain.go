package cli

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"google.golang.org/grpc"

	"github.com/plover-run/plover/grpcapi"
)

// drain stops the transports within --grace, and then the node, unless
// requests still run on its devices.
func (n *node) drain(force context.Context, f *serveFlags, t *transports, log *slog.Logger) error {
	t.srv.SetReady(false) // /readyz and ServerReady fail first; in-flight and queued requests drain
	log.Info("shutting down (a second SIGINT or SIGTERM ends the drain at once)", "grace", f.grace)
	sctx, cancel := context.WithTimeout(force, f.grace)
	defer cancel()
	// Both transports drain side by side, within the one grace period.
	// At its end, before they close their connections, the requests that
	// had not started to run are refused (a 503: retry on another node):
	// cut with the rest, a client could not tell them from a request cut
	// as it ran, and a proxy answered them 502.
	refuse := n.eng.RefuseQueued
	grpcDrained := make(chan bool, 1)
	if t.gs != nil {
		go func() { grpcDrained <- stopGRPC(sctx, t.gs, &t.shakes, refuse) }()
	} else {
		grpcDrained <- true
	}
	err := t.srv.Shutdown(sctx) // refuses as the gRPC drain does (httpapi.Options.RefuseQueued)
	if !<-grpcDrained && err == nil {
		err = context.DeadlineExceeded
	}
	cut, refused := n.eng.Unfinished()
	switch {
	case force.Err() != nil && err != nil: // after a drain that ended, a second signal cuts nothing
		// As below, the drain cut short by the operator: an error, so
		// that the exit status says requests may have been cut.
		log.Warn("a second signal: exiting now, requests still running are cut")
		return errors.New("stopped by a second signal before the drain finished")
	case errors.Is(err, context.DeadlineExceeded):
		// Requests are still running on the devices: leave them to the
		// process exit rather than free memory under them. They are cut
		// as by a second signal, and the exit status says so alike.
		log.Warn("grace period over with requests still running: exiting, they are cut", "grace", f.grace,
			"cut", cut, "refused", refused)
		return fmt.Errorf("stopped at the end of --grace %v with requests still running", f.grace)
	case refused > 0:
		log.Warn("grace period over: the requests that had not started were refused", "grace", f.grace, "refused", refused)
	}
	if n.repoDone != nil {
		select { // a deploy in flight ends with the scan's context
		case <-n.repoDone:
		case <-sctx.Done():
		}
	}
	n.close()
	if err != nil {
		return fmt.Errorf("shutdown: %w", err)
	}
	log.Info("stopped")
	return nil
}

// stopGRPC ends the connections still in their handshake (gRPC-Go's stops
// wait for them, up to its connection timeout: --read-timeout here), lets the gRPC server's calls finish
// until ctx ends, then cuts the rest; it reports whether they all
// finished. When ctx's deadline passed, refuse fails the calls that had
// not started to run first and, where it says calls are in flight, their
// answers have up to answerWait to be written.
func stopGRPC(ctx context.Context, gs *grpc.Server, shakes *grpcapi.Handshakes, refuse func() bool) bool {
	shakes.End()
	done := make(chan struct{})
	go func() { gs.GracefulStop(); close(done) }()
	select {
	case <-done:
		return true
	case <-ctx.Done():
	}
	if errors.Is(ctx.Err(), context.DeadlineExceeded) && refuse() {
		t := time.NewTimer(answerWait)
		defer t.Stop()
		select {
		case <-done: // every call ended, the running ones too
			return true
		case <-t.C:
		}
	}
	gs.Stop()
	return false
}

// answerWait bounds the writing of the answers refused at the end of the
// grace, as httpapi's drain does its own: the process exits about this
// long after the grace.
const answerWait = time.Second
