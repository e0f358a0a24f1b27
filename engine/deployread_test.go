package engine_test

import (
	"context"
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/plover-run/plover/apierr"
	"github.com/plover-run/plover/engine"
	"github.com/plover-run/plover/errdefs"
	"github.com/plover-run/plover/internal/testkit"
)

// failingBody gives some bytes, then err.
type failingBody struct {
	sent bool
	err  error
}

func (b *failingBody) Read(p []byte) (int, error) {
	if !b.sent {
		b.sent = true
		return copy(p, "\x28\xb5\x2f\xfd"), nil
	}
	return 0, b.err
}

// A deploy whose upload fails keeps the transport's class and reason: a
// client gone is a 499, not a 400; the transport's own refusals (a 408)
// are read through the wrap; an error of no class is a 400 that says
// what it was. Before, each was 400 "deploy: reading the bundle".
func TestDeployReadFailureKeepsItsClass(t *testing.T) {
	e := testkit.Engine(t, engine.Config{})
	for _, tc := range []struct {
		name   string
		err    error
		status int
		says   string
	}{
		{"client gone", errdefs.New(errdefs.KindGone, nil, "the client went away while its request body was arriving"), 499, "deploy f: reading the bundle: the client went away"},
		{"transport's 408", &apierr.Error{Status: apierr.RequestTimeout, Msg: "the bundle's upload stalled"}, 408, "the bundle's upload stalled"},
		{"no class", io.ErrUnexpectedEOF, 400, "deploy f: reading the bundle: unexpected EOF"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := e.Control().DeployAs(context.Background(), "f", "", &failingBody{err: tc.err}, false)
			st, _, msg, _ := apierr.Classify(err)
			if st.HTTP != tc.status || !strings.Contains(msg, tc.says) || !errors.Is(err, tc.err) {
				t.Errorf("%d %q (%v); want %d saying %q", st.HTTP, msg, err, tc.status, tc.says)
			}
		})
	}
}
