package grpcapi

import "github.com/plover-run/plover/internal/testkit"

// RefusalsHeld is how many of the codec's refusals the server holds.
func RefusalsHeld(s *Server) int64 { return s.refused.n.Load() }

// RefusalWriters is how many goroutines are writing refusals' log lines,
// every Server's together.
func RefusalWriters() int { return testkit.Goroutines(".(*refusalLog).write(") }
