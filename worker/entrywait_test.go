package worker

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/plover-run/plover/device"
	"github.com/plover-run/plover/internal/testkit"
)

// An entry lookup (a chain override's kernel) waits for its tenant's
// worker's control channel, held by a sibling's call, until its request's
// deadline, however much later than loadBound (the wait's bound with no
// deadline): a far deadline gets its lookup once the channel is free, a
// near one fails at it, not after a fixed 10 s, saying it never started
// and what it waited for. Before, the wait was 10 s whatever the deadline.
func TestEntryWaitFollowsTheRequestsDeadline(t *testing.T) {
	d := tenantDevice(t)
	d.loadBound = 100 * time.Millisecond
	m := testkit.Manifest("echo")
	g := loadFor(t, d, "t", "", m, nil).(*program)
	hold := func() (release func()) {
		g.p.ctlTok <- struct{}{} // as a sibling's load would hold the channel
		return func() { <-g.p.ctlTok }
	}

	release := hold()
	time.AfterFunc(400*time.Millisecond, release)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := g.EntryContext(ctx, "add_one"); err != nil {
		t.Fatalf("a lookup due in 10 s behind a 400 ms call (loadBound 100 ms): %v", err)
	}

	release = hold()
	defer release()
	ctx, cancel = context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	t0 := time.Now()
	_, err := g.EntryContext(ctx, "sleep_ms")
	if took := time.Since(t0); took > 2*time.Second {
		t.Errorf("a lookup due in 200 ms gave up after %v", took)
	}
	if !errors.Is(err, device.ErrNotStarted) || !strings.Contains(err.Error(), "waiting for the worker's control channel (resolving an entry point)") {
		t.Errorf("a lookup due in 200 ms behind a held channel: %v, want ErrNotStarted saying what it waited for", err)
	}
	if _, err := g.Entry("sleep_ms"); !errors.Is(err, device.ErrNotStarted) {
		t.Errorf("a lookup with no deadline behind a held channel: %v, want ErrNotStarted at loadBound", err)
	}
	if !g.Alive() {
		t.Fatalf("the worker ended (%v)", g.Death())
	}
}
