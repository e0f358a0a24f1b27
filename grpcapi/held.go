package grpcapi

import (
	"log/slog"
	"runtime"
	"slices"
	"sync"
	"time"
)

// heldSlots asks the runtime to collect until the answers held on
// connections closed with some not taken (answerHeld) are freed: their
// slots given back, or the server's memory a copied one held. gRPC-Go
// drops what a closed connection's streams held unfreed, and the answers
// are freed through their cleanups only once that is collected, which a
// server at rest might not do for minutes. One loop for the server, not
// one a connection: a client that holds many answers costs a few
// collections, not one each.
type heldSlots struct {
	log *slog.Logger

	mu      sync.Mutex
	conns   []heldConn
	running bool
}

type heldConn struct {
	conn  *turnConn
	model string
	n     int32 // answers it held when it was closed
	since time.Time
}

// heldWaits are the waits before each collection: a closed connection's
// goroutines end within milliseconds, but one that still runs another
// call holds the transport, and with it the dropped frames, until that
// call ends; from then on one a heldWaits' last.
var heldWaits = []time.Duration{50 * time.Millisecond, 500 * time.Millisecond, 5 * time.Second}

// heldGiveUp is how long a connection's slots are waited for: past it the
// loop stops asking for them (their cleanups still give them back at a
// later collection).
const heldGiveUp = 2 * time.Minute

// add waits for the slots of conn's answers, n when it was closed.
func (h *heldSlots) add(conn *turnConn, model string, n int32) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.conns = append(h.conns, heldConn{conn, model, n, time.Now()})
	if !h.running {
		h.running = true
		go h.collect()
	}
}

func (h *heldSlots) collect() {
	for i := 0; ; i++ {
		time.Sleep(heldWaits[min(i, len(heldWaits)-1)])
		runtime.GC()
		now := time.Now()
		var back, lost []heldConn
		h.mu.Lock()
		h.conns = slices.DeleteFunc(h.conns, func(c heldConn) bool {
			switch {
			case c.conn.answers.Load() == 0:
				back = append(back, c)
			case now.Sub(c.since) > heldGiveUp:
				lost = append(lost, c)
			default:
				return false
			}
			return true
		})
		done := len(h.conns) == 0
		if done {
			h.running = false
		}
		h.mu.Unlock()
		for _, c := range back {
			h.log.Info("the answers not taken on a closed gRPC connection are freed",
				"model", c.model, "peer", c.conn.RemoteAddr().String(), "answers", c.n, "after", now.Sub(c.since).String())
		}
		for _, c := range lost {
			h.log.Warn("the answers not taken on a closed gRPC connection are not freed: something still holds the connection's frames; they are freed when those are collected",
				"model", c.model, "peer", c.conn.RemoteAddr().String(), "answers", c.conn.answers.Load(), "after", now.Sub(c.since).String())
		}
		if done {
			return
		}
	}
}
