package httpapi

import "testing"

// A boolean parameter sent as null is taken as absent, as before the
// parameters' types were checked: clients that write every field send it.
// Any other type is refused naming it.
func TestParamBool(t *testing.T) {
	for _, tc := range []struct {
		name string
		p    map[string]any
		want bool
		bad  bool
	}{
		{"absent", map[string]any{}, false, false},
		{"null", map[string]any{"binary_data_output": nil}, false, false},
		{"true", map[string]any{"binary_data_output": true}, true, false},
		{"a string", map[string]any{"binary_data_output": "true"}, false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := paramBool(tc.p, "binary_data_output", "parameters")
			if got != tc.want || (err != nil) != tc.bad {
				t.Errorf("paramBool = %v, %v; want %v, error %v", got, err, tc.want, tc.bad)
			}
		})
	}
}
