package errdefs

import (
	"strings"
	"testing"
)

// A name in a message is quoted whole up to 64 bytes, its head beyond:
// a request's name may be as long as its body.
func TestQuoteName(t *testing.T) {
	long := strings.Repeat("a", 64)
	for _, tc := range []struct{ name, want string }{
		{"saxpy", `"saxpy"`},
		{"", `""`},
		{`a"b`, `"a\"b"`},
		{long, `"` + long + `"`},
		{long + "b", `"` + long + `"...`},
		{strings.Repeat("a", 1<<20), `"` + long + `"...`},
		// Cut before a character the 64th byte is inside, not in it
		// (strconv.Quote would show its first bytes as \x escapes).
		{long[:63] + "€€", `"` + long[:63] + `"...`},
		{long[:61] + "€€", `"` + long[:61] + `€"...`},
	} {
		if got := QuoteName(tc.name); got != tc.want {
			t.Errorf("QuoteName(%d bytes) = %.80q, want %.80q", len(tc.name), got, tc.want)
		}
	}
	e := &NoFunction{Name: strings.Repeat("x", 1<<20)}
	if n := len(e.Error()); n > 100 {
		t.Errorf("NoFunction's message for a 1 MiB name is %d bytes", n)
	}
}

// head cuts at most n bytes, never inside a character where the string
// is UTF-8.
func TestHeadAndClip(t *testing.T) {
	for _, tc := range []struct {
		s    string
		n    int
		want string
	}{
		{"abc", 5, "abc"},
		{"abc", 3, "abc"},
		{"abcd", 3, "abc"},
		{"ab€", 3, "ab"},   // € is 3 bytes: cut before it
		{"ab€", 4, "ab"},   // inside it
		{"ab€d", 5, "ab€"}, // after it
		{"😀😀", 5, "😀"},     // a 4-byte character
		{"😀😀", 7, "😀"},
		{"", 0, ""},
	} {
		if got := head(tc.s, tc.n); got != tc.want {
			t.Errorf("head(%q, %d) = %q, want %q", tc.s, tc.n, got, tc.want)
		}
	}
	if got, want := Clip("ab€d", 4), "ab... (6 bytes)"; got != want {
		t.Errorf("Clip = %q, want %q", got, want)
	}
	if got := Clip("abc", 3); got != "abc" {
		t.Errorf("Clip of a short string = %q", got)
	}
}
