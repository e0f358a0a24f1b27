package engine

import (
	"context"
	"slices"
	"sync"
	"time"
)

// nameList is the store's function names as last listed: the candidates of
// a did-you-mean when a request names no function (the front door's).
type nameList struct {
	mu      sync.Mutex
	names   []string
	at      time.Time // when listed; zero: never
	reading bool      // a listing is under way (Names)
}

// namesFresh is how long a listing serves before Names lists again, and
// namesRead how long that listing may take: a 404 waits for it.
const (
	namesFresh = 10 * time.Second
	namesRead  = 2 * time.Second
)

// listed keeps the names of a listing of the store's records' tags
// (registry.Tags), and ends a listing under way.
func (l *nameList) listed(tags map[string]string) {
	names := make([]string, 0, len(tags))
	for n := range tags {
		names = append(names, n)
	}
	l.mu.Lock()
	l.names, l.at, l.reading = names, time.Now(), false
	l.mu.Unlock()
}

// Names is every function's name in the store, as listed in the last
// namesFresh (by Refresh, which lists them on every poll, or here), and
// those this node has resolved since: for an error's path only. One
// listing at a time, within namesRead: a flood of requests for names no
// function has costs the store one listing per namesFresh, and a request
// that finds a listing under way takes the last one. A store that does not
// answer leaves the last listing (none: the names this node has), and is
// asked again after namesFresh.
func (e *Engine) Names() []string {
	l := &e.names
	l.mu.Lock()
	stale := time.Since(l.at) > namesFresh && !l.reading
	if stale {
		l.reading = true
	}
	l.mu.Unlock()
	if stale {
		ctx, cancel := context.WithTimeout(e.tab.life, namesRead)
		tags, err := e.tab.reg.Tags(ctx)
		cancel()
		if err == nil {
			l.listed(tags)
		} else {
			l.mu.Lock()
			l.at, l.reading = time.Now(), false // tried: not again before namesFresh
			l.mu.Unlock()
		}
	}
	l.mu.Lock()
	out := slices.Clone(l.names)
	l.mu.Unlock()
	out = append(out, e.tab.names()...)
	slices.Sort(out)
	return slices.Compact(out)
}
