package engine

import (
	"fmt"

	"github.com/plover-run/plover/errdefs"
)

// survived logs a panic of the engine's own background work for function
// name (what it was doing; v: recover's value, nil for none) with its
// stack, and returns it as an error (nil for none). That work runs on
// goroutines of the engine's (the reaper's, a top-up's, a server start's
// pre-warm) where nothing above recovers a panic, and a bug in a device's
// Go code (Health, Load, NewInstance, an instance's or a program's Close)
// ended the process, every tenant's requests with it. Call it in the
// deferred function that recovers.
func (e *Engine) survived(what, name string, v any) error {
	p := errdefs.Recovered(v)
	if p == nil {
		return nil
	}
	e.cfg.Log.Error(what+" panicked", "function", name, "panic", fmt.Sprint(p.Value), "stack", string(p.Stack))
	return fmt.Errorf("function %s: %s panicked: %v", name, what, p.Value)
}

// eachDespitePanics calls do with every x, the rest still once one call
// panics (a device's Go code closing an instance or a program): what is
// left after a panic is no one's to close. The panic goes on once all
// are done.
func eachDespitePanics[T any](xs []T, do func(T)) {
	if len(xs) == 0 {
		return
	}
	defer eachDespitePanics(xs[1:], do)
	do(xs[0])
}
