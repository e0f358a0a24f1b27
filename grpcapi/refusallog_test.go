package grpcapi_test

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/plover-run/plover/auth"
	"github.com/plover-run/plover/engine"
	"github.com/plover-run/plover/grpcapi"
	pb "github.com/plover-run/plover/grpcapi/inferencepb"
	"github.com/plover-run/plover/internal/testkit"
)

// stuckLog is a log destination whose writes wait until it is released,
// as a full pipe or a stalled disk would.
type stuckLog struct {
	entered chan struct{} // closed at the first write
	release chan struct{}
	once    sync.Once
	mu      sync.Mutex
	b       strings.Builder
}

func newStuckLog() *stuckLog {
	return &stuckLog{entered: make(chan struct{}), release: make(chan struct{})}
}

func (w *stuckLog) Write(p []byte) (int, error) {
	w.once.Do(func() { close(w.entered) })
	<-w.release
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

func (w *stuckLog) String() string { w.mu.Lock(); defer w.mu.Unlock(); return w.b.String() }

// The tap refuses a call under its connection's transport lock: its log
// line is written elsewhere, so a log that cannot be written stalls
// neither the refused call nor the connection's next one, and once it can
// be, the line is written and the goroutine writing it ends.
func TestTapRefusalDoesNotWaitForTheLog(t *testing.T) {
	w := newStuckLog()
	f := serveEngine(t, testkit.Engine(t, engine.Config{}), table{"root": {Name: "root", Scopes: auth.Admin}},
		grpcapi.Options{Log: slog.New(slog.NewTextHandler(w, nil))})
	var releaseOnce sync.Once
	release := func() { releaseOnce.Do(func() { close(w.release) }) }
	t.Cleanup(release) // before the server stops: a stalled tap would hold its Stop

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	bad := metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer revoked")
	if _, err := f.client.ModelMetadata(bad, &pb.ModelMetadataRequest{Name: "echo"}); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("a refused call, its log stuck: %v, want Unauthenticated at once", err)
	}
	select {
	case <-w.entered:
	case <-ctx.Done():
		t.Fatal("the refusal was never written to the log")
	}
	if _, err := f.client.ServerLive(ctx, &pb.ServerLiveRequest{}); err != nil {
		t.Fatalf("the connection's next call, the log stuck: %v", err)
	}

	release()
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(w.String(), "request refused") || grpcapi.RefusalWriters() > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("log %q, %d goroutines still writing refusals", w.String(), grpcapi.RefusalWriters())
		}
		time.Sleep(5 * time.Millisecond) // a poll of the state awaited
	}
}
