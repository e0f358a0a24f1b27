package engine

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/plover-run/plover/errdefs"
)

// A failed request counts as a client error when its class answers 4xx
// (apierr), else as an error: plover ls shows them apart, as /metrics
// does by code.
func TestStatsFailedByClass(t *testing.T) {
	for _, tc := range []struct {
		err    error
		client bool
	}{
		{&errdefs.Error{Kind: errdefs.KindRejected}, true},   // 422 invalid_input
		{&errdefs.Error{Kind: errdefs.KindTooLarge}, true},   // 413
		{&errdefs.Error{Kind: errdefs.KindInvalid}, true},    // 422
		{&errdefs.Error{Kind: errdefs.KindBadRequest}, true}, // 400
		{&errdefs.Error{Kind: errdefs.KindBusy}, true},       // 429: a full queue
		{&errdefs.Error{Kind: errdefs.KindGone}, true},       // 499: the client left
		{&errdefs.Error{Kind: errdefs.KindKernel}, false},
		{&errdefs.Error{Kind: errdefs.KindWorkerCrashed}, false},
		{&errdefs.Error{Kind: errdefs.KindTimeout}, false},
		{&errdefs.Error{Kind: errdefs.KindUnavailable}, false},
		{fmt.Errorf("running: %w", context.DeadlineExceeded), false},
		{errors.New("foreign"), false},
	} {
		var s stats
		s.failed(tc.err)
		if got := s.clientErrors.Load() == 1 && s.errors.Load() == 0; got != tc.client || s.clientErrors.Load()+s.errors.Load() != 1 {
			t.Errorf("%v: %d client errors, %d errors; want a client error %v", tc.err, s.clientErrors.Load(), s.errors.Load(), tc.client)
		}
	}
}
