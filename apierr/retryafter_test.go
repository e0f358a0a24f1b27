package apierr

import (
	"testing"
	"time"
)

func TestRetryAfter(t *testing.T) {
	now := time.Date(2026, 12, 7, 6, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		v    string
		want time.Duration
	}{
		{"", 0},
		{"soon", 0},
		{"-3", 0},
		{"0", 0},
		{" 7 ", 7 * time.Second},
		{"2147483648", maxRetryAfter},
		{"2147483649", 0}, // past the bound: not a wait this reads
		{"Mon, 07 Dec 2026 06:00:01 GMT", time.Second},
		{"Mon, 07 Dec 2026 05:59:00 GMT", 0}, // over already
		// Past Duration's range from now: saturated, then wrapped negative.
		{"Fri, 31 Dec 9999 23:59:59 GMT", maxRetryAfter},
		{"Sun, 06 Nov 2350 08:49:37 GMT", maxRetryAfter},
	} {
		if got := RetryAfter(tc.v, now); got != tc.want {
			t.Errorf("RetryAfter(%q) = %v, want %v", tc.v, got, tc.want)
		}
	}
}
