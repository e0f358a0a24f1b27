//go:build race

package httpapi_test

// raceEnabled: the race detector makes sync.Pool drop items on purpose, so
// pooled request state is reallocated and allocation counts do not hold.
const raceEnabled = true
