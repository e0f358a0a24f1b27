package charttest

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestREADMEAffinityMapKeysByName: the README's $plover_function map, for
// ingress.hashBy, gives every call of a function one key, its /v1 invoke
// both /v2 infer routes and a repository load alike, so that one pod holds
// it warm (keyed by the path, they were warm on up to three pods); other functions get keys
// of their own. As nginx's map does, the first regex that matches wins,
// and Go reads these regexes as PCRE does.
func TestREADMEAffinityMapKeysByName(t *testing.T) {
	src, err := os.ReadFile(filepath.Join(chartDir, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, block, ok := strings.Cut(string(src), "map $uri $plover_function {\n")
	body, _, closed := strings.Cut(block, "\n}")
	if !ok || !closed {
		t.Fatal("README.md has no map $uri $plover_function { ... } block")
	}
	type entry struct {
		re    *regexp.Regexp
		value string
	}
	var entries []entry
	def := ""
	for _, line := range strings.Split(body, "\n") {
		f := strings.Fields(strings.TrimSuffix(strings.TrimSpace(line), ";"))
		switch {
		case len(f) != 2:
			t.Fatalf("map line %q: want a regex or default, then a value", line)
		case f[0] == "default":
			def = f[1]
		case strings.HasPrefix(f[0], "~") && !strings.HasPrefix(f[0], "~*"):
			entries = append(entries, entry{regexp.MustCompile(f[0][1:]), f[1]})
		default:
			t.Fatalf("map line %q: the test reads case-sensitive regexes (~) only", line)
		}
	}
	key := func(uri string) string {
		for _, e := range entries {
			if m := e.re.FindStringSubmatchIndex(uri); m != nil {
				return string(e.re.ExpandString(nil, e.value, uri, m))
			}
		}
		return strings.ReplaceAll(def, "$uri", uri)
	}
	for _, fn := range []string{"cnn", "mnist-2"} {
		for _, route := range []string{"/v1/functions/%s/invoke", "/v2/models/%s/infer", "/v2/models/%s/versions/3/infer", "/v2/repository/models/%s/load"} {
			if uri := fmt.Sprintf(route, fn); key(uri) != fn {
				t.Errorf("%s: key %q, want %q, the function's name", uri, key(uri), fn)
			}
		}
	}
	if k := key("/healthz"); k != "/healthz" {
		t.Errorf("/healthz: key %q, want the path", k)
	}
}
