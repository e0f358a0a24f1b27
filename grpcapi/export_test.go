package grpcapi

// RefusalsHeld is how many of the codec's refusals the server holds.
func RefusalsHeld(s *Server) int64 { return s.refused.n.Load() }
