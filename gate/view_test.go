package gate

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/plover-run/plover/auth"
	"github.com/plover-run/plover/errdefs"
)

// A View sees every function without tokens, for an admin token and for
// functions "*"; a token of other globs sees what they match, its own
// token's series, a pipeline step's path only where it sees each name on
// it, and node-wide labels; a token the gate does not know sees nothing
// of a function's. Hide answers a name it does not see as the engine
// answers a name of no function.
func TestView(t *testing.T) {
	toks := table{
		"ops":   {Name: "ops", Scopes: auth.Admin},
		"star":  {Name: "star", Scopes: auth.Read, Functions: []string{"*"}},
		"aread": {Name: "aread", Scopes: auth.Read, Functions: []string{"a-*", "cnn"}},
	}
	type label struct{ name, value string }
	for _, tc := range []struct {
		name   string
		tokens Tokens
		token  string
		all    bool
		sees   []label // label: SeesLabel true
		hidden []label // label: SeesLabel false
	}{
		{"no tokens", nil, "", true, []label{{"function", "b-x"}, {"token", "bob"}}, nil},
		{"admin", toks, "ops", true, []label{{"function", "b-x"}, {"pipeline", "b-p"}, {"token", "bob"}}, nil},
		{"functions *", toks, "star", true, []label{{"function", "b-x"}, {"token", "bob"}}, nil},
		{"a-* and cnn", toks, "aread", false,
			[]label{{"function", "a-x"}, {"function", "cnn"}, {"function", "a-p/cnn"}, {"pipeline", "a-p"}, {"token", "aread"}, {"device", "b-x"}, {"step", "1"}},
			[]label{{"function", "b-x"}, {"function", "a-p/b-x"}, {"function", "b-p/a-x"}, {"function", "_other"}, {"function", "_unknown"}, {"pipeline", "b-p"}, {"token", "bob"}}},
		{"unknown token", toks, "nope", false, []label{{"device", "gpu0"}}, []label{{"function", "a-x"}, {"token", "nope"}, {"token", ""}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := New(tc.tokens, prometheus.NewRegistry()).View([]byte("Bearer " + tc.token))
			if v.All() != tc.all {
				t.Errorf("All %v, want %v", v.All(), tc.all)
			}
			for _, l := range tc.sees {
				if !v.SeesLabel(l.name, l.value) {
					t.Errorf("SeesLabel(%s, %s) false", l.name, l.value)
				}
				if err := v.Hide(l.value); l.name == "function" && !strings.Contains(l.value, "/") && err != nil {
					t.Errorf("Hide(%s): %v", l.value, err)
				}
			}
			for _, l := range tc.hidden {
				if v.SeesLabel(l.name, l.value) {
					t.Errorf("SeesLabel(%s, %s) true", l.name, l.value)
				}
			}
			err := v.Hide("b-x")
			if tc.all != (err == nil) {
				t.Fatalf("Hide(b-x): %v", err)
			}
			if err != nil && (errdefs.KindOf(err) != errdefs.KindNotFound || err.(*errdefs.Error).Msg != errdefs.UnknownFunction("b-x", nil, "").Msg) {
				t.Errorf("Hide(b-x): %v, want the unknown name's 404", err)
			}
			if err := v.Hide("B X"); err != nil { // no function's name: the engine's to answer
				t.Errorf("Hide of a name no function can have: %v", err)
			}
		})
	}
}
