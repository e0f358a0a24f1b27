// Package manifesttest checks the KServe manifests in deploy/kserve against
// subsets of KServe's own CRD schemas (testdata/*.schema.yaml, cut from the
// full CRDs by cmd/trimcrds), strictly: a field the CRD does not have, a
// value of the wrong type, a missing required field, a value outside an
// enum or a pattern are errors. It is a small OpenAPI v3 walker, not the
// API server: see Validate for what it checks and what it leaves out.
package manifesttest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"unicode/utf8"

	"sigs.k8s.io/yaml"
)

// Schema is the part of an OpenAPI v3 schema (as CRDs write it) that the
// validator understands. A subset file with any other keyword fails to
// load, so no constraint in it is silently ignored.
type Schema struct {
	Type                 string             `json:"type,omitempty"`
	Format               string             `json:"format,omitempty"`
	Properties           map[string]*Schema `json:"properties,omitempty"`
	AdditionalProperties *Additional        `json:"additionalProperties,omitempty"`
	Required             []string           `json:"required,omitempty"`
	Items                *Schema            `json:"items,omitempty"`
	Enum                 []any              `json:"enum,omitempty"`
	Pattern              string             `json:"pattern,omitempty"`
	AnyOf                []*Schema          `json:"anyOf,omitempty"`
	Nullable             bool               `json:"nullable,omitempty"`
	Minimum              *float64           `json:"minimum,omitempty"`
	Maximum              *float64           `json:"maximum,omitempty"`
	MinLength            *int64             `json:"minLength,omitempty"`
	MaxLength            *int64             `json:"maxLength,omitempty"`
	MinItems             *int64             `json:"minItems,omitempty"`
	MaxItems             *int64             `json:"maxItems,omitempty"`
	IntOrString          bool               `json:"x-kubernetes-int-or-string,omitempty"`
	PreserveUnknown      bool               `json:"x-kubernetes-preserve-unknown-fields,omitempty"`
	ListType             string             `json:"x-kubernetes-list-type,omitempty"`
	ListMapKeys          []string           `json:"x-kubernetes-list-map-keys,omitempty"`
	// Trimmed names the properties the CRD has here whose schemas the
	// subset leaves out (no manifest uses them). A manifest that sets one
	// fails: the subset must be cut again (testdata/README.md).
	Trimmed []string `json:"x-plover-trimmed,omitempty"`
}

// Additional is additionalProperties: a bool or a schema.
type Additional struct {
	Allowed bool
	Schema  *Schema
}

func (a *Additional) UnmarshalJSON(b []byte) error {
	if bytes.Equal(b, []byte("true")) || bytes.Equal(b, []byte("false")) {
		a.Allowed = string(b) == "true"
		return nil
	}
	a.Allowed = true
	a.Schema = new(Schema)
	return strictJSON(b, a.Schema)
}

func (a *Additional) MarshalJSON() ([]byte, error) {
	if a.Schema != nil {
		return json.Marshal(a.Schema)
	}
	return json.Marshal(a.Allowed)
}

// Source says where a subset was cut from.
type Source struct {
	Repository string `json:"repository"`
	Ref        string `json:"ref"`
	Commit     string `json:"commit"`
	Path       string `json:"path"`
	SHA256     string `json:"sha256"`
}

// Subset is one testdata/*.schema.yaml: the kind it checks and the trimmed
// openAPIV3Schema of that CRD version.
type Subset struct {
	Source  Source  `json:"source"`
	Group   string  `json:"group"`
	Version string  `json:"version"`
	Kind    string  `json:"kind"`
	Schema  *Schema `json:"schema"`
}

// APIVersion is group/version, as manifests write it.
func (s *Subset) APIVersion() string { return s.Group + "/" + s.Version }

func strictJSON(b []byte, v any) error {
	d := json.NewDecoder(bytes.NewReader(b))
	d.DisallowUnknownFields()
	d.UseNumber()
	if err := d.Decode(v); err != nil {
		return err
	}
	if d.More() {
		return fmt.Errorf("trailing data after the JSON value")
	}
	return nil
}

// LoadSubset reads a subset file, refusing keywords Schema does not know.
func LoadSubset(path string) (*Subset, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	j, err := yaml.YAMLToJSON(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %v", path, err)
	}
	var s Subset
	if err := strictJSON(j, &s); err != nil {
		return nil, fmt.Errorf("%s: %v", path, err)
	}
	if s.Schema == nil || s.Group == "" || s.Version == "" || s.Kind == "" || s.Source.Commit == "" {
		return nil, fmt.Errorf("%s: want source.commit, group, version, kind and schema", path)
	}
	return &s, nil
}

// Docs splits a YAML stream into its documents and decodes each as
// kubectl does (sigs.k8s.io/yaml: YAML 1.1 scalars, then JSON), numbers kept
// as json.Number so that 8080 and 8080.5 stay told apart. Empty documents
// (comments only) are dropped.
func Docs(b []byte) ([]map[string]any, error) {
	var out []map[string]any
	for i, part := range splitDocs(b) {
		j, err := yaml.YAMLToJSON(part)
		if err != nil {
			return nil, fmt.Errorf("document %d: %v", i+1, err)
		}
		if bytes.Equal(bytes.TrimSpace(j), []byte("null")) {
			continue
		}
		var v any
		if err := strictJSON(j, &v); err != nil {
			return nil, fmt.Errorf("document %d: %v", i+1, err)
		}
		m, ok := v.(map[string]any)
		if !ok {
			return nil, fmt.Errorf("document %d: not a mapping", i+1)
		}
		out = append(out, m)
	}
	return out, nil
}

func splitDocs(b []byte) [][]byte {
	var docs [][]byte
	var cur []byte
	for _, line := range bytes.SplitAfter(b, []byte("\n")) {
		t := bytes.TrimRight(line, " \t\r\n")
		if bytes.Equal(t, []byte("---")) || bytes.HasPrefix(t, []byte("--- ")) {
			docs = append(docs, cur)
			cur = nil
			continue
		}
		cur = append(cur, line...)
	}
	return append(docs, cur)
}

// Validate checks one decoded manifest against the subset for its kind:
// apiVersion and kind, then the object against the schema. It returns every
// problem found, each naming its path (spec.containers[0].ports[1].name).
//
// It checks: types (integer apart from number, int32/int64 ranges), objects
// closed where the CRD lists properties (an unknown field is an error, as
// kubectl's strict field validation makes it), additionalProperties maps,
// required fields, enums, patterns (Go's RE2, which the CRDs' patterns on
// these paths compile under), lengths and bounds, int-or-string, nulls only
// where nullable, and unique keys in x-kubernetes-list-type map and set
// lists. It does not run x-kubernetes-validations (CEL) rules, formats other
// than int32/int64, defaulting, or anything KServe's webhooks and
// controllers check beyond the schema.
func Validate(sub *Subset, doc map[string]any) []string {
	var errs []string
	if av, _ := doc["apiVersion"].(string); av != sub.APIVersion() {
		errs = append(errs, fmt.Sprintf("apiVersion: %q, want %q", doc["apiVersion"], sub.APIVersion()))
	}
	if k, _ := doc["kind"].(string); k != sub.Kind {
		errs = append(errs, fmt.Sprintf("kind: %q, want %q", doc["kind"], sub.Kind))
	}
	validate("", sub.Schema, doc, &errs)
	return errs
}

func join(path, name string) string {
	if path == "" {
		return name
	}
	return path + "." + name
}

func root(path string) string {
	if path == "" {
		return "(root)"
	}
	return path
}

func validate(path string, s *Schema, v any, errs *[]string) {
	bad := func(format string, a ...any) {
		*errs = append(*errs, root(path)+": "+fmt.Sprintf(format, a...))
	}
	if v == nil {
		if !s.Nullable {
			bad("null is not allowed here")
		}
		return
	}
	if s.IntOrString {
		if !isInteger(v) {
			if _, ok := v.(string); !ok {
				bad("want an integer or a string, got %s", kindOf(v))
				return
			}
		}
	}
	if len(s.AnyOf) > 0 {
		matched := false
		for _, alt := range s.AnyOf {
			var sub []string
			validate(path, alt, v, &sub)
			if len(sub) == 0 {
				matched = true
				break
			}
		}
		if !matched {
			bad("matches none of anyOf (%s)", anyOfTypes(s.AnyOf))
			return
		}
	}
	if s.Type != "" && !typeOK(s.Type, v) {
		bad("want %s, got %s", s.Type, kindOf(v))
		return
	}
	if len(s.Enum) > 0 && !slices.ContainsFunc(s.Enum, func(e any) bool { return equal(e, v) }) {
		bad("%s is not one of %s", show(v), showAll(s.Enum))
	}
	switch x := v.(type) {
	case string:
		checkString(s, x, bad)
	case json.Number:
		checkNumber(s, x, bad)
	case []any:
		checkArray(path, s, x, errs, bad)
	case map[string]any:
		checkObject(path, s, x, errs)
	}
}

// checkString checks a string's length and pattern.
func checkString(s *Schema, x string, bad func(string, ...any)) {
	n := int64(utf8.RuneCountInString(x))
	if s.MinLength != nil && n < *s.MinLength {
		bad("shorter than %d characters", *s.MinLength)
	}
	if s.MaxLength != nil && n > *s.MaxLength {
		bad("longer than %d characters", *s.MaxLength)
	}
	if s.Pattern != "" {
		re, err := regexp.Compile(s.Pattern)
		if err != nil {
			bad("the schema's pattern %q does not compile: %v", s.Pattern, err)
		} else if !re.MatchString(x) {
			bad("%q does not match %s", x, s.Pattern)
		}
	}
}

// checkNumber checks a number's bounds and format.
func checkNumber(s *Schema, x json.Number, bad func(string, ...any)) {
	f, _ := x.Float64()
	if s.Minimum != nil && f < *s.Minimum {
		bad("%s is below the minimum %v", x, *s.Minimum)
	}
	if s.Maximum != nil && f > *s.Maximum {
		bad("%s is above the maximum %v", x, *s.Maximum)
	}
	if s.Format == "int32" && (f < math.MinInt32 || f > math.MaxInt32) {
		bad("%s does not fit int32", x)
	}
	if s.Format == "int64" && isInteger(x) {
		if _, err := strconv.ParseInt(string(x), 10, 64); err != nil {
			bad("%s does not fit int64", x)
		}
	}
}

// checkArray checks a list's length, its items and their uniqueness.
func checkArray(path string, s *Schema, x []any, errs *[]string, bad func(string, ...any)) {
	n := int64(len(x))
	if s.MinItems != nil && n < *s.MinItems {
		bad("fewer than %d items", *s.MinItems)
	}
	if s.MaxItems != nil && n > *s.MaxItems {
		bad("more than %d items", *s.MaxItems)
	}
	if s.Items != nil {
		for i, e := range x {
			validate(fmt.Sprintf("%s[%d]", path, i), s.Items, e, errs)
		}
	}
	uniqueItems(path, s, x, errs)
}

// checkObject checks an object's required fields and each field against
// its property's schema: a field the schema does not name is an error
// unless the schema allows others.
func checkObject(path string, s *Schema, x map[string]any, errs *[]string) {
	for _, r := range s.Required {
		if _, ok := x[r]; !ok {
			*errs = append(*errs, join(path, r)+": required field missing")
		}
	}
	keys := make([]string, 0, len(x))
	for k := range x {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		p := join(path, k)
		switch {
		case s.Properties[k] != nil:
			validate(p, s.Properties[k], x[k], errs)
		case slices.Contains(s.Trimmed, k):
			*errs = append(*errs, p+": the CRD has this field but the trimmed schema subset leaves it out: cut the subset again (testdata/README.md)")
		case s.AdditionalProperties != nil && s.AdditionalProperties.Schema != nil:
			validate(p, s.AdditionalProperties.Schema, x[k], errs)
		case s.AdditionalProperties != nil && s.AdditionalProperties.Allowed, s.PreserveUnknown:
		default:
			*errs = append(*errs, p+": unknown field"+suggest(k, s))
		}
	}
}

// uniqueItems checks x-kubernetes-list-type map (unique key tuples) and set
// (unique values).
func uniqueItems(path string, s *Schema, x []any, errs *[]string) {
	seen := map[string]int{}
	for i, e := range x {
		var key string
		switch s.ListType {
		case "map":
			m, ok := e.(map[string]any)
			if !ok {
				continue
			}
			var parts []string
			for _, k := range s.ListMapKeys {
				parts = append(parts, k+"="+show(m[k]))
			}
			key = strings.Join(parts, ",")
		case "set":
			b, _ := json.Marshal(e)
			key = string(b)
		default:
			return
		}
		if j, dup := seen[key]; dup {
			*errs = append(*errs, fmt.Sprintf("%s[%d]: duplicate of %s[%d] (%s)", path, i, path, j, key))
		} else {
			seen[key] = i
		}
	}
}

// suggest names a known property close to a misspelt one.
func suggest(k string, s *Schema) string {
	var names []string
	for n := range s.Properties {
		names = append(names, n)
	}
	names = append(names, s.Trimmed...)
	sort.Strings(names)
	for _, n := range names {
		if strings.EqualFold(n, k) || distance(n, k) <= 2 {
			return fmt.Sprintf(" (did you mean %q?)", n)
		}
	}
	return ""
}

func distance(a, b string) int {
	prev := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur := make([]int, len(b)+1)
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			c := 1
			if a[i-1] == b[j-1] {
				c = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+c)
		}
		prev = cur
	}
	return prev[len(b)]
}

func isInteger(v any) bool {
	n, ok := v.(json.Number)
	if !ok {
		return false
	}
	if _, err := strconv.ParseInt(string(n), 10, 64); err == nil {
		return true
	}
	// A large integer written without a fraction or exponent.
	return !strings.ContainsAny(string(n), ".eE")
}

func typeOK(t string, v any) bool {
	switch t {
	case "object":
		_, ok := v.(map[string]any)
		return ok
	case "array":
		_, ok := v.([]any)
		return ok
	case "string":
		_, ok := v.(string)
		return ok
	case "integer":
		return isInteger(v)
	case "number":
		_, ok := v.(json.Number)
		return ok
	case "boolean":
		_, ok := v.(bool)
		return ok
	}
	return false
}

func kindOf(v any) string {
	switch x := v.(type) {
	case map[string]any:
		return "an object"
	case []any:
		return "an array"
	case string:
		return fmt.Sprintf("a string (%q)", x)
	case bool:
		return fmt.Sprintf("a boolean (%v)", x)
	case json.Number:
		if isInteger(x) {
			return "an integer (" + string(x) + ")"
		}
		return "a number (" + string(x) + ")"
	case nil:
		return "null"
	}
	return fmt.Sprintf("%T", v)
}

func anyOfTypes(alts []*Schema) string {
	var ts []string
	for _, a := range alts {
		ts = append(ts, a.Type)
	}
	return strings.Join(ts, " | ")
}

func equal(a, b any) bool {
	ja, _ := json.Marshal(a)
	jb, _ := json.Marshal(b)
	return bytes.Equal(ja, jb)
}

func show(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

func showAll(vs []any) string {
	var s []string
	for _, v := range vs {
		s = append(s, show(v))
	}
	return "[" + strings.Join(s, ", ") + "]"
}
