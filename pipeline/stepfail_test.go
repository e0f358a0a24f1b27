package pipeline_test

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/plover-run/plover/apierr"
	"github.com/plover-run/plover/call"
	"github.com/plover-run/plover/engine"
	"github.com/plover-run/plover/internal/testkit"
	"github.com/plover-run/plover/pipeline"
)

// A step pinned to a version that fails as its request is planned (the
// function removed with --force under its pipeline) is labelled as
// written, "cnn@<version>", which Hidden matched whole against a token's
// names: a token that may use cnn was told the step's function was one it
// may not, and not the step's 404 (a review). It is told the step's own
// failure; a token that may not use cnn (or the nested pipeline it runs
// in) is still told nothing of cnn.
func TestAPinnedStepsPlanningFailureIsToldToItsFunctionsUsers(t *testing.T) {
	e := testkit.Engine(t, engine.Config{})
	cnn := testkit.Deploy(t, e, testkit.BundleDir(t, testkit.Manifest("cnn"), nil))
	testkit.Deploy(t, e, testkit.BundleDir(t, testkit.Manifest("other"), nil))
	pinned := map[string]any{"function": "cnn", "version": cnn.Version}
	testkit.Deploy(t, e, pipelineDir(t, "p", "other", pinned))
	testkit.Deploy(t, e, pipelineDir(t, "inner", pinned))
	testkit.Deploy(t, e, pipelineDir(t, "outer", "other", "inner"))
	if err := e.Control().Delete(context.Background(), "cnn", true); err != nil {
		t.Fatal(err)
	}
	r := pipeline.New(e, nil)
	fail := map[string]error{}
	for _, name := range []string{"p", "outer"} {
		err := r.Invoke(context.Background(), name, &call.Request{Input: []byte("x")})
		if st, _, _, _ := apierr.Classify(err); st != apierr.NotFound || !strings.Contains(err.Error(), "cnn@"+cnn.Version) {
			t.Fatalf("%s: %v (%v), want step 1's 404 naming cnn@%s", name, err, st, cnn.Version)
		}
		fail[name] = err
	}
	for _, tc := range []struct {
		name   string
		fail   string
		sees   []string
		hidden bool
	}{
		{"a token that may use cnn", "p", []string{"p", "other", "cnn"}, false},
		{"a token that may not", "p", []string{"p", "other"}, true},
		{"nested, a token that may use inner and cnn", "outer", []string{"outer", "other", "inner", "cnn"}, false},
		{"nested, a token that may use inner alone", "outer", []string{"outer", "other", "inner"}, true},
		{"nested, a token that may use cnn alone", "outer", []string{"outer", "other", "cnn"}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sees := func(name string) bool { return slices.Contains(tc.sees, name) }
			err := fail[tc.fail]
			msg, hidden := pipeline.Hidden(err, sees)
			if hidden != tc.hidden {
				t.Fatalf("hidden = %v, want %v: told %q", hidden, tc.hidden, msg)
			}
			if !hidden {
				return // told err itself, the step's 404
			}
			for _, name := range []string{"cnn", cnn.Version, "inner"} {
				if strings.Contains(msg, name) {
					t.Errorf("told %q, naming %s, a step the token may not use", msg, name)
				}
			}
		})
	}
}
