package abi

import (
	"regexp"
	"testing"
)

// The hand-written classes accept exactly what the regular expressions
// they replace accepted.
func TestByteClassesMatchTheirRegexps(t *testing.T) {
	cases := []struct {
		c  byteClass
		re string
	}{
		{nameClass, `^[a-z0-9][a-z0-9-]{0,62}$`},
		{symbolClass, `^[A-Za-z_][A-Za-z0-9_]{0,127}$`},
		{fileClass, `^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$`},
		{tensorNameClass, `^[A-Za-z0-9_.:/-]{1,64}$`},
	}
	long := func(b byte, n int) string {
		s := make([]byte, n)
		for i := range s {
			s[i] = b
		}
		return string(s)
	}
	inputs := []string{"", "a", "A", "0", "_", "-", ".", "a-b", "a_b", "a.b", "a:b", "a/b", "-a", ".a", "a b", "é", "a\x00",
		"Z9", "z-", "lib.so", "input__0", long('a', 62), long('a', 63), long('a', 64), long('a', 65), long('a', 127),
		long('a', 128), long('a', 129)}
	for b := 0; b < 256; b++ {
		inputs = append(inputs, string([]byte{byte(b)}), "a"+string([]byte{byte(b)}))
	}
	for _, tc := range cases {
		re := regexp.MustCompile(tc.re)
		for _, in := range inputs {
			if got, want := tc.c.match(in), re.MatchString(in); got != want {
				t.Errorf("%s: %q: %v, the regexp says %v", tc.re, in, got, want)
			}
		}
	}
}
