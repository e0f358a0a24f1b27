package cli

import (
	"slices"
	"testing"
)

// --origin is repeatable and takes comma-separated origins (so that
// PLOVER_ORIGIN, one value, can name several), each kept as a browser's
// Origin writes it; one that is no origin is refused, naming why.
func TestOriginFlag(t *testing.T) {
	var o originsFlag
	for _, v := range []string{"http://gpu-box:8080", "HTTPS://Plover.Example.com:443, http://10.0.0.7:80"} {
		if err := o.Set(v); err != nil {
			t.Fatalf("--origin %s: %v", v, err)
		}
	}
	if want := []string{"http://gpu-box:8080", "https://plover.example.com", "http://10.0.0.7"}; !slices.Equal(o, want) {
		t.Errorf("--origin twice: %q, want %q", o, want)
	}
	for _, v := range []string{"gpu-box:8080", "http://gpu-box:8080/ui/", "http://a:1,", "null"} {
		if err := (&originsFlag{}).Set(v); err == nil {
			t.Errorf("--origin %q taken, want an error", v)
		}
	}
}
