package engine

import (
	"context"
	"errors"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/plover-run/plover/api"
	"github.com/plover-run/plover/funclog"
	"github.com/plover-run/plover/ioshare"
	"github.com/plover-run/plover/sched"
)

// For the engine_test package's tests.
var WaitFor = waitFor

// SetAbandonHook makes f run in the call that abandons a dead program,
// under its pool's lock, before the crash is counted; it returns the
// restore.
func SetAbandonHook(f func()) (restore func()) {
	old := hookAbandoning
	hookAbandoning = f
	return func() { hookAbandoning = old }
}

// DeviceFlowShare is the weight and class name's device flow has on the
// first scheduler that has one (ok false: none).
func (e *Engine) DeviceFlowShare(name string) (weight float64, class sched.Class, ok bool) {
	for _, s := range e.scheds {
		if fl := s.Lookup(name); fl != nil {
			s.Flow(name) // takes the scheduler's lock: the reads below follow every Set
			return fl.Weight(), fl.Class(), true
		}
	}
	return 0, 0, false
}

// DeviceFlowWaiting is the runs waiting in name's flows on the devices'
// schedulers: each once, as the schedulers hold them.
func (e *Engine) DeviceFlowWaiting(name string) int {
	n := 0
	for _, s := range e.scheds {
		if fl := s.Lookup(name); fl != nil {
			n += fl.Waiting()
		}
	}
	return n
}

// ChargeIO is what the server's I/O shares call with a piece's CPU time
// (ioshare.Config.Charge): charges fl's function's device flows with it,
// reporting whether any took it.
func (e *Engine) ChargeIO(fl *ioshare.Flow, cpu time.Duration) bool { return e.chargeIO(fl, cpu) }

// IOLater is IO for name's function as this node has it now, asked for
// later: a request that found the function before a delete and a
// redeploy, and reads its body after them.
func (e *Engine) IOLater(name string) func() *ioshare.Flow {
	f, v := e.tab.peek(name)
	return func() *ioshare.Flow { return e.ioOf(f, v) }
}

// HasIOFlow reports whether the server's I/O shares have a flow for name.
func (e *Engine) HasIOFlow(name string) bool { return e.io.Lookup(name) != nil }

// BreakIdle takes an idle instance of name's current version and puts it
// back broken, as a request whose device turned unhealthy does: the
// instance is closed, the program kept. False when none was idle.
func (e *Engine) BreakIdle(name string) bool {
	_, v := e.tab.peek(name)
	if v == nil {
		return false
	}
	in := v.pool.takeIdle(nil)
	if in == nil {
		return false
	}
	v.pool.put(in, true, time.Now())
	return true
}

// ToppingUp reports a warm of name's current version to its
// min_instances under way (Reap's top-up, or a deploy's, a poll's or a
// start's pre-warm).
func (e *Engine) ToppingUp(name string) bool {
	_, v := e.tab.peek(name)
	return v != nil && v.warming.Load()
}

// CrashesCounted is the crashes of name's current version counted towards
// its back-off (0 again once it backs off); -1 without a version.
func (e *Engine) CrashesCounted(name string) int32 {
	_, v := e.tab.peek(name)
	if v == nil {
		return -1
	}
	return v.pool.crashCount.Load()
}

// TopUpFails is how many top-ups of name's current version failed in a row.
func (e *Engine) TopUpFails(name string) int32 {
	_, v := e.tab.peek(name)
	if v == nil {
		return -1
	}
	return v.topFails.Load()
}

// Print adds line to name's output as a worker of its function loaded
// here would (false: not loaded here).
func (e *Engine) Print(name, line string) bool {
	f, _ := e.tab.peek(name)
	if f == nil || f.out == nil {
		return false
	}
	f.out.Add(api.LogLine{Time: time.Now(), Stream: "stdout", PID: 1, Line: line})
	return true
}

// FollowedRemembered is how many names the node remembers the followed
// life of.
func (e *Engine) FollowedRemembered() int {
	fl := &e.tab.followed
	fl.mu.Lock()
	defer fl.mu.Unlock()
	return len(fl.m)
}

// FollowWhileRefreshWaits runs a Refresh and, once it waits for the lock of
// what the node remembers of followed names (its first wait there on a
// node that has loaded nothing), makes a follower of name in the life
// whose current version is version, as Logs does, remembering it first;
// then lets the Refresh go on and returns the follower and its error.
func (e *Engine) FollowWhileRefreshWaits(name, version string) (*funclog.Follower, error) {
	fl := &e.tab.followed
	fl.mu.Lock()
	var err error
	done := make(chan struct{})
	go func() {
		defer close(done)
		err = e.Refresh(context.Background())
	}()
	// Bounded: were sync.Mutex's layout to change, mutexWaited would never
	// see the wait, and the test fails instead of hanging.
	for end := time.Now().Add(10 * time.Second); !mutexWaited(&fl.mu); runtime.Gosched() {
		select {
		case <-done: // it never waited: the follower comes after it
		default:
			if time.Now().Before(end) {
				continue
			}
			fl.mu.Unlock()
			<-done
			return nil, errors.New("FollowWhileRefreshWaits: Refresh not seen waiting for the lock in 10 s (has sync.Mutex's layout changed?)")
		}
		break
	}
	if fl.m == nil {
		fl.m = map[string]followedIn{}
	}
	fl.m[name] = followedIn{version: version}
	_, f, ferr := e.logs.Follow(name, time.Time{})
	fl.mu.Unlock()
	<-done
	if ferr != nil {
		return nil, ferr
	}
	return f, err
}

// mutexWaited reports whether a goroutine waits for mu: its state's
// waiter count (sync.Mutex is internal/sync's, whose state comes first
// and counts waiters above its three flag bits).
func mutexWaited(mu *sync.Mutex) bool {
	return atomic.LoadInt32((*int32)(unsafe.Pointer(mu)))>>3 > 0
}

// AsideWarms is how many of a poll's pre-warms are under way.
func (e *Engine) AsideWarms() int {
	e.aside.mu.Lock()
	defer e.aside.mu.Unlock()
	return len(e.aside.m)
}

// BatchRunTook is the smoothed length of the batch runs of name's current
// version (0: none yet, or no batching).
func (e *Engine) BatchRunTook(name string) time.Duration {
	_, v := e.tab.peek(name)
	if v == nil || v.batch == nil {
		return 0
	}
	v.batch.mu.Lock()
	defer v.batch.mu.Unlock()
	return v.batch.runTook
}

// UnpacksWaiting is the deploys waiting for a turn to unpack their bundles.
func (e *Engine) UnpacksWaiting() int { return int(e.unpacks.waiting.Load()) }

// SetPollDeadline bounds each of Watch's polls to d, where pollLimit
// asks 10 s at least: a test's stalled read is cut sooner.
func (e *Engine) SetPollDeadline(d time.Duration) { e.pollDeadline = d }

// FloodingIO is what the server's I/O shares ask before a touch counts a
// flow light (ioshare.Config.Flooding).
func (e *Engine) FloodingIO(name string) bool { return e.floodingIO(name) }

// BatchAllocs records the size of every batch buffer made until the test
// ends.
func BatchAllocs(t testing.TB) *[]int64 {
	var mu sync.Mutex
	var sizes []int64
	hookBatchAlloc = func(n int64) {
		mu.Lock()
		sizes = append(sizes, n)
		mu.Unlock()
	}
	t.Cleanup(func() { hookBatchAlloc = func(int64) {} })
	return &sizes
}

// SpoolHeld is the bytes deploys' uploads hold of the node's spool budget
// and of tenant's part of it (0: no part kept).
func (e *Engine) SpoolHeld(tenant string) (node, part int64) {
	e.spools.mu.Lock()
	defer e.spools.mu.Unlock()
	if t := e.spools.tenant[tenant]; t != nil {
		part = t.b.InUse()
	}
	return e.spools.all.InUse(), part
}

// SpoolTenants is how many tenants' parts of the spool the node keeps.
func (e *Engine) SpoolTenants() int { return e.spools.tenants() }

// SetStoreCallBound sets the bound of a control call's store part until
// the test ends.
func SetStoreCallBound(t *testing.T, d time.Duration) {
	old := storeCallBound
	storeCallBound = d
	t.Cleanup(func() { storeCallBound = old })
}

// Knows reports whether this node has name's function (resolved, deployed
// or taken on by a poll), reading no store.
func (e *Engine) Knows(name string) bool { return e.tab.function(name) != nil }
