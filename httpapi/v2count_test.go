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
