package grpcapi

import (
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"
)

// steppedLog hands each write to the test and waits for its word to
// finish it.
type steppedLog struct {
	wrote chan string
	next  chan struct{}
}

func (w *steppedLog) Write(p []byte) (int, error) {
	w.wrote <- string(p)
	<-w.next
	return len(p), nil
}

// Lines past the queue, while the log is stuck, are dropped, and the next
// line queued counts them with the throttle's own; the lines queued are
// all written, in order, once the log moves.
func TestRefusalLogDropsAndCountsPastItsQueue(t *testing.T) {
	w := &steppedLog{wrote: make(chan string), next: make(chan struct{})}
	q := &refusalLog{log: slog.New(slog.NewTextHandler(w, nil))}
	line := func(name string) []any { return []any{"reason", name} }
	wrote := func() string {
		select {
		case l := <-w.wrote:
			return l
		case <-time.After(10 * time.Second):
			t.Fatal("no line written")
			return ""
		}
	}

	q.add(line("first"), 0)
	if l := wrote(); !strings.Contains(l, "reason=first") { // being written: out of the queue
		t.Fatalf("wrote %q", l)
	}
	for i := range refusalQueue + 5 {
		unlogged := 0
		if i == refusalQueue+4 {
			unlogged = 1 // a dropped line's count is not lost with it
		}
		q.add(line(fmt.Sprint("q", i)), unlogged)
	}
	w.next <- struct{}{}
	got := []string{wrote()} // q0, out of the queue: room for one
	q.add(line("last"), 2)
	close(w.next)
	for !strings.Contains(got[len(got)-1], "reason=last") {
		got = append(got, wrote())
	}
	if len(got) != refusalQueue+1 {
		t.Fatalf("%d lines written after the first, want the %d queued and the last:\n%s", len(got), refusalQueue, strings.Join(got, ""))
	}
	for i, l := range got[:refusalQueue] {
		if !strings.Contains(l, fmt.Sprintf("reason=q%d\n", i)) || strings.Contains(l, "not_logged") {
			t.Fatalf("line %d: %q, want q%d, counting nothing", i, l, i)
		}
	}
	if !strings.Contains(got[refusalQueue], "not_logged=8") {
		t.Fatalf("the line after 5 dropped, one counting one more, and 2 held back by the throttle: %q, want not_logged=8", got[refusalQueue])
	}
	for deadline := time.Now().Add(10 * time.Second); RefusalWriters() > 0; {
		if time.Now().After(deadline) {
			t.Fatal("the goroutine writing the lines did not end with them")
		}
		select {
		case l := <-w.wrote:
			t.Fatalf("wrote %q, nothing more queued", l)
		case <-time.After(5 * time.Millisecond): // a poll of the state awaited
		}
	}
}
