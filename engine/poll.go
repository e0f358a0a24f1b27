package engine

import (
	"context"
	"sync"
)

// poll is what one Refresh learned of its record reads.
type poll struct {
	ctx  context.Context
	slow map[string]bool // the names whose read was cut in the last poll: read last
	cut  map[string]bool // the names whose read ran out of this poll's time
	err  error           // the first read's error
}

// read runs the read of name's record (f), keeping its error; a read that
// began within the poll's time and failed once it was out was cut by it
// (one begun after fails at once, or reads a store that ignores ctx).
func (p *poll) read(name string, f func() error) {
	late := p.ctx.Err() != nil
	err := f()
	if err == nil {
		return
	}
	if p.err == nil {
		p.err = err
	}
	if !late && p.ctx.Err() != nil {
		p.cut[name] = true
	}
}

// slowReads is the names whose record read the last poll cut (poll.cut).
type slowReads struct {
	mu sync.Mutex
	m  map[string]bool
}

func (s *slowReads) take() map[string]bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	m := s.m
	s.m = nil
	return m
}

func (s *slowReads) keep(m map[string]bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.m = m
}
