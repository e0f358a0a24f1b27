package netguard

// A log line throttle: the log is a resource hostile clients (and a full
// disk's failures) could flood as they could the connections.

import (
	"net"
	"strings"
	"sync"
	"time"
)

// LogThrottle lets a refusal's log line through at most once a second per
// client (ClientKey: an IPv4 address or an IPv6 /64, as the
// connection caps count one), so that a client hammering with bad tokens
// cannot flood the log; and at most maxRefusalLines a second in all, so
// that many clients (an IPv6 /48 holds 65,536 /64s) cannot flood it
// together. Those can take every line of a second, other clients' too:
// the next line logged says how many were held back by it (Allow's
// unlogged), and every refusal is counted (plover_auth_failures_total).
// Both transports use one. AllowKey throttles lines by what they are about
// instead (the front door's failure lines, by function).
type LogThrottle struct {
	mu       sync.Mutex
	last     map[string]time.Time
	keys     map[string]*keyLines // AllowKey's
	second   int64                // the Unix second lines counts
	lines    int
	unlogged int              // held back by the cap since the last line
	now      func() time.Time // tests' clock; nil: time.Now
}

// maxRefusalLines bounds the refusals logged a second, all clients together.
const maxRefusalLines = 20

// Allow reports whether a line about the client at addr may be logged
// now and, when it may, how many refusals the overall cap held back since
// the last line (for the line to say: not_logged).
func (p *LogThrottle) Allow(addr net.Addr) (ok bool, unlogged int) {
	client := ClientKey(addr)
	p.mu.Lock()
	defer p.mu.Unlock()
	now := p.clock()
	if p.last == nil || len(p.last) > 4096 {
		p.last = map[string]time.Time{} // bounded: forget everyone at once
	}
	if t, ok := p.last[client]; ok && now.Sub(t) < time.Second {
		return false, 0
	}
	if ok, unlogged = p.line(now); ok {
		p.last[client] = now
	}
	return ok, unlogged
}

// AllowLine is Allow under the overall cap alone, no client's own: for a
// line each of which tells of a bug (a recovered panic), which one client
// must not be able to keep to one a second while the next line's
// not_logged still says how many went unlogged.
func (p *LogThrottle) AllowLine() (ok bool, unlogged int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.line(p.clock())
}

// keyLines is a key's last line and the lines held back since.
type keyLines struct {
	at   time.Time
	held int
}

// AllowKey is Allow for lines about key (a function's name, which may be
// borrowed) rather than about a client: one a second per key, and the
// overall cap. unlogged is how many of key's own lines either held back
// since its last one (for the line to say: not_logged); past 4096 keys
// the throttle forgets them all at once, and those counts with them.
func (p *LogThrottle) AllowKey(key string) (ok bool, unlogged int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := p.clock()
	if p.keys == nil || len(p.keys) > 4096 {
		p.keys = map[string]*keyLines{}
	}
	k := p.keys[key]
	if k == nil {
		k = &keyLines{}
		p.keys[strings.Clone(key)] = k
	} else if now.Sub(k.at) < time.Second {
		k.held++
		return false, 0
	}
	if ok, _ := p.line(now); !ok {
		k.held++
		return false, 0
	}
	k.at, unlogged, k.held = now, k.held, 0
	return true, unlogged
}

func (p *LogThrottle) clock() time.Time {
	if p.now != nil {
		return p.now()
	}
	return time.Now()
}

// line takes one of the second's lines, if one is left. Called with p.mu
// held.
func (p *LogThrottle) line(now time.Time) (ok bool, unlogged int) {
	if sec := now.Unix(); sec != p.second {
		p.second, p.lines = sec, 0
	}
	if p.lines >= maxRefusalLines {
		p.unlogged++
		return false, 0
	}
	p.lines++
	unlogged, p.unlogged = p.unlogged, 0
	return true, unlogged
}
