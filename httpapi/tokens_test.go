package httpapi_test

import (
	"strings"
	"testing"

	"github.com/plover-run/plover/auth"
)

// tokenSpec is one line of a test's auth file.
type tokenSpec struct {
	name   string
	scopes auth.Scope
	globs  []string
}

// newTokens makes a token for each spec and returns their table and the
// tokens by name.
func newTokens(t *testing.T, specs ...tokenSpec) (*auth.Table, map[string]string) {
	t.Helper()
	limited := make([]limitedSpec, len(specs))
	for i, s := range specs {
		limited[i] = limitedSpec{s, auth.Limits{}}
	}
	return newLimitedTokens(t, limited...)
}

// limitedSpec is a line of a test's auth file with its limits.
type limitedSpec struct {
	tokenSpec
	limits auth.Limits
}

// newLimitedTokens is newTokens for lines with limits.
func newLimitedTokens(t *testing.T, specs ...limitedSpec) (*auth.Table, map[string]string) {
	t.Helper()
	toks := map[string]string{}
	var lines []string
	for _, l := range specs {
		tok, err := auth.NewToken()
		if err != nil {
			t.Fatal(err)
		}
		toks[l.name] = tok
		lines = append(lines, auth.Line(l.name, l.scopes, auth.Hash(tok), l.globs, l.limits))
	}
	tab, err := auth.Parse(strings.NewReader(strings.Join(lines, "\n")+"\n"), "tokens")
	if err != nil {
		t.Fatal(err)
	}
	return tab, toks
}
