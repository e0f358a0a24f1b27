package pipeline

import "time"

// SetInvokingHook makes f run as a parallel branch's step has been counted
// and is about to ask its function; it returns the restore.
func SetInvokingHook(f func()) (restore func()) {
	old := hookInvoking
	hookInvoking = f
	return func() { hookInvoking = old }
}

// SetMemoryWait sets how long a request waits for room in its node's
// Memory; it returns the restore.
func SetMemoryWait(d time.Duration) (restore func()) {
	old := memoryWait
	memoryWait = d
	return func() { memoryWait = old }
}
