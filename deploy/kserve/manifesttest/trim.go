package manifesttest

import (
	"encoding/json"
	"fmt"
	"os"
	"sort"

	"sigs.k8s.io/yaml"
)

// dropped are keywords a subset leaves out because they constrain nothing
// a manifest can get wrong: documentation, server-side defaults, how maps
// merge.
var dropped = map[string]bool{
	"description": true, "default": true, "x-kubernetes-map-type": true, "title": true, "example": true,
}

// copied are the keywords Schema holds, taken over as they are.
var copied = map[string]bool{
	"type": true, "format": true, "required": true, "enum": true, "pattern": true, "nullable": true,
	"minimum": true, "maximum": true, "minLength": true, "maxLength": true, "minItems": true, "maxItems": true,
	"x-kubernetes-int-or-string": true, "x-kubernetes-preserve-unknown-fields": true,
	"x-kubernetes-list-type": true, "x-kubernetes-list-map-keys": true,
}

// ObjectMeta is the schema metadata gets in a subset. A CRD says only
// `type: object` there (the API server checks ObjectMeta itself); this
// hand-written subset of ObjectMeta covers what manifests here may set.
func ObjectMeta() *Schema {
	str := func() *Schema { return &Schema{Type: "string"} }
	strMap := func() *Schema {
		return &Schema{Type: "object", AdditionalProperties: &Additional{Allowed: true, Schema: str()}}
	}
	return &Schema{Type: "object", Properties: map[string]*Schema{
		"name": str(), "generateName": str(), "namespace": str(),
		"labels": strMap(), "annotations": strMap(),
	}}
}

// CutSubset reads a full CRD and cuts the subset for one of its versions
// that the given manifests (decoded documents of that kind) need: every
// keyword the validator checks along the paths they use, the names of the
// properties they do not use (x-plover-trimmed), nothing else. A keyword
// the validator does not understand on a used path is an error, so the
// subset never drops a constraint it cannot check.
func CutSubset(crdPath, version string, src Source, docs []map[string]any) (*Subset, error) {
	b, err := os.ReadFile(crdPath)
	if err != nil {
		return nil, err
	}
	var crd struct {
		Spec struct {
			Group string `json:"group"`
			Names struct {
				Kind string `json:"kind"`
			} `json:"names"`
			Versions []struct {
				Name   string `json:"name"`
				Schema struct {
					OpenAPIV3Schema map[string]any `json:"openAPIV3Schema"`
				} `json:"schema"`
			} `json:"versions"`
		} `json:"spec"`
	}
	j, err := yaml.YAMLToJSON(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %v", crdPath, err)
	}
	if err := json.Unmarshal(j, &crd); err != nil {
		return nil, fmt.Errorf("%s: %v", crdPath, err)
	}
	var full map[string]any
	for _, v := range crd.Spec.Versions {
		if v.Name == version {
			// Again with numbers kept as written.
			raw, _ := json.Marshal(v.Schema.OpenAPIV3Schema)
			if err := strictJSON(raw, &full); err != nil {
				return nil, err
			}
		}
	}
	if full == nil {
		return nil, fmt.Errorf("%s: no version %s", crdPath, version)
	}
	values := make([]any, len(docs))
	for i, d := range docs {
		values[i] = d
	}
	s, err := cut("", full, values)
	if err != nil {
		return nil, fmt.Errorf("%s: %v", crdPath, err)
	}
	if props, _ := full["properties"].(map[string]any); props["metadata"] == nil || s.Properties == nil {
		return nil, fmt.Errorf("%s: the schema has no metadata", crdPath)
	}
	s.Properties["metadata"] = ObjectMeta()
	s.Trimmed = slicesDelete(s.Trimmed, "metadata")
	return &Subset{Source: src, Group: crd.Spec.Group, Version: version, Kind: crd.Spec.Names.Kind, Schema: s}, nil
}

func slicesDelete(names []string, name string) []string {
	var out []string
	for _, n := range names {
		if n != name {
			out = append(out, n)
		}
	}
	return out
}

// cutProperties cuts an object's properties to those the values use,
// naming the others (trimmed).
func cutProperties(path string, v any, values []any) (map[string]*Schema, []string, error) {
	m, ok := v.(map[string]any)
	if !ok {
		return nil, nil, fmt.Errorf("%s: properties is not a mapping", root(path))
	}
	props := map[string]*Schema{}
	var trimmed []string
	names := make([]string, 0, len(m))
	for n := range m {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		var used []any
		for _, val := range values {
			if obj, ok := val.(map[string]any); ok {
				if fv, ok := obj[n]; ok {
					used = append(used, fv)
				}
			}
		}
		if len(used) == 0 {
			trimmed = append(trimmed, n)
			continue
		}
		child, ok := m[n].(map[string]any)
		if !ok {
			return nil, nil, fmt.Errorf("%s: not a schema", join(path, n))
		}
		s, err := cut(join(path, n), child, used)
		if err != nil {
			return nil, nil, err
		}
		props[n] = s
	}
	return props, trimmed, nil
}

func cut(path string, node map[string]any, values []any) (*Schema, error) {
	out := map[string]any{}
	var props map[string]*Schema
	var trimmed []string
	var items, addl *Schema
	var anyOf []*Schema
	keys := make([]string, 0, len(node))
	for k := range node {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		v := node[k]
		switch {
		case dropped[k]:
		case copied[k]:
			out[k] = v
		case k == "properties":
			var err error
			if props, trimmed, err = cutProperties(path, v, values); err != nil {
				return nil, err
			}
		case k == "items":
			child, ok := v.(map[string]any)
			if !ok {
				return nil, fmt.Errorf("%s: items is not one schema", root(path))
			}
			var elems []any
			for _, val := range values {
				if a, ok := val.([]any); ok {
					elems = append(elems, a...)
				}
			}
			s, err := cut(path+"[]", child, elems)
			if err != nil {
				return nil, err
			}
			items = s
		case k == "additionalProperties":
			child, ok := v.(map[string]any)
			if !ok {
				out[k] = v // a bool
				continue
			}
			var vals []any
			for _, val := range values {
				if obj, ok := val.(map[string]any); ok {
					for _, fv := range obj {
						vals = append(vals, fv)
					}
				}
			}
			s, err := cut(path+"{}", child, vals)
			if err != nil {
				return nil, err
			}
			addl = s
		case k == "anyOf":
			alts, ok := v.([]any)
			if !ok {
				return nil, fmt.Errorf("%s: anyOf is not a list", root(path))
			}
			for _, a := range alts {
				am, ok := a.(map[string]any)
				if !ok {
					return nil, fmt.Errorf("%s: anyOf holds a non-schema", root(path))
				}
				s, err := cut(path, am, values)
				if err != nil {
					return nil, err
				}
				anyOf = append(anyOf, s)
			}
		default:
			return nil, fmt.Errorf("%s: keyword %q: the validator does not check it; teach it (schema.go) before cutting a subset that uses this path", root(path), k)
		}
	}
	raw, _ := json.Marshal(out)
	var s Schema
	if err := strictJSON(raw, &s); err != nil {
		return nil, fmt.Errorf("%s: %v", root(path), err)
	}
	s.Properties, s.Trimmed, s.Items, s.AnyOf = props, trimmed, items, anyOf
	if addl != nil {
		s.AdditionalProperties = &Additional{Allowed: true, Schema: addl}
	} else if b, ok := out["additionalProperties"].(bool); ok {
		s.AdditionalProperties = &Additional{Allowed: b}
	}
	return &s, nil
}

// Marshal writes a subset as YAML, keys sorted, under a header comment.
func Marshal(s *Subset, header string) ([]byte, error) {
	b, err := yaml.Marshal(s)
	if err != nil {
		return nil, err
	}
	return append([]byte(header), b...), nil
}
