package abi

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
)

func TestParsePipeline(t *testing.T) {
	good := `{"name": "digits", "kind": "pipeline",
	  "steps": ["normalize", {"function": "cnn", "version": "3f1c9a2e"}, {"parallel": ["a", {"function": "b"}]}, "top1"]}`
	m, err := ParseManifest(strings.NewReader(good))
	if err != nil {
		t.Fatal(err)
	}
	want := []Step{{Function: "normalize"}, {Function: "cnn", Version: "3f1c9a2e"}, {Parallel: []Step{{Function: "a"}, {Function: "b"}}}, {Function: "top1"}}
	b1, _ := json.Marshal(m.Steps)
	b2, _ := json.Marshal(want)
	if string(b1) != string(b2) {
		t.Fatalf("steps %s, want %s", b1, b2)
	}
	if got := strings.Join(Functions(m.Steps), ","); got != "normalize,cnn,a,b,top1" {
		t.Errorf("Functions = %s", got)
	}
	if got := m.Steps[2].String(); got != "parallel(a, b)" {
		t.Errorf("String = %q", got)
	}
	// A step that pins nothing writes back as the bare name, so a record
	// round-trips to the author's form.
	if string(b1) != `["normalize",{"function":"cnn","version":"3f1c9a2e"},{"parallel":["a","b"]},"top1"]` {
		t.Errorf("marshalled %s", b1)
	}

	// A model repository's version folder pins a step by its number.
	if m, err := ParseManifest(strings.NewReader(`{"name": "p", "kind": "pipeline", "steps": [{"function": "cnn", "version": "2"}]}`)); err != nil || m.Steps[0].Version != "2" {
		t.Errorf("a step pinned to version folder 2: %v", err)
	}

	for _, tc := range []struct{ name, manifest, field, reason string }{
		{"no steps", `{"name": "p", "kind": "pipeline", "steps": []}`, "steps", "at least one"},
		{"steps absent", `{"name": "p", "kind": "pipeline"}`, "steps", "at least one"},
		{"library", `{"name": "p", "kind": "pipeline", "steps": ["a"], "library": "x.so"}`, "library", "sets only"},
		{"pool policy", `{"name": "p", "kind": "pipeline", "steps": ["a"], "max_instances": 3}`, "max_instances", "sets only"},
		{"self", `{"name": "p", "kind": "pipeline", "steps": ["a", "p"]}`, "steps[1]", "cycle"},
		{"bad name", `{"name": "p", "kind": "pipeline", "steps": ["A"]}`, "steps[0]", "must match"},
		{"short version", `{"name": "p", "kind": "pipeline", "steps": [{"function": "a", "version": "3f1c"}]}`, "steps[0].version", "8 or more"},
		{"label with a leading zero", `{"name": "p", "kind": "pipeline", "steps": [{"function": "a", "version": "01"}]}`, "steps[0].version", "version folder"},
		{"nested parallel", `{"name": "p", "kind": "pipeline", "steps": [{"parallel": ["a", {"parallel": ["b", "c"]}]}]}`, "steps[0].parallel[1]", "do not nest"},
		{"lone parallel", `{"name": "p", "kind": "pipeline", "steps": [{"parallel": ["a"]}]}`, "steps[0].parallel", "2..16"},
		{"mixed", `{"name": "p", "kind": "pipeline", "steps": [{"function": "a", "parallel": ["b", "c"]}]}`, "steps[0]", "inside"},
		{"unknown kind", `{"name": "p", "kind": "graph", "steps": ["a"]}`, "kind", "must be"},
		{"steps on a function", `{"name": "f", "abi": 2, "target": "host", "library": "f.so", "max_input_bytes": 1, "out_bytes": 1, "chain": [{"kernel": "k", "grid": 1, "block": 1}], "steps": ["a"]}`, "steps", "only a pipeline"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseManifest(strings.NewReader(tc.manifest))
			var fe *FieldError
			if !errors.As(err, &fe) || fe.Field != tc.field || !strings.Contains(fe.Reason, tc.reason) {
				t.Fatalf("err = %v, want field %s saying %q", err, tc.field, tc.reason)
			}
		})
	}
	if _, err := ParseManifest(strings.NewReader(`{"name": "p", "kind": "pipeline", "steps": [{"func": "a"}]}`)); err == nil || !strings.Contains(err.Error(), "a step is a function name") {
		t.Errorf("unknown step field: %v", err)
	}
}
