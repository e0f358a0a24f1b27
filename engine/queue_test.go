package engine_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/plover-run/plover/call"
	"github.com/plover-run/plover/engine"
	"github.com/plover-run/plover/errdefs"
	"github.com/plover-run/plover/internal/testkit"
)

// Clients in closed loops no more than a function takes at once
// (max_instances running and max_queue waiting) are never refused: a
// slot freed while requests wait is handed to the oldest, which counts as
// running from then. With a channel of slots a waiter given one still
// counted as waiting until it ran, and a client's next request, sent in
// that moment, was refused (299 of 600 for 2 clients of 1 + 1). The
// bound itself: TestFullQueueAndDeadlines.
func TestClosedLoopClientsWithinTheQueueAreServed(t *testing.T) {
	for _, tc := range []struct {
		name             string
		instances, queue int
		clients          int
	}{
		{"one running, one waiting, 2 clients", 1, 1, 2},
		{"two running, two waiting, 4 clients", 2, 2, 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := testkit.Engine(t, engine.Config{})
			m := testkit.Slow("one", 1)
			m.MaxInstances, m.MaxQueue = tc.instances, tc.queue
			testkit.Deploy(t, e, testkit.BundleDir(t, m, nil))
			var refused, served atomic.Int64
			var wg sync.WaitGroup
			for range tc.clients {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for range 150 {
						err := e.Invoke(context.Background(), "one", &call.Request{Input: []byte("abcdefgh")})
						switch {
						case err == nil:
							served.Add(1)
						case errdefs.KindOf(err) == errdefs.KindBusy:
							refused.Add(1)
						default:
							t.Error(err)
						}
					}
				}()
			}
			wg.Wait()
			if n := refused.Load(); n > 0 {
				t.Errorf("%d of %d requests refused (429)", n, n+served.Load())
			}
		})
	}
}
