package abi

import (
	"bytes"
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
)

// Manifest kinds: a function runs a library's chain; a pipeline runs other
// functions, one after another, with no library of its own.
const (
	KindFunction = "function"
	KindPipeline = "pipeline"
)

// Pipeline limits: what one request may fan out to.
const (
	MaxPipelineSteps = 32 // steps of one pipeline
	MaxParallel      = 16 // functions of one parallel step
)

// Step is one step of a pipeline: a function (its current version at each
// request, or the version Version pins), or Parallel: functions given the
// same input, whose outputs are concatenated in the listed order as the
// next step's input. In plover.json a step is a function's name, an object
// {"function": name, "version": id-or-prefix-or-label}, or {"parallel": [step, ...]}.
type Step struct {
	Function string `json:"function,omitempty"`
	Version  string `json:"version,omitempty"`
	Parallel []Step `json:"parallel,omitempty"`
}

// UnmarshalJSON reads the three forms of a step.
func (s *Step) UnmarshalJSON(b []byte) error {
	b = bytes.TrimSpace(b)
	if len(b) > 0 && b[0] == '"' {
		*s = Step{}
		return json.Unmarshal(b, &s.Function)
	}
	type plain Step // no UnmarshalJSON: no recursion
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	var p plain
	if err := dec.Decode(&p); err != nil {
		return fmt.Errorf("a step is a function name, {\"function\": name, \"version\": id} or {\"parallel\": [...]}: %w", err)
	}
	*s = Step(p)
	return nil
}

// MarshalJSON writes a step that pins nothing as its function's name.
func (s Step) MarshalJSON() ([]byte, error) {
	if s.Version == "" && s.Parallel == nil {
		return json.Marshal(s.Function)
	}
	type plain Step
	return json.Marshal(plain(s))
}

// String names the step as errors and Server-Timing do: "cnn",
// "cnn@3f1c9a2e", "parallel(cnn, cnn-large)".
func (s Step) String() string {
	if s.Parallel != nil {
		names := make([]string, len(s.Parallel))
		for i, p := range s.Parallel {
			names[i] = p.String()
		}
		return "parallel(" + strings.Join(names, ", ") + ")"
	}
	if s.Version != "" {
		return s.Function + "@" + s.Version
	}
	return s.Function
}

// Functions is every function name the steps name, in order, each once.
func Functions(steps []Step) []string {
	var out []string
	seen := map[string]bool{}
	var walk func([]Step)
	walk = func(ss []Step) {
		for _, s := range ss {
			if s.Parallel != nil {
				walk(s.Parallel)
			} else if !seen[s.Function] {
				seen[s.Function] = true
				out = append(out, s.Function)
			}
		}
	}
	walk(steps)
	return out
}

// IsPipeline reports whether the manifest is a pipeline's.
func (m *Manifest) IsPipeline() bool { return m.Kind == KindPipeline }

// pipelineFields are the manifest fields a pipeline may set.
var pipelineFields = map[string]bool{"name": true, "kind": true, "steps": true}

// validatePipeline checks a pipeline manifest's shape: its name, its steps
// and that it sets nothing else (whether the functions exist, and cycles,
// are the server's to check at deploy).
func (m *Manifest) validatePipeline(missing func(field string) bool) error {
	if missing("name") {
		return missingField("name", "the pipeline's name, [a-z0-9][a-z0-9-]{0,62}")
	}
	if !ValidName(m.Name) {
		return &FieldError{"name", fmt.Sprintf("%q must match [a-z0-9][a-z0-9-]{0,62}", m.Name)}
	}
	// Every other field belongs to a library: refuse it rather than ignore
	// it, so that a "max_instances" on a pipeline is not believed to work.
	rv := reflect.ValueOf(m).Elem()
	for i := 0; i < rv.NumField(); i++ {
		tag, _, _ := strings.Cut(rv.Type().Field(i).Tag.Get("json"), ",")
		if !pipelineFields[tag] && !rv.Field(i).IsZero() {
			return &FieldError{tag, "a pipeline sets only name, kind and steps: each step's function has its own " + tag}
		}
	}
	switch {
	case len(m.Steps) == 0:
		return &FieldError{"steps", "a pipeline must name at least one step"}
	case len(m.Steps) > MaxPipelineSteps:
		return &FieldError{"steps", fmt.Sprintf("has %d steps, at most %d allowed", len(m.Steps), MaxPipelineSteps)}
	}
	for i, s := range m.Steps {
		if err := s.validate(fmt.Sprintf("steps[%d]", i), m.Name, true); err != nil {
			return err
		}
	}
	return nil
}

func (s Step) validate(field, pipeline string, top bool) error {
	switch {
	case s.Parallel != nil && (s.Function != "" || s.Version != ""):
		return &FieldError{field, "a parallel step names its functions inside \"parallel\" only"}
	case s.Parallel != nil && !top:
		return &FieldError{field, "parallel steps do not nest: list the functions in one \"parallel\""}
	case s.Parallel != nil && (len(s.Parallel) < 2 || len(s.Parallel) > MaxParallel):
		return &FieldError{field + ".parallel", fmt.Sprintf("has %d functions, want 2..%d", len(s.Parallel), MaxParallel)}
	case s.Parallel != nil:
		for i, p := range s.Parallel {
			if err := p.validate(fmt.Sprintf("%s.parallel[%d]", field, i), pipeline, false); err != nil {
				return err
			}
		}
		return nil
	case !ValidName(s.Function):
		return &FieldError{field, fmt.Sprintf("function %q must match [a-z0-9][a-z0-9-]{0,62}", s.Function)}
	case s.Function == pipeline:
		return &FieldError{field, fmt.Sprintf("the pipeline %s names itself: a cycle", pipeline)}
	case s.Version != "" && !validVersionRef(s.Version):
		return &FieldError{field + ".version", fmt.Sprintf("%q must be a version id, a prefix of 8 or more of its characters (plover versions %s), or a model repository's version folder (a number)", s.Version, s.Function)}
	}
	return nil
}

// validVersionRef: a version id (a UUID) or a prefix of one, 8+
// characters; or a model repository's label, its version folder's number
// (plover serve --repository: 1 to 18 digits, no leading zero).
func validVersionRef(s string) bool {
	if len(s) >= 1 && len(s) <= 18 && (s == "0" || s[0] != '0') && strings.Trim(s, "0123456789") == "" {
		return true
	}
	if len(s) < 8 || len(s) > 36 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c == '-') {
			return false
		}
	}
	return true
}
