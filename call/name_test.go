package call

import "testing"

// A borrowed name reads the bytes it borrows, as they are now; a kept one
// is its own, whatever becomes of them.
func TestName(t *testing.T) {
	for _, tc := range []struct {
		name string
		buf  []byte
	}{
		{"a name", []byte("cnn")},
		{"empty", []byte{}},
		{"not UTF-8", []byte{0xff, 'x'}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := BorrowName(tc.buf)
			want := string(tc.buf)
			kept := n.Keep()
			if n.Borrow() != want || kept != want || NameOf(want).Keep() != want {
				t.Fatalf("borrow %q, keep %q; want %q", n.Borrow(), kept, want)
			}
			for i := range tc.buf { // the request's buffer, reused
				tc.buf[i] = '#'
			}
			if kept != want {
				t.Errorf("kept %q changed with the request's bytes (want %q)", kept, want)
			}
			if len(tc.buf) > 0 && n.Borrow() == want {
				t.Errorf("borrowed %q does not read the request's bytes", n.Borrow())
			}
		})
	}
}
