package errdefs

import (
	"fmt"
	"runtime/debug"
)

// Panic is a panic recovered in a goroutine that serves a request without
// being the request's own (a batched run, a pipeline's parallel branch),
// where nothing else would recover it and the process would end: carried
// to the request's goroutine and raised there again, panic(p), for its
// transport to recover, answer (500, gRPC's Internal), log and count. Its
// text carries the stack where it was raised, which the request's does
// not show.
type Panic struct {
	Value any
	Stack []byte
}

func (p *Panic) Error() string {
	return fmt.Sprintf("%v (raised in another goroutine: %s)", p.Value, p.Stack)
}

// Recovered is v, recover's value, as a *Panic (nil for nil), the stack
// taken now: call it in the deferred function that recovered. A *Panic
// raised again and recovered once more (a batched run's, in a pipeline's
// branch) is kept as it was, with its first stack.
func Recovered(v any) *Panic {
	switch p := v.(type) {
	case nil:
		return nil
	case *Panic:
		return p
	}
	return &Panic{Value: v, Stack: debug.Stack()}
}

// ErrPanicked is what a request whose work panicked is counted as (plover
// ls, a function's errors), the panic going on up to its transport, which
// answers it 500: counted when it ended, as the success a nil error reads
// as, it was not counted as a failure at all.
var ErrPanicked = New(KindInternal, nil, "the request's work panicked")
