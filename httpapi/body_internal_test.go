package httpapi

import (
	"bytes"
	"errors"
	"testing"
	"testing/iotest"
)

// A chunked body read into a buffer the size of its limit (a worker's
// slot): one that fills it exactly stays in it, one a byte longer is over
// the limit, one shorter is read as it is.
func TestChunkedBodyAtTheLimit(t *testing.T) {
	const limit = 4096
	for _, tc := range []struct {
		name    string
		n       int
		tooLong bool
	}{{"exactly the limit", limit, false}, {"a byte over", limit + 1, true}, {"shorter", limit - 10, false}} {
		t.Run(tc.name, func(t *testing.T) {
			slot := make([]byte, 0, limit)
			body := bytes.Repeat([]byte{7}, tc.n)
			r := bodyReader{s: &Server{}, r: iotest.OneByteReader(bytes.NewReader(body))}
			got, err := r.readAll(slot, limit, -1)
			if tc.tooLong {
				if !errors.Is(err, errTooLarge) {
					t.Fatalf("%d bytes: %v, want errTooLarge", tc.n, err)
				}
				return
			}
			if err != nil || !bytes.Equal(got, body) {
				t.Fatalf("%d bytes: %d read, %v", tc.n, len(got), err)
			}
			if &got[:1][0] != &slot[:1][0] {
				t.Fatal("the body left the buffer it was read into")
			}
		})
	}
}
