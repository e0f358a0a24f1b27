package grpcapi

import (
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/plover-run/plover/internal/testkit"
)

// The slots of the answers on connections closed for holding one are
// waited for until they are back: a line a connection says so once they
// all are, and the loop ends once no connection is left, to start again
// for the next.
func TestHeldSlotsAreWaitedForUntilTheyAreBack(t *testing.T) {
	var log testkit.LogBuffer
	h := heldSlots{log: slog.New(slog.NewTextHandler(&log, nil))}
	running := func() bool {
		h.mu.Lock()
		defer h.mu.Unlock()
		return h.running
	}
	var c conns
	for round := range 2 {
		var held []*turnConn
		for range 3 {
			sc, _ := connPair(t, &c)
			sc.answers.Store(20)
			h.add(sc, "f", 20)
			held = append(held, sc)
		}
		for _, sc := range held[:2] {
			sc.answers.Store(0)
		}
		// One connection's answers still out: the loop goes on.
		for end := time.Now().Add(10 * time.Second); strings.Count(log.String(), "are freed") < 2*round+2; time.Sleep(time.Millisecond) {
			if time.Now().After(end) {
				t.Fatalf("round %d: no line for the connections whose answers are back:\n%s", round, log.String())
			}
		}
		if !running() {
			t.Fatalf("round %d: the loop ended with a connection's answers still out", round)
		}
		held[2].answers.Store(0)
		for end := time.Now().Add(10 * time.Second); running() && time.Now().Before(end); {
			time.Sleep(time.Millisecond)
		}
		if running() {
			t.Fatalf("round %d: the loop still runs 10 s after every slot was back", round)
		}
		// Its lines are written as it ends.
		for end := time.Now().Add(10 * time.Second); strings.Count(log.String(), "are freed") < 3*(round+1); time.Sleep(time.Millisecond) {
			if time.Now().After(end) {
				t.Fatalf("round %d: want %d lines saying a connection's slots are back:\n%s", round, 3*(round+1), log.String())
			}
		}
		if n := strings.Count(log.String(), "the answers not taken on a closed gRPC connection are freed"); n != 3*(round+1) {
			t.Fatalf("round %d: %d lines say a connection's slots are back, want %d:\n%s", round, n, 3*(round+1), log.String())
		}
	}
}
