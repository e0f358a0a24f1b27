package httpapi

import "testing"

// A control route's JSON body is one value and whitespace: a rollback
// body of two objects went to the first one's version, one with brackets
// after it was taken whole.
func TestStrictJSON(t *testing.T) {
	for _, tc := range []struct {
		body string
		ok   bool
	}{
		{`{"version":"aaaaaaaa"}`, true},
		{"{\"version\":\"aaaaaaaa\"} \r\n\t", true},
		{`{"version":"aaaaaaaa"}{"version":"bbbbbbbb"}`, false},
		{`{"version":"aaaaaaaa"}]]`, false},
		{`{"version":"aaaaaaaa","other":1}`, false},
		{`{"version":`, false},
	} {
		var v struct {
			Version string `json:"version"`
		}
		if err := strictJSON([]byte(tc.body), &v); (err == nil) != tc.ok {
			t.Errorf("%q: error %v, want ok %v", tc.body, err, tc.ok)
		}
	}
}
