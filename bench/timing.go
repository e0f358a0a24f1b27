package bench

import (
	"bytes"
	"time"
)

// Server-Timing metric names a Plover server sends, in this order.
const (
	Queue = iota
	Load
	CopyIn
	Kernels
	CopyOut
	Total
	Sched    // optional: servers before the device scheduler do not send it
	Resolve  // optional: finding the version and checking the request (newer servers)
	Dispatch // optional: the hand-over to the device and back, beside its phases (newer servers)
	Handoff  // optional, part of Dispatch: the run's message's wait for its worker process to read it
	Handback // optional, part of Dispatch: the worker's reply's wait for the server to read it
	NumMetrics
)

// optional are the metrics older servers (and runs in the server's
// process: handoff, handback) do not send.
const optional = 1<<Sched | 1<<Resolve | 1<<Dispatch | 1<<Handoff | 1<<Handback

// MetricNames are the Server-Timing names of the metrics, indexed by
// Queue..Handback.
var MetricNames = [NumMetrics]string{"queue", "load", "copyin", "kernels", "copyout", "total", "sched", "resolve", "dispatch", "handoff", "handback"}

var metricNameBytes = func() (b [NumMetrics][]byte) {
	for i, n := range MetricNames {
		b[i] = []byte(n)
	}
	return
}()

// ServerTiming is one response's Server-Timing breakdown.
type ServerTiming struct {
	Dur [NumMetrics]time.Duration
	// Has has bit i set when metric i was present with a valid dur.
	Has uint16
}

// Complete reports whether every Plover metric but the optional ones was
// present.
func (t *ServerTiming) Complete() bool { return t.Has|optional == 1<<NumMetrics-1 }

// ParseServerTiming reads a Server-Timing header value such as
// "queue;dur=0.002, load;dur=0, copyin;dur=0.61, ..." into t without
// allocating. Names it does not know and parameters other than dur are
// skipped; a metric h does not carry is 0 in t.Dur (not what t held
// before: one Sample serves a connection's every response). It reports
// whether every Plover metric was found.
func ParseServerTiming(h []byte, t *ServerTiming) bool {
	*t = ServerTiming{}
	for len(h) > 0 {
		var entry []byte
		if i := bytes.IndexByte(h, ','); i >= 0 {
			entry, h = h[:i], h[i+1:]
		} else {
			entry, h = h, nil
		}
		name, params := entry, []byte(nil)
		if i := bytes.IndexByte(entry, ';'); i >= 0 {
			name, params = entry[:i], entry[i+1:]
		}
		name = trimSpace(name)
		m := -1
		for i := range metricNameBytes {
			if bytes.Equal(name, metricNameBytes[i]) {
				m = i
				break
			}
		}
		if m < 0 {
			continue
		}
		for len(params) > 0 {
			var p []byte
			if i := bytes.IndexByte(params, ';'); i >= 0 {
				p, params = params[:i], params[i+1:]
			} else {
				p, params = params, nil
			}
			p = trimSpace(p)
			if len(p) < 4 || (p[0]|0x20) != 'd' || (p[1]|0x20) != 'u' || (p[2]|0x20) != 'r' || p[3] != '=' {
				continue
			}
			v := trimSpace(p[4:])
			if len(v) >= 2 && v[0] == '"' && v[len(v)-1] == '"' {
				v = v[1 : len(v)-1]
			}
			if d, ok := ParseMillis(v); ok {
				t.Dur[m] = d
				t.Has |= 1 << m
			}
		}
	}
	return t.Complete()
}

func trimSpace(b []byte) []byte {
	for len(b) > 0 && (b[0] == ' ' || b[0] == '\t') {
		b = b[1:]
	}
	for len(b) > 0 && (b[len(b)-1] == ' ' || b[len(b)-1] == '\t') {
		b = b[:len(b)-1]
	}
	return b
}

// ParseMillis parses a non-negative decimal number of milliseconds
// ("12", "0.613", ".5") into a Duration, truncating below a nanosecond.
// Exponents, signs and values of 10^12 ms or more are refused: strconv
// would need a string, and a Plover server never sends them.
func ParseMillis(b []byte) (time.Duration, bool) {
	var whole, frac int64
	i, digits := 0, 0
	for ; i < len(b) && b[i] >= '0' && b[i] <= '9'; i++ {
		if digits++; digits > 12 {
			return 0, false
		}
		whole = whole*10 + int64(b[i]-'0')
	}
	fracDigits := 0
	if i < len(b) && b[i] == '.' {
		i++
		for ; i < len(b) && b[i] >= '0' && b[i] <= '9'; i++ {
			digits++
			if fracDigits < 6 { // 10^-6 ms is a nanosecond
				frac = frac*10 + int64(b[i]-'0')
				fracDigits++
			}
		}
	}
	if i != len(b) || digits == 0 {
		return 0, false
	}
	for ; fracDigits < 6; fracDigits++ {
		frac *= 10
	}
	return time.Duration(whole*int64(time.Millisecond) + frac), true
}
