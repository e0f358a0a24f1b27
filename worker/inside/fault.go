package inside

import (
	"errors"
	"os"
	"strconv"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/plover-run/plover/device"
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
// claim is on its way), or a run that met the fault before its chain
// launched (its first driver calls: the fault is other work's), claims
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

// faultClaimWait is how long a run or call that met a fault it does not
// claim waits for another's claim before the process exits: the claimant
// is past its own run or call, and claims at once.
const faultClaimWait = 100 * time.Millisecond

// claimFault names program id as the one at fault, in a tenant's worker,
// if its run or call met the fault itself (own: it began on a healthy
// device) and no program was named before.
func (w *server) claimFault(id uint32, own bool) {
	if !w.cfg.Tenant || !own || id == 0 || !faultBy.CompareAndSwap(0, id) {
		return
	}
	// One write(2), as the signal handler's: the pipe is non-blocking, and
	// a pipe the bundle filled takes no mark (the server then blames every
	// program) rather than holding the exit up.
	mark := wire.FatalMark + "0 in program " + strconv.FormatUint(uint64(id), 10) + "\n"
	unix.Write(wire.FatalFD, []byte(mark))
	close(faultNamed)
}

// exitFault ends the worker for its device's fault, once its reply, if
// any, went out: in a tenant's worker after a claim (claimFault), or
// faultClaimWait without one.
func (w *server) exitFault() {
	if w.cfg.Tenant {
		select {
		case <-faultNamed:
		case <-time.After(faultClaimWait):
		}
	}
	os.Exit(wire.ExitFault)
}

// ranIntoFault reports whether err, a run's fault, was met by the run
// itself: the device's error comes with a *device.KernelError where the
// run's chain was launched before its driver calls met the sticky error,
// and alone where the run was refused up front, the device poisoned
// before it began, or met the error before its chain launched (other
// work poisoned the context: the run had launched nothing).
func ranIntoFault(err error) bool {
	var ke *device.KernelError
	return errors.As(err, &ke)
}
