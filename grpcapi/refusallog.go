package grpcapi

import (
	"log/slog"
	"sync"
)

// refusalLog writes refusals' log lines off the caller's path. The tap
// runs in the connection's reader goroutine under its transport's lock
// (gRPC-Go's operateHeaders), so a log sink that blocks there (a full
// pipe, a slow disk) stalled every stream of the connection. Lines wait
// in a short queue, one second of the throttle's lines; past it they are
// dropped, and the next line queued says how many with the throttle's own
// (not_logged). A goroutine writes them while there are any and then ends:
// a Server holds none while nothing is refused, and there is nothing to
// stop.
type refusalLog struct {
	log     *slog.Logger
	mu      sync.Mutex
	queue   []refusalLine
	dropped int  // lines, and those they counted, since the last line queued
	writing bool // a goroutine is writing the queue
}

// refusalQueue is how many lines wait at most: netguard.LogThrottle lets 20
// through a second.
const refusalQueue = 20

type refusalLine struct {
	attrs    []any
	unlogged int // lines held back or dropped before this one
}

// add queues a line, or drops it if the queue is full.
func (q *refusalLog) add(attrs []any, unlogged int) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.queue) >= refusalQueue {
		q.dropped += 1 + unlogged
		return
	}
	q.queue = append(q.queue, refusalLine{attrs, unlogged + q.dropped})
	q.dropped = 0
	if !q.writing {
		q.writing = true
		go q.write()
	}
}

// write writes the queue's lines until it is empty.
func (q *refusalLog) write() {
	for {
		q.mu.Lock()
		if len(q.queue) == 0 {
			q.writing = false
			q.queue = nil // a burst's backing array goes with it
			q.mu.Unlock()
			return
		}
		l := q.queue[0]
		q.queue = q.queue[1:]
		q.mu.Unlock()
		if l.unlogged > 0 {
			l.attrs = append(l.attrs, "not_logged", l.unlogged) // refusals the log's caps held back before this one
		}
		q.log.Warn("request refused", l.attrs...)
	}
}
