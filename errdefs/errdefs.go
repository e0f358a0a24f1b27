// Package errdefs holds the classes of error every layer of Plover shares:
// the engine and the pipelines produce them, the transports map each to a
// status once (package apierr), and metrics and traces count them. It
// imports nothing of Plover, so any package may use it without reaching
// into the engine.
package errdefs

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// Kind classifies an error for the front end (which maps it to a status).
type Kind int

const (
	KindInternal      Kind = iota // 500
	KindBadRequest                // 400: malformed request
	KindNotFound                  // 404: unknown function
	KindTooLarge                  // 413: input over the function's maximum
	KindInvalid                   // 422: invalid manifest, chain or bundle
	KindKernel                    // 500: the chain reported a failure
	KindUnavailable               // 503: device unhealthy, store down
	KindTimeout                   // 504: deadline passed before the request ran
	KindBusy                      // 429: no capacity and no room to wait
	KindGone                      // 499: the client went away while the request waited
	KindWorkerCrashed             // 500: the process running the function died
	KindConflict                  // 409: the record kept changing under an update
	KindNoSpace                   // 507: the node's disk is full
	KindForbidden                 // 403: the caller may not do this (a pipeline naming a function it may not invoke)
	KindRejected                  // 422: the function refused its input (plover_reject): the client's fault
)

// Error is a classified error: a kind, a message for the client, and the
// cause for logs.
type Error struct {
	Kind Kind
	Msg  string
	Err  error
	// RetryAt is when the same request may succeed, where the server
	// knows it (a version's crash back-off ends then); zero: not known.
	// The transports tell the client the wait (HTTP's Retry-After).
	RetryAt time.Time
}

// Error is the message plus the cause, unless the message already quotes it
// (many do, so that clients see the reason).
func (e *Error) Error() string {
	if e.Err != nil && !strings.Contains(e.Msg, e.Err.Error()) {
		return e.Msg + ": " + e.Err.Error()
	}
	return e.Msg
}

func (e *Error) Unwrap() error { return e.Err }

// New is an Error of kind k with a formatted message and cause err (nil:
// none).
func New(k Kind, err error, format string, a ...any) *Error {
	return &Error{Kind: k, Msg: fmt.Sprintf(format, a...), Err: err}
}

// Unavailable is a 503 whose message carries its cause: a store or device
// failure the client can act on or report ("endpoint unreachable",
// "CUDA_ERROR_ILLEGAL_ADDRESS"), not only that something failed.
func Unavailable(err error, format string, a ...any) *Error {
	msg := fmt.Sprintf(format, a...)
	if err != nil {
		msg += ": " + err.Error()
	}
	return &Error{Kind: KindUnavailable, Msg: msg, Err: err}
}

// NoFunction is the cause of an error about a name no function has (a 404,
// a pipeline step that names it): the name, so that the front door can
// suggest one within a typo of it that the caller may see.
type NoFunction struct {
	Name string
	Err  error // what said so (the store's ErrNoFunction), or nil
}

// UnknownFunction is the 404 of a name no function has: err is what said
// so (nil: the name cannot be a function's), why a note after the message.
// The name is kept for a did-you-mean, copied (it may be a request's
// bytes); the message quotes its head only. The engine answers every name
// it does not have with it, and the transports a name their caller may
// not learn of (gate.View.Hide), so that the two read alike.
func UnknownFunction(name string, err error, why string) *Error {
	name = strings.Clone(name)
	return New(KindNotFound, &NoFunction{Name: name, Err: err}, "function %s not found%s", QuoteName(name), why)
}

func (e *NoFunction) Error() string {
	if e.Err != nil {
		return e.Err.Error()
	}
	return "no function is named " + QuoteName(e.Name)
}

// QuoteName is name quoted for a message, its first 64 bytes at most
// ("..." after): a name may be a request's, as long as its body limit,
// and a client is answered with it, a log line written with it.
func QuoteName(name string) string {
	if len(name) > 64 {
		return strconv.Quote(head(name, 64)) + "..."
	}
	return strconv.Quote(name)
}

// head is s's first n bytes, or fewer (at most 3) so as not to end inside
// a UTF-8 character, which a quote would show as \x escapes and a span
// exporter might refuse; s itself where it is no longer. It shares s's
// memory.
func head(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for k := n; k > n-4 && k > 0; k-- {
		if utf8.RuneStart(s[k]) {
			return s[:k]
		}
	}
	return s[:n]
}

// Clip is s, something a client sent or an error quoting it, as a message
// keeps it: whole up to n bytes, else its head and its length ("...
// (8388609 bytes)"). A value may be as long as a request's body, and was
// copied whole into each message wrapping it.
func Clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return head(s, n) + "... (" + strconv.Itoa(len(s)) + " bytes)"
}

// KeptName is name, a request's, as kept past it in a log field, a span
// attribute or a map key: a copy of it where it is no longer than 64
// bytes (a function's name is at most 63), else its head quoted
// (QuoteName). A name no function can have may be as long as the
// request's body limit (a gRPC model_name), and kept whole it held
// that much of the server's memory after the request's budget let go.
func KeptName(name string) string {
	if len(name) > 64 {
		return QuoteName(name)
	}
	return strings.Clone(name)
}

func (e *NoFunction) Unwrap() error { return e.Err }

// RetryAt is the first RetryAt set on an Error in err's chain, or zero.
func RetryAt(err error) time.Time {
	for err != nil {
		if e, ok := err.(*Error); ok && !e.RetryAt.IsZero() {
			return e.RetryAt
		}
		switch u := err.(type) {
		case interface{ Unwrap() error }:
			err = u.Unwrap()
		case interface{ Unwrap() []error }:
			for _, e := range u.Unwrap() {
				if t := RetryAt(e); !t.IsZero() {
					return t
				}
			}
			return time.Time{}
		default:
			return time.Time{}
		}
	}
	return time.Time{}
}

// KindOf returns the kind of err (KindInternal for foreign errors).
func KindOf(err error) Kind {
	var e *Error
	if errors.As(err, &e) {
		return e.Kind
	}
	return KindInternal
}
