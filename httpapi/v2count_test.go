package httpapi

import (
	"strings"
	"testing"

	"github.com/plover-run/plover/oip"
)

// A header at oip.MaxParts values is read, one more refused, whether parse
// reads it or leaves it to decode (a key spelled in capitals): the two
// count alike. Tensors' data is not counted, however long.
func TestHeaderPartsBound(t *testing.T) {
	header := func(key string, tensors int, data string) []byte {
		// The object, the array and each tensor: tensors+2 values.
		ts := strings.Repeat(`{"data":`+data+`},`, tensors)
		return []byte(`{"` + key + `":[` + strings.TrimSuffix(ts, ",") + `]}`)
	}
	for _, tc := range []struct {
		name     string
		key      string
		tensors  int
		data     string
		fast     bool // parse reads it
		refused  bool
		countsAs int
	}{
		{"at the bound", "inputs", oip.MaxParts - 2, "[]", true, false, oip.MaxParts},
		{"one past", "inputs", oip.MaxParts - 1, "[]", false, true, 0},
		{"at the bound, decode's", "Inputs", oip.MaxParts - 2, "[]", false, false, oip.MaxParts},
		{"one past, decode's", "Inputs", oip.MaxParts - 1, "[]", false, true, 0},
		{"data not counted", "inputs", 2, "[" + strings.Repeat("[1,{},2],", oip.MaxParts) + "3]", true, false, 4},
		{"data not counted, decode's", "INPUTS", 2, "[" + strings.Repeat("[1,{},2],", oip.MaxParts) + "3]", false, false, 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := header(tc.key, tc.tensors, tc.data)
			var h inferHeader
			fast := h.parse(b)
			var err error
			if !fast && !h.over {
				err = h.decode(b)
			}
			if fast != tc.fast || h.over != tc.refused {
				t.Fatalf("parse %v, over %v; want parse %v, refused %v", fast, h.over, tc.fast, tc.refused)
			}
			if want := error(nil); err != want && (!h.over || err != errHeaderParts) {
				t.Fatalf("decode: %v", err)
			}
			if !tc.refused && h.parts != tc.countsAs {
				t.Fatalf("%d parts counted, want %d", h.parts, tc.countsAs)
			}
		})
	}
}

// A header's values other than tensors' data (which encoding/json keeps
// raw, skipping it by a loop) nest at most maxHeaderNesting deep: decode
// reads parameters by recursion, and a value nested 10,000 deep took
// about a MiB of stack. Data may nest as deep as encoding/json reads.
func TestHeaderNestingBound(t *testing.T) {
	nested := func(depth int) string { return strings.Repeat(`{"a":`, depth) + "1" + strings.Repeat("}", depth) }
	deepData := strings.Repeat("[", 5000) + "1" + strings.Repeat("]", 5000)
	for _, tc := range []struct {
		name    string
		header  string
		refused bool
	}{
		{"parameters 100 deep", `{"inputs":[],"parameters":` + nested(100) + `}`, false},
		{"parameters past the bound", `{"inputs":[],"parameters":` + nested(maxHeaderNesting) + `}`, true},
		{"parameters 9,000 deep", `{"inputs":[],"parameters":` + nested(9000) + `}`, true},
		{"a tensor's parameters past the bound", `{"inputs":[{"name":"x","parameters":` + nested(maxHeaderNesting) + `}]}`, true},
		{"data 5,000 deep", `{"inputs":[{"name":"x","data":` + deepData + `}]}`, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var h inferHeader
			err := h.read([]byte(tc.header))
			refused := err != nil && strings.Contains(err.Error(), "deep")
			if refused != tc.refused {
				t.Fatalf("read: %v; want refused for its nesting %v", err, tc.refused)
			}
		})
	}
}

// /v1's JSON body, whose fields are typed (nothing decoded by recursion),
// takes no such bound: a body deep past it but within the values' bound
// is refused for what it is, not as holding too many values.
func TestV1BodyTakesNoHeaderNestingBound(t *testing.T) {
	deep := strings.Repeat("[", maxHeaderNesting+2) + strings.Repeat("]", maxHeaderNesting+2)
	body := `{"input":"` + strings.Repeat(",", oip.MaxParts+10) + `","chain":` + deep + `}`
	if tooManyValues([]byte(body)) {
		t.Fatalf("a /v1 body %d deep, its commas in a string: refused as too many values", maxHeaderNesting+2)
	}
}
