package repository

import (
	"strings"
	"testing"
	"unicode/utf8"
)

// brief cuts at a rune's start, looking back at most a rune's length: a
// reason of bytes that are no UTF-8 (continuation bytes all through) was
// cut to nothing but its "[N more bytes cut]".
func TestBriefCut(t *testing.T) {
	for _, tc := range []struct {
		name, reason string
		keep         int // bytes of reason kept
	}{
		{"short", "x", 1},
		{"at the limit", strings.Repeat("a", maxReason), maxReason},
		{"ascii", strings.Repeat("a", 2*maxReason), maxReason},
		{"a rune across the limit", strings.Repeat("a", maxReason-1) + "é" + strings.Repeat("a", 10), maxReason - 1},
		{"no UTF-8", strings.Repeat("\x80", 2*maxReason), maxReason - (utf8.UTFMax - 1)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := brief(tc.reason)
			kept, _, cut := strings.Cut(got, " [")
			if kept != tc.reason[:tc.keep] || cut != (tc.keep < len(tc.reason)) {
				t.Errorf("brief kept %d bytes (cut %v), want %d", len(kept), cut, tc.keep)
			}
		})
	}
}
