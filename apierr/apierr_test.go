package apierr

import (
	"errors"
	"fmt"
	"testing"

	"google.golang.org/grpc/codes"

	"github.com/plover-run/plover/engine"
)

// Every engine kind has its own row (a kind added without one would answer
// 500/Internal on both transports), and the rows the issue names map as it
// says.
func TestEveryKindMapped(t *testing.T) {
	for k := engine.KindInternal; k <= engine.KindForbidden; k++ {
		if int(k) >= len(byKind) || byKind[k].HTTP == 0 || byKind[k].Name == "" {
			t.Errorf("engine kind %d has no status", k)
		}
	}
	if int(engine.KindForbidden)+1 != len(byKind) {
		t.Errorf("byKind has %d rows for %d kinds: a kind after KindForbidden?", len(byKind), engine.KindForbidden+1)
	}
	for _, tc := range []struct {
		k    engine.Kind
		http int
		grpc codes.Code
	}{
		{engine.KindNotFound, 404, codes.NotFound},
		{engine.KindBadRequest, 400, codes.InvalidArgument},
		{engine.KindBusy, 429, codes.ResourceExhausted},
		{engine.KindTimeout, 504, codes.DeadlineExceeded},
		{engine.KindUnavailable, 503, codes.Unavailable},
		{engine.KindForbidden, 403, codes.PermissionDenied},
		{engine.KindKernel, 500, codes.Internal},
		{engine.KindWorkerCrashed, 500, codes.Internal},
		{engine.Kind(99), 500, codes.Internal},
	} {
		if s := Of(tc.k); s.HTTP != tc.http || s.GRPC != tc.grpc {
			t.Errorf("kind %d: %d %v, want %d %v", tc.k, s.HTTP, s.GRPC, tc.http, tc.grpc)
		}
	}
}

// Classify: the transport's own refusals keep their class (a 5xx one
// counted as the server's failure), the engine's errors their kind, and a
// foreign error's text stays out of the client's message.
func TestClassify(t *testing.T) {
	for _, tc := range []struct {
		name  string
		err   error
		http  int
		kind  engine.Kind
		msg   string
		known bool
	}{
		{"refusal", fmt.Errorf("wrapped: %w", &Error{Status: NotFound, Msg: "model m version v"}), 404, engine.KindBadRequest, "model m version v", true},
		{"bad output", &Error{Status: BadOutput, Msg: "NaN"}, 500, engine.KindInternal, "NaN", true},
		{"engine", &engine.Error{Kind: engine.KindBusy, Msg: "queue full"}, 429, engine.KindBusy, "queue full", true},
		{"foreign", errors.New("secret path /var/x"), 500, engine.KindInternal, "internal error", false},
	} {
		st, k, msg, known := Classify(tc.err)
		if st.HTTP != tc.http || k != tc.kind || msg != tc.msg || known != tc.known {
			t.Errorf("%s: %d %v %q %v, want %d %v %q %v", tc.name, st.HTTP, k, msg, known, tc.http, tc.kind, tc.msg, tc.known)
		}
	}
}
