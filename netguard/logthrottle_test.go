package netguard

import (
	"fmt"
	"net"
	"testing"
	"time"
)

// LogThrottle: one line a second per client, counted as the connection
// caps count one (an IPv6 host by its /64, whatever its port), and one
// client's refusals do not hold back another's.
func TestLogThrottle(t *testing.T) {
	var l LogThrottle
	for _, tc := range []struct {
		client string
		want   bool
	}{
		{"10.0.0.1:1", true}, {"10.0.0.1:2", false}, {"10.0.0.2:1", true}, {"10.0.0.1:3", false}, {"10.0.0.2:1", false},
		{"[2001:db8:1:2::1]:1", true}, {"[2001:db8:1:2::ffff]:2", false}, {"[2001:db8:1:3::1]:1", true},
	} {
		addr, err := net.ResolveTCPAddr("tcp", tc.client)
		if err != nil {
			t.Fatal(err)
		}
		if got, _ := l.Allow(addr); got != tc.want {
			t.Errorf("Allow(%s) = %v, want %v", tc.client, got, tc.want)
		}
	}
}

// Many clients together log at most maxRefusalLines refusals a second:
// each client's own limit alone let a range of addresses (an IPv6 /48's
// 65,536 /64s) log a line per refusal.
func TestLogThrottleBoundsAllClients(t *testing.T) {
	clock := time.Unix(1_000_000, 0)
	l := LogThrottle{now: func() time.Time { return clock }}
	told := 0 // refusals the logged lines said were held back
	allowed := func() int {
		n := 0
		for i := range 200 {
			addr := &net.TCPAddr{IP: net.ParseIP(fmt.Sprintf("2001:db8:0:%x::1", i)), Port: 1}
			if ok, unlogged := l.Allow(addr); ok {
				n++
				told += unlogged
			}
		}
		return n
	}
	if n := allowed(); n != maxRefusalLines {
		t.Fatalf("200 clients' refusals in one second: %d logged, want %d", n, maxRefusalLines)
	}
	clock = clock.Add(time.Second)
	if n := allowed(); n != maxRefusalLines {
		t.Fatalf("the next second: %d logged, want %d", n, maxRefusalLines)
	}
	// The first line of the second second said what the first held back.
	if told != 200-maxRefusalLines {
		t.Errorf("the lines said %d refusals were not logged, want %d", told, 200-maxRefusalLines)
	}
}

// AllowLine, for lines each of which tells of a bug (a recovered panic),
// keeps only the overall cap: many lines of one second pass up to it,
// the rest are held back and counted for the next line to say.
func TestLogThrottleAllowLine(t *testing.T) {
	clock := time.Unix(1_000_000, 0)
	l := LogThrottle{now: func() time.Time { return clock }}
	n := 0
	for range 30 {
		if ok, _ := l.AllowLine(); ok {
			n++
		}
	}
	if n != maxRefusalLines {
		t.Fatalf("30 lines in one second: %d allowed, want %d", n, maxRefusalLines)
	}
	clock = clock.Add(time.Second)
	if ok, unlogged := l.AllowLine(); !ok || unlogged != 30-maxRefusalLines {
		t.Fatalf("the next second's first line: allowed %v, not_logged %d, want true, %d", ok, unlogged, 30-maxRefusalLines)
	}
}

// AllowKey lets a line about a key (a function) through once a second,
// within the overall cap, and the next line it lets through for the key
// says how many of the key's it held back, by either.
func TestLogThrottleAllowKey(t *testing.T) {
	clock := time.Unix(1_000_000, 0)
	l := LogThrottle{now: func() time.Time { return clock }}
	for i, tr := range []struct {
		after    time.Duration // the clock moves on by it first
		key      string
		ok       bool
		unlogged int
	}{
		{0, "a", true, 0},
		{0, "a", false, 0},
		{0, "b", true, 0},
		{500 * time.Millisecond, "a", false, 0},
		{0, "fill", true, 0}, // the cap's 18 lines left in this second, one of them each
		{0, "c", false, 0},   // held back by the cap
		{500 * time.Millisecond, "a", true, 2},
		{0, "c", true, 1},
		{0, "b", true, 0},
		{0, "b", false, 0},
	} {
		clock = clock.Add(tr.after)
		if tr.key == "fill" {
			for k := range maxRefusalLines - 2 {
				if ok, _ := l.AllowKey(fmt.Sprintf("k%d", k)); !ok {
					t.Fatalf("row %d: key k%d's first line held back under the cap", i, k)
				}
			}
			continue
		}
		if ok, unlogged := l.AllowKey(tr.key); ok != tr.ok || unlogged != tr.unlogged {
			t.Fatalf("row %d (%s): allowed %v, not_logged %d, want %v, %d", i, tr.key, ok, unlogged, tr.ok, tr.unlogged)
		}
	}
}
