package cli

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

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
	grpcDrained := make(chan bool, 1)
	if t.gs != nil {
		go func() { grpcDrained <- stopGRPC(sctx, t.gs, &t.shakes) }()
	} else {
		grpcDrained <- true
	}
	err := t.srv.Shutdown(sctx)
	if !<-grpcDrained && err == nil {
		err = context.DeadlineExceeded
	}
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
		log.Warn("grace period over with requests still running: exiting, they are cut", "grace", f.grace)
		return fmt.Errorf("stopped at the end of --grace %v with requests still running", f.grace)
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
// finished.
func stopGRPC(ctx context.Context, gs *grpc.Server, shakes *grpcapi.Handshakes) bool {
	shakes.End()
	done := make(chan struct{})
	go func() { gs.GracefulStop(); close(done) }()
	select {
	case <-done:
		return true
	case <-ctx.Done():
		gs.Stop()
		return false
	}
}
