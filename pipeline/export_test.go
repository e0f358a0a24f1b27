package pipeline

// SetInvokingHook makes f run as a parallel branch's step has been counted
// and is about to ask its function; it returns the restore.
func SetInvokingHook(f func()) (restore func()) {
	old := hookInvoking
	hookInvoking = f
	return func() { hookInvoking = old }
}
