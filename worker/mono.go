package worker

import "time"

// The times kept in atomics (a program's last run, call and instance
// close; a device's last release and failed start; a tenant program's last
// busy moment) are readings of the monotonic clock, not Unix times: a wall
// clock stepped back by an hour (NTP) made each "since then" negative for
// that hour, so that a device stayed unhealthy, a load waited out its
// deadline for memory not coming back, a program kept its weight.

// monoBase is the readings' origin, an hour before the process started:
// no reading is 0, which the fields keep for "never".
var monoBase = time.Now().Add(-time.Hour)

// monoNow is the monotonic clock now, in ns since monoBase.
func monoNow() int64 { return monoOf(time.Now()) }

// monoOf is t (a time.Now reading, which carries the monotonic clock) in
// ns since monoBase.
func monoOf(t time.Time) int64 { return int64(t.Sub(monoBase)) }

// monoSince is how long ago reading x was.
func monoSince(x int64) time.Duration { return time.Duration(monoNow() - x) }
