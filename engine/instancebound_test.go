package engine_test

import (
	"bytes"
	"context"
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/plover-run/plover/bundle"
	"github.com/plover-run/plover/engine"
	"github.com/plover-run/plover/errdefs"
	"github.com/plover-run/plover/internal/testkit"
)

// A node whose workers hold at most 2 instances (each a thread of a worker
// bounded by --worker-max-pids): a min_instances it could not keep is
// refused at deploy (422, naming the field, the flag and the bound); a
// max_instances over it deploys with a warning and is served as the
// bound. Before, both were taken, and the worker that made the
// instances past its task bound was aborted by the Go runtime, its
// other functions with it, again every restart.
func TestWorkerInstanceBound(t *testing.T) {
	const why = "plover serve --worker-max-pids 20, less 18 of the worker's own threads"
	e := testkit.Engine(t, engine.Config{WorkerInstances: 2, WorkerInstancesWhy: why})
	for _, tc := range []struct {
		name          string
		min, max      int
		refused, warn string // what the refusal, or the one warning, says; "" none
		room          int    // Pin.Room once served: max_instances as served, plus max_queue 3
	}{
		{"min over the bound", 3, 4, "min_instances: 3 is more than the 2 instances one worker may hold on this node (" + why + ")", "", 0},
		{"max over the bound", 1, 4, "", "max_instances: 4 is served as 2, the instances one worker may hold on this node (" + why + "): requests past them queue", 5},
		{"within the bound", 2, 2, "", "", 5},
	} {
		t.Run(tc.name, func(t *testing.T) {
			name := strings.ReplaceAll(tc.name, " ", "-")
			m := testkit.Manifest(name)
			m.MinInstances, m.MaxInstances, m.MaxQueue = tc.min, tc.max, 3
			b, _, _, err := bundle.PackBytes(testkit.BundleDir(t, m, nil))
			if err != nil {
				t.Fatal(err)
			}
			fi, err := e.Control().Deploy(context.Background(), name, bytes.NewReader(b), false)
			if tc.refused != "" {
				var de *errdefs.Error
				if !errors.As(err, &de) || de.Kind != errdefs.KindInvalid || !strings.Contains(err.Error(), tc.refused) {
					t.Fatalf("deploy: %v; want 422 saying %q", err, tc.refused)
				}
				return
			}
			if err != nil {
				t.Fatalf("deploy: %v", err)
			}
			if got := strings.Join(fi.Warnings, "; "); got != tc.warn {
				t.Errorf("warnings %q, want %q", got, tc.warn)
			}
			if got := roomOf(t, e, name); got != tc.room {
				t.Errorf("room %d, want %d (max_instances as served, and max_queue)", got, tc.room)
			}
		})
	}
}

// A version's room (max_instances plus max_queue) saturates: a Go
// caller's MaxQueue of math.MaxInt wrapped it negative, and a pipeline
// then ran its parallel branches one at a time.
func TestRoomSaturates(t *testing.T) {
	e := testkit.Engine(t, engine.Config{MaxQueue: math.MaxInt})
	testkit.Deploy(t, e, testkit.BundleDir(t, testkit.Manifest("fn"), nil))
	if got := roomOf(t, e, "fn"); got != math.MaxInt {
		t.Fatalf("room %d, want %d", got, math.MaxInt)
	}
}

// roomOf is the room of name's current version (Pin.Room), loaded by a
// request first.
func roomOf(t *testing.T, e *engine.Engine, name string) int {
	t.Helper()
	invoke(t, e, name, []byte("x"))
	p, err := e.Pin(context.Background(), name, time.Now().Add(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Release()
	return p.Room()
}

// A reap period of 0 (a quarter of an --idle-ttl of 3 ns) is taken as
// the least period, where it panicked in time.NewTicker after the server
// had started serving.
func TestReapEveryTakesAZeroPeriod(t *testing.T) {
	e := testkit.Engine(t, engine.Config{})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	e.ReapEvery(ctx, 0) // returns, ctx being done
}
