package apierr

import (
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
