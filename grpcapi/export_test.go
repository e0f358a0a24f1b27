package grpcapi

import (
	"slices"

	"github.com/plover-run/plover/internal/testkit"
)

// RefusalsHeld is how many of the codec's refusals the server holds.
func RefusalsHeld(s *Server) int64 { return s.refused.n.Load() }

// RefusalWriters is how many goroutines are writing refusals' log lines,
// every Server's together.
func RefusalWriters() int { return testkit.Goroutines(".(*refusalLog).write(") }

// ConnFlows is the functions whose turns the server's open connections move
// in, sorted ("" for a connection in none).
func ConnFlows(s *Server) []string {
	var names []string
	s.conns.m.Range(func(_, v any) bool {
		name := ""
		if fl := v.(*turnConn).flow(); fl != nil {
			name = fl.Name()
		}
		names = append(names, name)
		return true
	})
	slices.Sort(names)
	return names
}
