package engine_test

import (
	"context"
	"encoding/binary"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/plover-run/plover/call"
	"github.com/plover-run/plover/engine"
	"github.com/plover-run/plover/errdefs"
	"github.com/plover-run/plover/internal/testkit"
)

// A batched request's client is looked for while the request waits for a
// run, as an unbatched request's is while it waits for an instance, and
// not once a run has it: a client that half-closes its connection after
// its request (nc -N, some proxies) reads as gone to the transport's
// check, yet waits for its answer. Looked for through the run, it lost
// an answer computed for it (499) where an unbatched function answered.
func TestABatchedRequestsClientIsLookedForOnlyWhileItWaits(t *testing.T) {
	m := testkit.BatchManifest("b", 16, "")
	m.MaxInstances = 1
	mark := filepath.Join(t.TempDir(), "ran")
	e := testkit.Engine(t, engine.Config{})
	testkit.Deploy(t, e, batchBundle(t, m, `-DRUN_MARK="`+mark+`"`))
	invoke := func(in []byte, gone func() bool) chan batchResult {
		ch := make(chan batchResult, 1)
		go func() {
			req := &call.Request{Input: in, Gone: gone}
			err := e.Invoke(context.Background(), "b", req)
			r := batchResult{req: req, err: err}
			if err == nil && len(req.Output) == 8 {
				r.value = binary.LittleEndian.Uint32(req.Output)
			}
			ch <- r
		}()
		return ch
	}

	// Running: its client reads as gone from the run's start on (its
	// chain wrote the mark).
	var left atomic.Bool
	running := invoke(item(100, 300), left.Load)
	for end := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		if _, err := os.Stat(mark); err == nil {
			break
		}
		if time.Now().After(end) {
			t.Fatal("the batch's chain did not start")
		}
	}
	left.Store(true)
	// Waiting behind it: gone from the start.
	queued := invoke(item(200, 0), func() bool { return true })
	if r := <-queued; errdefs.KindOf(r.err) != errdefs.KindGone {
		t.Errorf("a queued request whose client left: %v (%v), want it dropped as gone", r.err, errdefs.KindOf(r.err))
	}
	if r := <-running; r.err != nil || r.value != 101 {
		t.Errorf("a running request whose client reads as gone: value %d, %v; want its answer, 101", r.value, r.err)
	}
}
