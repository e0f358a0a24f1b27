// Package apierr maps Plover's error classes to what each transport says:
// an HTTP status with Plover's error code name, and a gRPC status code. It
// is the one table both transports read (as containerd's errdefs maps its
// error classes once per transport), so a class cannot mean 404 over HTTP
// and Internal over gRPC.
package apierr

import (
	"errors"
	"fmt"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/errdefs"
	"google.golang.org/grpc/codes"
)

// Status is one class's answer on each transport.
type Status struct {
	HTTP int        // the HTTP status code
	Name string     // Plover's error code in {"error": {"code": ...}}
	GRPC codes.Code // the gRPC status code
}

// Classes the engine does not produce: the front door's refusals and a
// request the transport itself could not parse.
var (
	Unauthenticated = Status{401, "unauthenticated", codes.Unauthenticated}
	Forbidden       = Status{403, "forbidden", codes.PermissionDenied}
	RateLimited     = Status{429, "rate_limited", codes.ResourceExhausted}
	BadRequest      = Status{400, "bad_request", codes.InvalidArgument}
	NotFound        = Status{404, "not_found", codes.NotFound}
	// BadOutput is a function whose output the protocol cannot carry
	// (too few bytes for its declared outputs, a NaN in JSON data).
	BadOutput        = Status{500, "bad_output", codes.Internal}
	UnsupportedMedia = Status{415, "unsupported_media_type", codes.InvalidArgument}
	// RequestTimeout is a client that did not send its request (headers
	// or body) within the server's read timeout.
	RequestTimeout = Status{408, "request_timeout", codes.DeadlineExceeded}
	// HeaderTooLarge is a request line or header over the server's read
	// buffer.
	HeaderTooLarge = Status{431, "header_too_large", codes.InvalidArgument}
	TooLarge       = byKind[errdefs.KindTooLarge]
	Unavailable    = byKind[errdefs.KindUnavailable]
)

// MemoryFull is the refusal of a request whose body (or gRPC message)
// found no room among the request bytes the server holds in memory within
// its wait: a busy server's, to retry.
func MemoryFull() error {
	return &Error{Status: Unavailable, Msg: "the server holds its limit of request bytes in memory (plover serve --max-body-memory); retry shortly"}
}

// Error is a request a transport refuses itself (a field it cannot parse,
// a version that is not the current one, a body over a limit) or an
// output it cannot encode: its class and the message for the client.
type Error struct {
	Status Status
	Msg    string
}

func (e *Error) Error() string { return e.Msg }

// Classify is err's status, the engine kind the metrics count it under,
// and the message for the client; ok is false for an error of neither
// kind, whose text is for the log only. Call it on the error path only: its
// errors.As targets escape.
func Classify(err error) (st Status, k errdefs.Kind, msg string, ok bool) {
	var e *Error
	if errors.As(err, &e) {
		if e.Status.HTTP >= 500 { // the server's state or failure, not the request's
			// By its class where one kind has it (a 503 for no room in
			// the body budget is KindUnavailable, which the metrics count
			// under _unknown for a name they have not met, as the
			// engine's 503s: a transport's 503 counted as Internal gave
			// every probed name its own series); else Internal (an
			// output it cannot encode).
			for k, st := range byKind {
				if st == e.Status && errdefs.Kind(k) != errdefs.KindInternal {
					return e.Status, errdefs.Kind(k), e.Msg, true
				}
			}
			return e.Status, errdefs.KindInternal, e.Msg, true
		}
		return e.Status, errdefs.KindBadRequest, e.Msg, true
	}
	k = errdefs.KindOf(err)
	var ee *errdefs.Error
	if errors.As(err, &ee) {
		return Of(k), k, ee.Msg, true
	}
	return Of(k), k, "internal error", false
}

// byKind is indexed by errdefs.Kind.
var byKind = [...]Status{
	errdefs.KindInternal:   {500, "internal", codes.Internal},
	errdefs.KindBadRequest: BadRequest,
	errdefs.KindNotFound:   NotFound,
	errdefs.KindTooLarge:   {413, "too_large", codes.InvalidArgument},
	errdefs.KindInvalid:    {422, "invalid", codes.InvalidArgument},
	errdefs.KindKernel:     {500, "kernel_failed", codes.Internal},
	// Unavailable: the device or store is down; a client may retry.
	errdefs.KindUnavailable: {503, "unavailable", codes.Unavailable},
	errdefs.KindTimeout:     {504, "timeout", codes.DeadlineExceeded},
	errdefs.KindBusy:        {429, "busy", codes.ResourceExhausted},
	// The client left: nobody reads it; for logs and metrics (nginx's 499).
	errdefs.KindGone:          {499, "client_closed", codes.Canceled},
	errdefs.KindWorkerCrashed: {500, "worker_crashed", codes.Internal},
	errdefs.KindConflict:      {409, "conflict", codes.Aborted},
	errdefs.KindNoSpace:       {507, "insufficient_storage", codes.ResourceExhausted},
	errdefs.KindForbidden:     Forbidden,
	// Rejected: the function refused its input (plover_reject): a client
	// that sends the same bytes again gets the same answer.
	errdefs.KindRejected: {422, "invalid_input", codes.InvalidArgument},
}

// DidYouMean is ` (did you mean "saxpy"?)` for a name no function has when
// one of names that sees passes is within a typo of it (abi.Suggest), else
// "": the one wording of the suggestion, on every route and transport.
// A name longer than any function's is no typo of one.
func DidYouMean(name string, names []string, sees func(string) bool) string {
	if len(name) > abi.MaxNameLen {
		return ""
	}
	seen := names[:0:0]
	for _, n := range names {
		if n != name && sees(n) {
			seen = append(seen, n)
		}
	}
	if s := abi.Suggest(name, seen); s != "" {
		return fmt.Sprintf(" (did you mean %q?)", s)
	}
	return ""
}

// Of is kind k's status (Internal for a kind it does not know).
func Of(k errdefs.Kind) Status {
	if int(k) >= 0 && int(k) < len(byKind) && byKind[k].HTTP != 0 {
		return byKind[k]
	}
	return byKind[errdefs.KindInternal]
}

// HTTPOf is the HTTP status of a gRPC code's class, for reports that
// count outcomes by HTTP status whatever the transport (200 for OK; the
// first class in the table for codes several share).
func HTTPOf(c codes.Code) int {
	if c == codes.OK {
		return 200
	}
	for _, s := range byKind {
		if s.GRPC == c {
			return s.HTTP
		}
	}
	for _, s := range [...]Status{Unauthenticated, RateLimited} {
		if s.GRPC == c {
			return s.HTTP
		}
	}
	return 500
}
