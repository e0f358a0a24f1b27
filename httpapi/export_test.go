package httpapi

import "time"

// SetFollowTimes sets a followed log stream's write bound and keep-alive
// interval for a test; the returned func restores them.
func SetFollowTimes(write, keepAlive time.Duration) func() {
	w, k := followWrite, followKeepAlive
	followWrite, followKeepAlive = write, keepAlive
	return func() { followWrite, followKeepAlive = w, k }
}
