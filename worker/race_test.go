//go:build race

package worker

// raceEnabled: under the race detector a worker's own resident memory
// (the detector's shadow of it) passes the small memory limits some tests
// give it.
const raceEnabled = true
