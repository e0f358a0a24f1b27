package grpcapi

import (
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
)

// A large message comes in many buffers (gRPC-Go reads a frame, 16 KiB,
// into each). Joining them into one for proto costs a copy of the whole
// message and a cleared buffer as large: the codec instead walks the
// buffers, copies the message's other fields into one small buffer for
// proto, each raw input in it left empty so that it is counted and decoded
// in its place, and keeps the raw inputs' bytes where they lie, to be
// copied once, straight into the slot the function runs in.

// rawInputs is a call's raw_input_contents: each entry whole, as proto
// decoded it (whole), or the pieces of the message's buffers it lies in
// (pieces, the codec's).
type rawInputs struct {
	whole  [][]byte
	pieces [][][]byte
}

func (r rawInputs) count() int {
	if r.pieces != nil {
		return len(r.pieces)
	}
	return len(r.whole)
}

// size is entry i's length.
func (r rawInputs) size(i int) int {
	if r.pieces == nil {
		return len(r.whole[i])
	}
	n := 0
	for _, p := range r.pieces[i] {
		n += len(p)
	}
	return n
}

// appendTo appends entry i to b.
func (r rawInputs) appendTo(b []byte, i int) []byte {
	if r.pieces == nil {
		return append(b, r.whole[i]...)
	}
	for _, p := range r.pieces[i] {
		b = append(b, p...)
	}
	return b
}

// one is entry i in one piece: where it lies when it does, else copied.
func (r rawInputs) one(i int) []byte {
	if r.pieces == nil {
		return r.whole[i]
	}
	if ps := r.pieces[i]; len(ps) == 1 {
		return ps[0]
	}
	return r.appendTo(make([]byte, 0, r.size(i)), i)
}

// splitPieces parts a ModelInferRequest's wire bytes, in data's buffers,
// into its other fields, copied into head with each raw_input_contents
// entry (field 7) empty, and the raw inputs' bytes, as pieces of data's
// buffers. False where the message is not one this walk reads (a group,
// a field number 0, a field running past the message's end: proto, given
// the whole message, then says what is wrong with it), or where its other
// fields pass maxPiecesHead.
func splitPieces(data mem.BufferSlice) (head []byte, raw [][][]byte, ok bool) {
	w := wireWalk{bufs: make([][]byte, 0, len(data))}
	for _, b := range data {
		if b.Len() > 0 {
			w.bufs = append(w.bufs, b.ReadOnlyData())
		}
	}
	head = make([]byte, 0, 512)
	for w.more() {
		var tag uint64
		if tag, head, ok = w.varint(head); !ok {
			return nil, nil, false
		}
		num, typ := protowire.DecodeTag(tag)
		if num < protowire.MinValidNumber {
			return nil, nil, false
		}
		switch typ {
		case protowire.VarintType:
			_, head, ok = w.varint(head)
		case protowire.Fixed32Type:
			head, ok = w.take(4, head)
		case protowire.Fixed64Type:
			head, ok = w.take(8, head)
		case protowire.BytesType:
			var n uint64
			if num != 7 {
				if n, head, ok = w.varint(head); ok {
					head, ok = w.take(n, head)
				}
				break
			}
			var p [][]byte
			if n, _, ok = w.varint(nil); ok {
				p, ok = w.pieces(n)
			}
			raw = append(raw, p)
			head = append(head, 0) // the entry, empty
		default:
			ok = false
		}
		if !ok || len(head) > maxPiecesHead { // varints and tags pass it by a few bytes at most
			return nil, nil, false
		}
	}
	return head, raw, true
}

// maxPiecesHead bounds the other fields splitPieces gathers: a message
// mostly of them (typed contents) is joined whole, once, rather than grown
// into a buffer of its own a copy at a time.
const maxPiecesHead = 64 << 10

// wireWalk reads a message across its buffers.
type wireWalk struct {
	bufs [][]byte // the buffers left, the first read from off
	off  int
}

func (w *wireWalk) more() bool {
	for len(w.bufs) > 0 && w.off == len(w.bufs[0]) {
		w.bufs, w.off = w.bufs[1:], 0
	}
	return len(w.bufs) > 0
}

// varint reads a varint, its bytes appended to dst.
func (w *wireWalk) varint(dst []byte) (uint64, []byte, bool) {
	var v uint64
	for i := 0; i < 10 && w.more(); i++ {
		c := w.bufs[0][w.off]
		w.off++
		dst = append(dst, c)
		v |= uint64(c&0x7f) << (7 * i)
		if c < 0x80 {
			// A tenth byte over 1 overflows 64 bits: proto refuses it.
			return v, dst, i < 9 || c <= 1
		}
	}
	return 0, dst, false
}

// take appends the next n bytes to dst, unless dst would pass
// maxPiecesHead.
func (w *wireWalk) take(n uint64, dst []byte) ([]byte, bool) {
	if n > maxPiecesHead || uint64(len(dst))+n > maxPiecesHead {
		return dst, false
	}
	for n > 0 && w.more() {
		k := min(n, uint64(len(w.bufs[0])-w.off))
		dst = append(dst, w.bufs[0][w.off:w.off+int(k)]...)
		w.off += int(k)
		n -= k
	}
	return dst, n == 0
}

// pieces is the next n bytes, as they lie in the buffers.
func (w *wireWalk) pieces(n uint64) ([][]byte, bool) {
	var p [][]byte
	for n > 0 && w.more() {
		k := min(n, uint64(len(w.bufs[0])-w.off))
		p = append(p, w.bufs[0][w.off:w.off+int(k):w.off+int(k)])
		w.off += int(k)
		n -= k
	}
	return p, n == 0
}
