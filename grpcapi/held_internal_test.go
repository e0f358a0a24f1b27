package grpcapi

import (
	"log/slog"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/plover-run/plover/internal/testkit"
)

// heldTest is a heldSlots logging into log, and lines waits until log has
// want lines of what, failing should it have more.
func heldTest(t *testing.T) (*heldSlots, func(what string, want int)) {
	var log testkit.LogBuffer
	h := &heldSlots{log: slog.New(slog.NewTextHandler(&log, nil)), writeTimeout: time.Second}
	return h, func(what string, want int) {
		t.Helper()
		for end := time.Now().Add(10 * time.Second); strings.Count(log.String(), what) < want; time.Sleep(time.Millisecond) {
			if time.Now().After(end) {
				t.Fatalf("want %d lines %q:\n%s", want, what, log.String())
			}
		}
		if n := strings.Count(log.String(), what); n != want {
			t.Fatalf("%d lines %q, want %d:\n%s", n, what, want, log.String())
		}
	}
}

const heldClosed, heldFreed = "closed a gRPC connection", "the answers not taken on a closed gRPC connection are freed"

// An answer counted on a connection as it closed, after the connection's
// other answers were all freed, and then found held at its own write
// timeout, is waited for again: the connection is not closed twice (one
// line), and its freeing is logged a second time.
func TestALateAnswerOnAClosedConnectionIsWaitedFor(t *testing.T) {
	h, lines := heldTest(t)
	var c conns
	sc, _ := connPair(t, &c)
	for i := range 2 {
		sc.answers.Store(1)
		h.suspect(sc, "f", &lent{Landing: &countedLanding{}})
		lines(heldClosed, 1)
		sc.answers.Store(0)
		lines(heldFreed, i+1)
	}
	lines(heldClosed, 1) // the second round's line came after its close
}

// Answers found held at their write timeout are judged after a
// collection: one freed by then closes nothing; one still held closes its
// connection (a line a connection), whose answers are then waited for
// until they are freed (a line a connection once they all are). The loop
// ends once nothing is left, to start again for the next.
func TestHeldAnswersAreJudgedThenWaitedFor(t *testing.T) {
	h, lines := heldTest(t)
	running := func() bool {
		h.mu.Lock()
		defer h.mu.Unlock()
		return h.running
	}
	const closed, freed = heldClosed, heldFreed
	var c conns
	for round := range 2 {
		var held []*turnConn
		for range 3 {
			sc, _ := connPair(t, &c)
			sc.answers.Store(20)
			h.suspect(sc, "f", &lent{Landing: &countedLanding{}})
			held = append(held, sc)
		}
		kept, _ := connPair(t, &c)
		land := &lent{Landing: &countedLanding{}}
		h.suspect(kept, "f", land)
		land.release() // freed before it is judged
		lines(closed, 3*(round+1))
		for _, sc := range held {
			if !sc.closed.Load() {
				t.Fatalf("round %d: a connection of an answer still held after a collection is open", round)
			}
		}
		if kept.closed.Load() {
			t.Fatalf("round %d: the connection of an answer freed before it was judged was closed", round)
		}
		for _, sc := range held[:2] {
			sc.answers.Store(0)
		}
		lines(freed, 3*round+2)
		if !running() {
			t.Fatalf("round %d: the loop ended with a connection's answers still out", round)
		}
		held[2].answers.Store(0)
		lines(freed, 3*(round+1))
		for end := time.Now().Add(10 * time.Second); running() && time.Now().Before(end); {
			time.Sleep(time.Millisecond)
		}
		if running() {
			t.Fatalf("round %d: the loop still runs 10 s after every answer was freed", round)
		}
	}
}

// An answer suspected while a collection runs is judged after the next
// one, not after the one it came in the middle of: that one may have
// begun before its frame was dropped. Here it is freed by the next; judged
// after the first, its healthy connection was closed.
func TestAnAnswerSuspectedDuringACollectionWaitsForTheNext(t *testing.T) {
	h, _ := heldTest(t)
	var c conns
	first, _ := connPair(t, &c)
	late, _ := connPair(t, &c)
	lateLand := &lent{Landing: &countedLanding{}}
	closedBefore := make(chan bool, 1)
	var calls atomic.Int32
	h.gc = func() {
		runtime.GC()
		switch calls.Add(1) {
		case 1: // the first answer's collection: another is suspected
			h.suspect(late, "f", lateLand)
		case 2: // the late answer's own collection frees it
			closedBefore <- late.closed.Load()
			lateLand.release()
		}
	}
	land := &lent{Landing: &countedLanding{}}
	h.suspect(first, "f", land)
	land.release()
	select {
	case closed := <-closedBefore:
		if closed {
			t.Fatal("an answer suspected during a collection was judged on it: its connection was closed before a collection began after it")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no second collection within 10 s")
	}
}
