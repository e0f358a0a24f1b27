package engine

// Control is the engine's control plane: deploys, rollbacks, deletes,
// garbage collection and the views of functions and versions. It sits
// beside the request path (Engine.Invoke) and shares the engine's state;
// the HTTP front end reaches the two through separate interfaces, so that
// each can be served, authorised or moved on its own.
type Control struct{ e *Engine }

// Control returns the engine's control plane.
func (e *Engine) Control() *Control { return &Control{e} }
