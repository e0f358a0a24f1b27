package cli

import (
	"fmt"
	"io"
	"strings"
	"unicode"
	"unicode/utf16"
	"unicode/utf8"
)

// What plover prints that others wrote (a function's output, a server's
// message quoting a bundle) reaches an operator's terminal. The characters
// a terminal would obey or hide rather than show are written escaped, by
// the one rule here: C0 and C1 controls (an escape sequence, a \r that
// overwrites the line before), Unicode format characters (the bidi
// embeddings, overrides and isolates U+202A-U+202E and U+2066-U+2069, the
// marks U+200E and U+200F, zero-width characters: they reorder or hide what
// is read) and the line and paragraph separators U+2028 and U+2029, which
// some terminals break on. Bytes that are not UTF-8 are escaped too (an
// 8-bit terminal takes 0x9b for an escape sequence's start). Tabs pass.

// hidden reports whether r is shown escaped.
func hidden(r rune) bool {
	return r != '\t' && (unicode.IsControl(r) || unicode.In(r, unicode.Cf, unicode.Zl, unicode.Zp))
}

// visible is one line made safe for a terminal: \x1b, \x85, \u202e, and
// \xff for a byte that is not UTF-8.
func visible(line string) string { return escape(line, false) }

// visibleLines is visible for text of several lines: its newlines pass.
func visibleLines(text string) string { return escape(text, true) }

func escape(s string, newlines bool) string {
	var b strings.Builder
	done := 0 // s[:done] is in b
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		if (r != utf8.RuneError || size > 1) && (!hidden(r) || newlines && r == '\n') {
			i += size
			continue
		}
		b.WriteString(s[done:i])
		switch {
		case size == 1: // an ASCII control, or a byte that is not UTF-8
			fmt.Fprintf(&b, `\x%02x`, s[i])
		case r < 0x100: // a C1 control
			fmt.Fprintf(&b, `\x%02x`, r)
		case r > 0xffff:
			fmt.Fprintf(&b, `\U%08x`, r)
		default:
			fmt.Fprintf(&b, `\u%04x`, r)
		}
		i += size
		done = i
	}
	if done == 0 {
		return s // nothing escaped
	}
	b.WriteString(s[done:])
	return b.String()
}

// printWarnings writes each warning on a line of its own. A warning quotes
// what others wrote (a bundle's path and entries, a kernel's message, a
// server's words): escaped as errors are.
func printWarnings(w io.Writer, warnings []string) {
	for _, s := range warnings {
		fmt.Fprintf(w, "warning: %s\n", visibleLines(s))
	}
}

// visibleJSON is a line of JSON with the characters hidden would escape
// written as JSON escapes (\u202e): the same JSON to a program, and safe on
// a terminal. A valid line has them only within strings (outside, JSON
// allows only ASCII spaces).
func visibleJSON(line []byte) []byte {
	if !strings.ContainsFunc(string(line), hidden) && utf8.Valid(line) {
		return line
	}
	out := make([]byte, 0, len(line)+16)
	for i := 0; i < len(line); {
		r, size := utf8.DecodeRune(line[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			out = append(out, `\ufffd`...) // as encoding/json writes a byte that is not UTF-8
		case hidden(r) && r > 0xffff: // JSON escapes UTF-16 units
			r1, r2 := utf16.EncodeRune(r)
			out = fmt.Appendf(out, `\u%04x\u%04x`, r1, r2)
		case hidden(r):
			out = fmt.Appendf(out, `\u%04x`, r)
		default:
			out = append(out, line[i:i+size]...)
		}
		i += size
	}
	return out
}

// escapingWriter writes what it is given as visibleLines does: for a
// writer that passes on others' whole lines (a worker's output in plover
// run), one Write a line or more.
type escapingWriter struct{ w io.Writer }

func (e escapingWriter) Write(p []byte) (int, error) {
	if _, err := io.WriteString(e.w, visibleLines(string(p))); err != nil {
		return 0, err
	}
	return len(p), nil
}
