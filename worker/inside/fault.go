package inside

import (
	"os"
	"strconv"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/plover-run/plover/worker/wire"
)

// A device fault (a sticky CUDA error) poisons the worker's one context
// for every program in it, so the worker ends (wire.ExitFault) whichever
// program's run or call met it. In a tenant's worker the server must tell
// the program at fault from its siblings, which lost the worker by no
// fault of theirs (their requests are retried, no crash of theirs is
// counted): the first program whose own run or call met the fault is
// named on the report pipe (wire.FatalFD), as the fatal-signal handler
// names a program, with signal 0 (none: the worker's own exit), before
// its reply goes out. Its reply alone would not do: the server reads the
// replies of runs on several channels in no causal order, a fault in
// plover_instance_fini or plover_unload has no reply, and a sibling's run
// in flight may meet the same sticky error and answer it as its own.
//
// A run or call that began on a device already poisoned (the device's
// Health says so once a run or hook of a program's met the fault, whose
// claim is on its way), or that met the fault before its own code ran
// (device.OwnFault: a run's driver calls before its chain launched; a
// call's around its hook, such as an instance's buffers, a program's
// constants, an unload's frees: the fault is other work's), claims
// nothing. It waits a moment for the claim
// before the process exits, as the exit would end the claimant's goroutine
// before it wrote; with no claim (a mark the pipe did not take), the
// server blames every program, as for any death it cannot pin on one.
//
// The driver says that the context faulted, not whose kernel did it: where
// two programs' chains ran at once, the first to meet the error is named,
// on a real GPU likely (unproven) but not surely the one whose kernel
// faulted; a fault made by a thread of a bundle's own is named after the
// first program that meets it. A wrong name costs the named program one
// crash towards its back-off; the program at fault, its request retried
// as a bystander's, faults again in a fresh worker.

// faultBy is the program named for the fault (0: none yet); faultNamed is
// closed once it is.
var (
	faultBy    atomic.Uint32
	faultNamed = make(chan struct{})
)

// A run or call that met a fault it does not claim waits for another's
// claim before the process exits, as long as a chain runs in the worker
// or a hook may (a control call, an instance's close: the claimant's may
// be among them, its kernels done, its host code not yet) and
// faultClaimWait after the last ended (a claimant past its own run or
// call claims at once), at most faultClaimBound: a chain held in host
// code past the fault is not waited for beyond it, and the server then
// blames every program. The server waits 2 s for the worker's end before
// it kills it (proc.end), which would name no one either.
const (
	faultClaimWait  = 100 * time.Millisecond
	faultClaimBound = time.Second
)

// claimFault names program id as the one at fault, in a tenant's worker,
// if its run or call met the fault itself (own: it began on a healthy
// device and met the fault once its own code ran) and no program was
// named before. It reports whether it named id.
func (w *server) claimFault(id uint32, own bool) bool {
	if !w.cfg.Tenant || !own || id == 0 || !faultBy.CompareAndSwap(0, id) {
		return false
	}
	// One write(2), as the signal handler's: the pipe is non-blocking, and
	// a pipe the bundle filled takes no mark (the server then blames every
	// program) rather than holding the exit up.
	mark := wire.FatalMark + "0 in program " + strconv.FormatUint(uint64(id), 10) + "\n"
	unix.Write(wire.FatalFD, []byte(mark))
	close(faultNamed)
	return true
}

// exitFault ends the worker for its device's fault, once its reply, if
// any, went out. The claimant (claimed: its claimFault named it) exits at
// once. Another run or call, in a tenant's worker, waits for a claim
// (awaitClaim) and then, a moment at most, for the claimant's own exit,
// which follows its reply: an exit here would cut that reply off, and the
// request at fault would hear of a lost worker, not of its kernel's error.
func (w *server) exitFault(claimed bool) {
	if w.cfg.Tenant && !claimed && awaitClaim(faultClaimWait, faultClaimBound) {
		time.Sleep(faultClaimWait)
	}
	os.Exit(wire.ExitFault)
}

// awaitClaim returns once a program claimed the fault (true), or no chain
// ran in the worker for quiet, or bound passed.
func awaitClaim(quiet, bound time.Duration) bool {
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	now := time.Now()
	end, calm := now.Add(bound), now.Add(quiet)
	for {
		select {
		case <-faultNamed:
			return true
		case now = <-tick.C:
		}
		if running.Load() > 0 || hooking.Load() > 0 {
			calm = now.Add(quiet)
		}
		if now.After(calm) || now.After(end) {
			return false
		}
	}
}
