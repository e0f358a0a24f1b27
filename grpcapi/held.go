package grpcapi

import (
	"log/slog"
	"runtime"
	"slices"
	"sync"
	"time"
)

// heldSlots decides what to do with answers still held past the write
// timeout (answerHeld), and then waits for them to be freed: their slots
// given back, or the server's memory a copied one held.
//
// An answer still held when its timer fires may not be held by anyone:
// gRPC-Go drops unfreed a frame queued as its client reset the stream,
// and it is freed only once collected, which a server at rest might not
// do for minutes. So an answer is judged after a collection: one freed by
// it closes nothing; one still held closes its connection, as an HTTP
// connection's write timeout would. gRPC-Go drops what a closed
// connection's streams held unfreed too, so the loop goes on collecting
// until the closed connections' answers are all freed. One loop for the
// server, not one an answer: a client that holds many answers costs a few
// collections, not one each.
type heldSlots struct {
	log          *slog.Logger
	writeTimeout time.Duration

	// gc runs a collection (nil: runtime.GC); tests look between one
	// and the judging that follows it.
	gc func()

	mu       sync.Mutex
	suspects []heldAnswer
	conns    []heldConn
	running  bool
}

// heldAnswer is an answer found held past the write timeout; collected
// says a collection has run since.
type heldAnswer struct {
	conn      *turnConn
	model     string
	land      *lent
	collected bool
}

type heldConn struct {
	conn  *turnConn
	model string
	n     int32 // answers it held when the server began to wait for them
	since time.Time
}

// heldWaits are the waits before each collection: an answer is judged
// after the first, and a closed connection's goroutines end within
// milliseconds, but one that still runs another call holds the transport,
// and with it the dropped frames, until that call ends; from then on one
// a heldWaits' last.
var heldWaits = []time.Duration{50 * time.Millisecond, 500 * time.Millisecond, 5 * time.Second}

// heldGiveUp is how long a connection's answers are waited for: past it
// the loop stops asking for them (their cleanups still free them at a
// later collection).
const heldGiveUp = 2 * time.Minute

// suspect has an answer of model's on conn, still held at its write
// timeout, judged after the next collection.
func (h *heldSlots) suspect(conn *turnConn, model string, land *lent) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.suspects = append(h.suspects, heldAnswer{conn: conn, model: model, land: land})
	h.start()
}

// start runs the loop unless it runs; h.mu is held.
func (h *heldSlots) start() {
	if !h.running {
		h.running = true
		go h.collect()
	}
}

func (h *heldSlots) collect() {
	for i := 0; ; i++ {
		time.Sleep(heldWaits[min(i, len(heldWaits)-1)])
		var held []heldAnswer
		h.mu.Lock()
		h.suspects = slices.DeleteFunc(h.suspects, func(a heldAnswer) bool {
			if a.collected && !a.land.done.Load() {
				held = append(held, a)
			}
			return a.collected
		})
		// Those suspected from here on see no collection begun before
		// they were: they wait for the next (suspect only appends, and
		// only this loop takes suspects out).
		before := len(h.suspects)
		h.mu.Unlock()
		for _, a := range held {
			h.close(a)
		}
		if h.gc != nil {
			h.gc()
		} else {
			runtime.GC()
		}
		now := time.Now()
		var freed, lost []heldConn
		h.mu.Lock()
		for i := range h.suspects[:before] {
			h.suspects[i].collected = true
		}
		h.conns = slices.DeleteFunc(h.conns, func(c heldConn) bool {
			switch {
			case c.conn.answers.Load() == 0:
				// An answer counted on it as it closed, and dropped
				// unfreed, is waited for anew once it is found held.
				c.conn.collecting.Store(false)
				freed = append(freed, c)
			case now.Sub(c.since) > heldGiveUp:
				lost = append(lost, c)
			default:
				return false
			}
			return true
		})
		done := len(h.conns) == 0 && len(h.suspects) == 0
		if done {
			h.running = false
		}
		h.mu.Unlock()
		for _, c := range freed {
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

// close closes the connection of a, an answer held past its write timeout
// and a collection (unless its client or gRPC-Go closed it first), and
// waits for its answers once.
func (h *heldSlots) close(a heldAnswer) {
	if first, _ := a.conn.close(); first { // one line a connection, not one an answer
		h.log.Warn("closed a gRPC connection: an answer was not taken within the write timeout",
			"model", a.model, "peer", a.conn.RemoteAddr().String(), "write_timeout", h.writeTimeout.String(), "answers_held", a.conn.answers.Load())
	}
	if a.conn.collecting.CompareAndSwap(false, true) {
		h.mu.Lock()
		h.conns = append(h.conns, heldConn{a.conn, a.model, a.conn.answers.Load(), time.Now()})
		h.mu.Unlock()
	}
}
