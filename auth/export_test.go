package auth

// WhileReloadWaits has Reload call f where it waits to read a file being
// written again, in place of the wait, until restore is called.
func WhileReloadWaits(f func()) (restore func()) {
	old := waitUnfinished
	waitUnfinished = f
	return func() { waitUnfinished = old }
}
