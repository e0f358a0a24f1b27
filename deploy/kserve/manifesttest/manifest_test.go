package manifesttest

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

const manifestDir = ".."

// subsets loads testdata/*.schema.yaml, keyed by apiVersion + " " + kind.
func subsets(t *testing.T) map[string]*Subset {
	t.Helper()
	files, err := filepath.Glob("testdata/*.schema.yaml")
	if err != nil || len(files) != 2 {
		t.Fatalf("testdata/*.schema.yaml: %v %v, want the two subsets", files, err)
	}
	out := map[string]*Subset{}
	for _, f := range files {
		s, err := LoadSubset(f)
		if err != nil {
			t.Fatal(err)
		}
		out[s.APIVersion()+" "+s.Kind] = s
	}
	return out
}

func subsetFor(t *testing.T, subs map[string]*Subset, doc map[string]any) *Subset {
	t.Helper()
	av, _ := doc["apiVersion"].(string)
	k, _ := doc["kind"].(string)
	s := subs[av+" "+k]
	if s == nil {
		t.Fatalf("no schema subset for apiVersion %q kind %q", av, k)
	}
	return s
}

func docs(t *testing.T) []Doc {
	t.Helper()
	d, err := ManifestDocs(manifestDir)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// one returns the only document of the given kind.
func one(t *testing.T, kind string) map[string]any {
	t.Helper()
	var found []map[string]any
	for _, d := range docs(t) {
		if d.Doc["kind"] == kind {
			found = append(found, d.Doc)
		}
	}
	if len(found) != 1 {
		t.Fatalf("%d %s documents in deploy/kserve, want 1", len(found), kind)
	}
	return found[0]
}

// TestManifestsMatchTheCRDs: every document of every manifest in
// deploy/kserve is of a kind a subset covers and passes the validator.
func TestManifestsMatchTheCRDs(t *testing.T) {
	subs := subsets(t)
	kinds := map[string]int{}
	for _, d := range docs(t) {
		s := subsetFor(t, subs, d.Doc)
		kinds[s.Kind]++
		for _, e := range Validate(s, d.Doc) {
			t.Errorf("%s, document %d (%s): %s", d.File, d.Index+1, s.Kind, e)
		}
	}
	if kinds["ClusterServingRuntime"] != 1 || kinds["InferenceService"] != 1 {
		t.Errorf("documents by kind %v, want one ClusterServingRuntime and one InferenceService", kinds)
	}
}

// clone deep-copies a decoded document.
func clone(t *testing.T, doc map[string]any) map[string]any {
	t.Helper()
	b, err := json.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	var out map[string]any
	if err := strictJSON(b, &out); err != nil {
		t.Fatal(err)
	}
	return out
}

// at walks a path of map keys and list indexes to a node.
func at(t *testing.T, v any, path ...any) any {
	t.Helper()
	for _, p := range path {
		switch k := p.(type) {
		case string:
			m, ok := v.(map[string]any)
			if !ok {
				t.Fatalf("at %v: not an object before %q", path, k)
			}
			v = m[k]
		case int:
			a, ok := v.([]any)
			if !ok || k >= len(a) {
				t.Fatalf("at %v: no item %d", path, k)
			}
			v = a[k]
		}
	}
	return v
}

func obj(t *testing.T, v any, path ...any) map[string]any {
	t.Helper()
	m, ok := at(t, v, path...).(map[string]any)
	if !ok {
		t.Fatalf("at %v: not an object", path)
	}
	return m
}

func rename(m map[string]any, from, to string) {
	m[to] = m[from]
	delete(m, from)
}

// TestValidatorRejects: broken copies of the two manifests must fail, each
// with an error on the path that was broken (so a pass here is not an error
// elsewhere): misspelt fields, wrong types, missing required fields, bad
// quantities and ports, duplicates in a list-map, the wrong kind.
func TestValidatorRejects(t *testing.T) {
	subs := subsets(t)
	runtime := one(t, "ClusterServingRuntime")
	isvc := one(t, "InferenceService")
	n := func(s string) json.Number { return json.Number(s) }
	cases := []struct {
		name   string
		base   map[string]any
		mutate func(t *testing.T, d map[string]any)
		want   string // a substring of one of the errors
	}{
		// Misspelt fields.
		{"misspelt supportedModelFormats", runtime, func(t *testing.T, d map[string]any) {
			rename(obj(t, d, "spec"), "supportedModelFormats", "supportedModelFormat")
		}, `spec.supportedModelFormat: unknown field (did you mean "supportedModelFormats"?)`},
		{"misspelt readinessProbe", runtime, func(t *testing.T, d map[string]any) {
			rename(obj(t, d, "spec", "containers", 0), "readinessProbe", "readinesProbe")
		}, `spec.containers[0].readinesProbe: unknown field`},
		{"misspelt autoSelect (case)", runtime, func(t *testing.T, d map[string]any) {
			rename(obj(t, d, "spec", "supportedModelFormats", 0), "autoSelect", "autoselect")
		}, `spec.supportedModelFormats[0].autoselect: unknown field (did you mean "autoSelect"?)`},
		{"misspelt storageUri", isvc, func(t *testing.T, d map[string]any) {
			rename(obj(t, d, "spec", "predictor", "model"), "storageUri", "storageURI")
		}, `spec.predictor.model.storageURI: unknown field`},
		{"misspelt modelFormat", isvc, func(t *testing.T, d map[string]any) {
			rename(obj(t, d, "spec", "predictor", "model"), "modelFormat", "modelformat")
		}, `spec.predictor.model.modelformat: unknown field`},
		{"field in the wrong place", isvc, func(t *testing.T, d map[string]any) {
			obj(t, d, "spec")["storageUri"] = "s3://x/y"
		}, `spec.storageUri: unknown field`},
		{"unknown metadata field", runtime, func(t *testing.T, d map[string]any) {
			obj(t, d, "metadata")["nmae"] = "x"
		}, `metadata.nmae: unknown field`},
		// Wrong types.
		{"autoSelect as a string", runtime, func(t *testing.T, d map[string]any) {
			obj(t, d, "spec", "supportedModelFormats", 0)["autoSelect"] = "true"
		}, `spec.supportedModelFormats[0].autoSelect: want boolean, got a string ("true")`},
		{"protocolVersions as a string", runtime, func(t *testing.T, d map[string]any) {
			obj(t, d, "spec")["protocolVersions"] = "v2"
		}, `spec.protocolVersions: want array`},
		{"containerPort as a string", runtime, func(t *testing.T, d map[string]any) {
			obj(t, d, "spec", "containers", 0, "ports", 0)["containerPort"] = "8080"
		}, `spec.containers[0].ports[0].containerPort: want integer`},
		{"containerPort not an integer", runtime, func(t *testing.T, d map[string]any) {
			obj(t, d, "spec", "containers", 0, "ports", 0)["containerPort"] = n("8080.5")
		}, `spec.containers[0].ports[0].containerPort: want integer, got a number (8080.5)`},
		{"containerPort past int32", runtime, func(t *testing.T, d map[string]any) {
			obj(t, d, "spec", "containers", 0, "ports", 0)["containerPort"] = n("4294967296")
		}, `spec.containers[0].ports[0].containerPort: 4294967296 does not fit int32`},
		{"an arg as a number", runtime, func(t *testing.T, d map[string]any) {
			c := obj(t, d, "spec", "containers", 0)
			c["args"] = append(c["args"].([]any), n("1"))
		}, `.args[`},
		{"probe port as a boolean", runtime, func(t *testing.T, d map[string]any) {
			obj(t, d, "spec", "containers", 0, "readinessProbe", "httpGet")["port"] = true
		}, `spec.containers[0].readinessProbe.httpGet.port: want an integer or a string`},
		{"annotation value as a number", runtime, func(t *testing.T, d map[string]any) {
			obj(t, d, "spec", "annotations")["prometheus.kserve.io/port"] = n("9090")
		}, `spec.annotations.prometheus.kserve.io/port: want string`},
		{"GPU quantity not a quantity", runtime, func(t *testing.T, d map[string]any) {
			obj(t, d, "spec", "containers", 0, "resources", "limits")["nvidia.com/gpu"] = "one"
		}, `spec.containers[0].resources.limits.nvidia.com/gpu: "one" does not match`},
		{"predictor as a list", isvc, func(t *testing.T, d map[string]any) {
			obj(t, d, "spec")["predictor"] = []any{}
		}, `spec.predictor: want object, got an array`},
		{"null where not nullable", isvc, func(t *testing.T, d map[string]any) {
			obj(t, d, "spec", "predictor", "model")["runtime"] = nil
		}, `spec.predictor.model.runtime: null is not allowed here`},
		// Missing required fields.
		{"no containers", runtime, func(t *testing.T, d map[string]any) {
			delete(obj(t, d, "spec"), "containers")
		}, `spec.containers: required field missing`},
		{"container without a name", runtime, func(t *testing.T, d map[string]any) {
			delete(obj(t, d, "spec", "containers", 0), "name")
		}, `spec.containers[0].name: required field missing`},
		{"model format without a name", runtime, func(t *testing.T, d map[string]any) {
			delete(obj(t, d, "spec", "supportedModelFormats", 0), "name")
		}, `spec.supportedModelFormats[0].name: required field missing`},
		{"probe without a port", runtime, func(t *testing.T, d map[string]any) {
			delete(obj(t, d, "spec", "containers", 0, "readinessProbe", "httpGet"), "port")
		}, `spec.containers[0].readinessProbe.httpGet.port: required field missing`},
		{"no predictor", isvc, func(t *testing.T, d map[string]any) {
			delete(obj(t, d, "spec"), "predictor")
		}, `spec.predictor: required field missing`},
		{"modelFormat without a name", isvc, func(t *testing.T, d map[string]any) {
			delete(obj(t, d, "spec", "predictor", "model", "modelFormat"), "name")
		}, `spec.predictor.model.modelFormat.name: required field missing`},
		// Lists and identity.
		{"two ports on one number", runtime, func(t *testing.T, d map[string]any) {
			obj(t, d, "spec", "containers", 0, "ports", 1)["containerPort"] = n("8080")
		}, `spec.containers[0].ports[1]: duplicate of spec.containers[0].ports[0]`},
		{"wrong apiVersion", isvc, func(t *testing.T, d map[string]any) {
			d["apiVersion"] = "serving.kserve.io/v1alpha1"
		}, `apiVersion: "serving.kserve.io/v1alpha1", want "serving.kserve.io/v1beta1"`},
		// A field the CRD has but the subset leaves out fails too, saying so.
		{"a trimmed field", runtime, func(t *testing.T, d map[string]any) {
			obj(t, d, "spec")["replicas"] = n("2")
		}, `spec.replicas: the CRD has this field but the trimmed schema subset leaves it out`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			d := clone(t, c.base)
			c.mutate(t, d)
			errs := Validate(subsetFor(t, subs, c.base), d)
			for _, e := range errs {
				if strings.Contains(e, c.want) {
					return
				}
			}
			t.Errorf("want an error containing %q, got %q", c.want, errs)
		})
	}
}

// TestValidatorRejectsYAML: the same from YAML text, through the decoding
// kubectl does (YAML 1.1: an unquoted yes is a boolean, 0444 is octal).
func TestValidatorRejectsYAML(t *testing.T) {
	subs := subsets(t)
	good := `apiVersion: serving.kserve.io/v1beta1
kind: InferenceService
metadata:
  name: m
spec:
  predictor:
    model:
      modelFormat:
        name: plover
      protocolVersion: v2
      storageUri: s3://b/p
`
	d, err := Docs([]byte(good))
	if err != nil || len(d) != 1 {
		t.Fatal(d, err)
	}
	if errs := Validate(subsetFor(t, subs, d[0]), d[0]); len(errs) > 0 {
		t.Fatalf("the good InferenceService: %q", errs)
	}
	for _, c := range []struct{ name, from, to, want string }{
		{"misspelt", "      storageUri:", "      storageUrl:", "spec.predictor.model.storageUrl: unknown field"},
		{"yes is a boolean", "protocolVersion: v2", "protocolVersion: yes", "spec.predictor.model.protocolVersion: want string, got a boolean (true)"},
		{"a number", "protocolVersion: v2", "protocolVersion: 2", "spec.predictor.model.protocolVersion: want string, got an integer (2)"},
		{"missing", "        name: plover\n", "        {}\n", "spec.predictor.model.modelFormat.name: required field missing"},
		{"kind", "kind: InferenceService", "kind: InferenceServices", `kind: "InferenceServices", want "InferenceService"`},
	} {
		t.Run(c.name, func(t *testing.T) {
			text := strings.Replace(good, c.from, c.to, 1)
			if text == good {
				t.Fatalf("%q not in the manifest", c.from)
			}
			d, err := Docs([]byte(text))
			if err != nil {
				t.Fatal(err)
			}
			errs := Validate(subs["serving.kserve.io/v1beta1 InferenceService"], d[0])
			for _, e := range errs {
				if strings.Contains(e, c.want) {
					return
				}
			}
			t.Errorf("want an error containing %q, got %q", c.want, errs)
		})
	}
}

// TestSubsetsKeepTheirConstraints: the subsets hold what the tests above
// rely on, so a careless re-cut cannot quietly make the validator lenient.
func TestSubsetsKeepTheirConstraints(t *testing.T) {
	subs := subsets(t)
	csr := subs["serving.kserve.io/v1alpha1 ClusterServingRuntime"]
	isvc := subs["serving.kserve.io/v1beta1 InferenceService"]
	if csr == nil || isvc == nil {
		t.Fatalf("subsets %v: want ClusterServingRuntime v1alpha1 and InferenceService v1beta1", subs)
	}
	for _, s := range []*Subset{csr, isvc} {
		if len(s.Source.Commit) != 40 || s.Source.Repository != "github.com/kserve/kserve" || len(s.Source.SHA256) != 64 {
			t.Errorf("%s: source %+v: want the KServe commit and the CRD's sha256", s.Kind, s.Source)
		}
		if s.Schema.Properties["spec"] == nil || s.Schema.Properties["metadata"] == nil {
			t.Errorf("%s: no spec or metadata", s.Kind)
		}
	}
	spec := csr.Schema.Properties["spec"]
	if spec.Items != nil || len(spec.Required) == 0 || spec.Required[0] != "containers" {
		t.Errorf("ClusterServingRuntime spec: required %v, want containers", spec.Required)
	}
	if len(spec.Trimmed) < 5 {
		t.Errorf("ClusterServingRuntime spec: %d trimmed names: the unused properties should be listed", len(spec.Trimmed))
	}
	note, err := os.ReadFile("testdata/README.md")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(note), csr.Source.Commit) || !strings.Contains(string(note), isvc.Source.Commit) {
		t.Errorf("testdata/README.md does not name the commit %s the subsets come from", csr.Source.Commit)
	}
}

// TestValidatorKeywords: the keywords the manifests happen not to exercise
// still work (enums, lengths, bounds, sets, open maps).
func TestValidatorKeywords(t *testing.T) {
	one, two := json.Number("1"), json.Number("2")
	f := func(x float64) *float64 { return &x }
	i := func(x int64) *int64 { return &x }
	s := &Schema{Type: "object", Required: []string{"e"}, Properties: map[string]*Schema{
		"e":    {Type: "string", Enum: []any{"a", "b"}},
		"n":    {Type: "integer", Minimum: f(1), Maximum: f(2)},
		"s":    {Type: "string", MinLength: i(2), MaxLength: i(3)},
		"set":  {Type: "array", ListType: "set", Items: &Schema{Type: "integer"}, MaxItems: i(3)},
		"open": {Type: "object", PreserveUnknown: true},
		"null": {Type: "string", Nullable: true},
	}}
	sub := &Subset{Group: "g", Version: "v", Kind: "K", Schema: &Schema{Type: "object", Properties: map[string]*Schema{
		"apiVersion": {Type: "string"}, "kind": {Type: "string"}, "x": s}}}
	ok := map[string]any{"e": "a", "n": two, "s": "ab", "set": []any{one, two}, "open": map[string]any{"any": "thing"}, "null": nil}
	if errs := Validate(sub, map[string]any{"apiVersion": "g/v", "kind": "K", "x": ok}); len(errs) > 0 {
		t.Fatalf("a valid object: %q", errs)
	}
	for _, c := range []struct {
		field string
		value any
		want  string
	}{
		{"e", "c", `x.e: "c" is not one of ["a", "b"]`},
		{"n", json.Number("3"), "x.n: 3 is above the maximum 2"},
		{"n", json.Number("0"), "x.n: 0 is below the minimum 1"},
		{"s", "abcd", "x.s: longer than 3 characters"},
		{"s", "a", "x.s: shorter than 2 characters"},
		{"set", []any{one, one}, "x.set[1]: duplicate of x.set[0]"},
		{"set", []any{one, two, one, two}, "x.set: more than 3 items"},
		{"e", nil, "x.e: null is not allowed here"},
	} {
		bad := map[string]any{}
		for k, v := range ok {
			bad[k] = v
		}
		bad[c.field] = c.value
		errs := Validate(sub, map[string]any{"apiVersion": "g/v", "kind": "K", "x": bad})
		found := false
		for _, e := range errs {
			found = found || strings.Contains(e, c.want)
		}
		if !found {
			t.Errorf("%s = %v: want %q, got %q", c.field, c.value, c.want, errs)
		}
	}
	delete(ok, "e")
	if errs := Validate(sub, map[string]any{"apiVersion": "g/v", "kind": "K", "x": ok}); len(errs) != 1 || !strings.Contains(errs[0], "x.e: required field missing") {
		t.Errorf("without e: %q", errs)
	}
}

// TestSubsetLoadRefusesUnknownKeywords: a subset with a keyword the
// validator does not check fails to load instead of being half-applied.
func TestSubsetLoadRefusesUnknownKeywords(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "x.schema.yaml")
	text := "source: {repository: r, ref: v, commit: c, path: p, sha256: s}\ngroup: g\nversion: v\nkind: K\nschema:\n  type: object\n  oneOf: []\n"
	if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadSubset(p); err == nil || !strings.Contains(err.Error(), "oneOf") {
		t.Fatalf("LoadSubset with oneOf: %v, want an error naming it", err)
	}
}

// TestCutSubset: the cutter keeps the checked keywords on used paths, lists
// unused properties by name, swaps in ObjectMeta, and refuses a keyword the
// validator cannot check on a used path (but not on an unused one).
func TestCutSubset(t *testing.T) {
	crd := `apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
spec:
  group: example.com
  names: {kind: Thing}
  versions:
    - name: v1
      schema:
        openAPIV3Schema:
          type: object
          properties:
            apiVersion: {type: string}
            kind: {type: string}
            metadata: {type: object}
            spec:
              type: object
              description: dropped
              required: [size]
              properties:
                size: {type: integer, format: int32, default: 1, minimum: 0}
                mode: {type: string, enum: [a, b]}
                unused: {type: string, x-kubernetes-validations: [{rule: "self != ''"}]}
                LEAK
`
	docs := []map[string]any{{"apiVersion": "example.com/v1", "kind": "Thing", "spec": map[string]any{"size": json.Number("3"), "mode": "a"}}}
	write := func(text string) string {
		p := filepath.Join(t.TempDir(), "crd.yaml")
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	sub, err := CutSubset(write(strings.Replace(crd, "LEAK", "", 1)), "v1", Source{Commit: "c"}, docs)
	if err != nil {
		t.Fatal(err)
	}
	spec := sub.Schema.Properties["spec"]
	if sub.Kind != "Thing" || sub.APIVersion() != "example.com/v1" || spec == nil {
		t.Fatalf("subset %+v", sub)
	}
	if size := spec.Properties["size"]; size == nil || size.Format != "int32" || size.Minimum == nil || *size.Minimum != 0 {
		t.Errorf("spec.size: %+v, want int32 with minimum 0", size)
	}
	if mode := spec.Properties["mode"]; mode == nil || len(mode.Enum) != 2 {
		t.Errorf("spec.mode: %+v, want the enum", mode)
	}
	if !slices.Equal(spec.Trimmed, []string{"unused"}) || spec.Properties["unused"] != nil {
		t.Errorf("spec: trimmed %q, want [unused] and no schema for it", spec.Trimmed)
	}
	if !slices.Equal(spec.Required, []string{"size"}) {
		t.Errorf("spec.required %q", spec.Required)
	}
	if m := sub.Schema.Properties["metadata"]; m == nil || m.Properties["annotations"] == nil {
		t.Errorf("metadata %+v: want the ObjectMeta subset", m)
	}
	if errs := Validate(sub, docs[0]); len(errs) > 0 {
		t.Errorf("the doc it was cut for: %q", errs)
	}
	// A keyword the validator does not know, on a used path.
	bad := strings.Replace(crd, "LEAK", "", 1)
	bad = strings.Replace(bad, "mode: {type: string, enum: [a, b]}", "mode: {type: string, oneOf: [{enum: [a]}]}", 1)
	if _, err := CutSubset(write(bad), "v1", Source{Commit: "c"}, docs); err == nil || !strings.Contains(err.Error(), `spec.mode: keyword "oneOf"`) {
		t.Errorf("oneOf on a used path: %v, want an error naming it", err)
	}
	if _, err := CutSubset(write(strings.Replace(crd, "LEAK", "", 1)), "v2", Source{}, docs); err == nil {
		t.Errorf("a version the CRD lacks: no error")
	}
}
