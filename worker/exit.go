package worker

import (
	"fmt"

	"github.com/plover-run/plover/device"
)

// ProcessExit is the death of the worker process a program lived in: a
// signal, an exit, or a broken channel. Everything the program held is gone
// with it. It is the worker's device.Loss: callers above the device seam
// read only RanNowhere, ByServer and LogAttrs.
type ProcessExit struct {
	PID    int
	Reason string // "killed by signal SIGSEGV (segmentation fault)", "exited with status 0", ...
	// Fault is checked mode's report of the access that killed the
	// process (its entry, buffer and byte), told after Reason unless the
	// loss is Shared: a sibling's clients learn nothing of another
	// function's code.
	Fault  string
	During string // "running the chain", "loading the bundle", ...
	// BeforeRun: the process was gone before this request reached it, so
	// the request ran nowhere and may be retried on a fresh process.
	BeforeRun bool
	// Killed: the server stopped the process (a chain past its deadline, a
	// memory limit, a message out of turn), not a crash of its own.
	Killed bool
	// Shared: the process was a tenant's, shared with other programs, and
	// ended by another program's fault or ending, not this one's.
	Shared bool
	// By is the function at fault where the loss is Shared and one was
	// named (blame): in the server's log only, as a sibling's clients may
	// not be allowed to know of another function.
	By string
}

var _ device.Loss = (*ProcessExit)(nil)

func (e *ProcessExit) Error() string {
	if e.Shared {
		return fmt.Sprintf("worker process %d, its tenant's, shared, %s while %s: lost by another function of the tenant, not by this one", e.PID, e.reason(), e.During)
	}
	return fmt.Sprintf("worker process %d %s while %s", e.PID, e.reason(), e.During)
}

// reason is Reason, with Fault where the loss is this program's own.
func (e *ProcessExit) reason() string {
	if e.Fault == "" || e.Shared {
		return e.Reason
	}
	return e.Reason + ": " + e.Fault
}

func (e *ProcessExit) RanNowhere() bool { return e.BeforeRun }
func (e *ProcessExit) ByServer() bool   { return e.Killed }
func (e *ProcessExit) Collateral() bool { return e.Shared }

// LogAttrs names the process, how it ended and what it was doing.
func (e *ProcessExit) LogAttrs() []any {
	attrs := []any{"pid", e.PID, "reason", e.reason(), "during", e.During}
	if e.Shared && e.By != "" {
		attrs = append(attrs, "lost_by", e.By)
	}
	return attrs
}
