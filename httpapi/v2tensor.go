package httpapi

import (
	"encoding/binary"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/errdefs"
	"github.com/plover-run/plover/oip"
	"github.com/plover-run/plover/pipeline"
)

// Tensors to and from the function's bytes: inputs laid out in declared
// order from JSON data or the binary extension, outputs cut from the
// function's output and encoded per datatype (FP16 included).

// inputBound is a model's max_input_bytes as layInputs checks it (max 0:
// none known here; the engine checks the laid-out input after), with
// what its 413 names.
type inputBound struct {
	model string
	max   int64
	step  pipeline.StepRef // a pipeline's: the step whose bound it is
}

// layInputs puts the request's tensors in declared order (the function's
// input buffer: inputs back to back, as the model declares them), checking
// names, datatypes and shapes. Every input is found and checked, and their
// byte sizes summed against lim, before any is laid out or its JSON data
// decoded, as gRPC does: elements sent as JSON numbers widen when laid out,
// and a request for more than the function takes must cost no more than
// its header to refuse. The binary extension's bytes hold the binary
// inputs in the order the REQUEST lists them (the protocol: "in the same
// order as the tensors appear in the inputs list"), so each one's offset in
// bin is worked out in request order first (kept in its binOff), and the
// bytes are then taken from there in declared order. When the binary bytes
// already are the declared layout (every input binary, each where the one
// declared before it ends: request order is declared order, but for empty
// inputs) the result is bin itself, and the engine reads the inputs where
// they arrived (as invoke's body). Otherwise they are laid out in buf.
func layInputs(h *inferHeader, decl []abi.Tensor, bin []byte, buf []byte, lim inputBound) ([]byte, []byte, error) {
	got := h.inputs
	byName, err := inputsByName(got)
	if err != nil {
		return nil, buf, err
	}
	off := binOffsets(got, bin)
	// order[k] is decl[k]'s index in got: on the stack for the inputs
	// requests have, so that the binary path allocates nothing.
	var small [16]int
	order := small[:0]
	var used uint32 // by index, without byName
	var total int64
	for _, d := range decl {
		i := takeInput(got, byName, &used, d.Name)
		if i < 0 {
			return nil, buf, oip.MissingInput(decl, d.Name, len(got), func(i int) string { return got[i].name })
		}
		t := &got[i]
		if t.size, err = oip.CheckInput(t.datatype, t.shape, d); err != nil {
			return nil, buf, err
		}
		if t.hasBinSize && t.data != nil {
			return nil, buf, fmt.Errorf("input %q: inputs[%d] has both data and parameters.binary_data_size: send its elements one way", d.Name, i)
		}
		if total = oip.AddSize(total, t.size); lim.max > 0 && total > lim.max {
			return nil, buf, oip.InputOver(lim.model, d.Name, t.shape, d.Datatype, total, lim.max, lim.step)
		}
		order = append(order, i)
	}
	for n := range byName {
		return nil, buf, fmt.Errorf("input %s is not one of the model's inputs (%s)", errdefs.QuoteName(n), oip.Names(decl))
	}
	for k := range got {
		if byName == nil && used&(1<<k) == 0 {
			return nil, buf, fmt.Errorf("input %s is not one of the model's inputs (%s)", errdefs.QuoteName(got[k].name), oip.Names(decl))
		}
	}
	l := layout{bin: bin, buf: buf, inPlace: true, parts: h.parts}
	for k, d := range decl {
		if err := l.add(got, order[k], d); err != nil {
			return nil, l.buf, err
		}
	}
	if l.short != nil {
		return nil, l.buf, fmt.Errorf("input %q: binary_data_size %d: the body's binary data ends before it (%d bytes, the binary inputs in the order the request lists them)", l.short.name, l.short.binSize, len(bin))
	}
	if off != int64(len(bin)) {
		return nil, l.buf, fmt.Errorf("%d bytes of binary data after the last input", int64(len(bin))-off)
	}
	if l.inPlace {
		if l.laid == 0 {
			return []byte{}, l.buf, nil
		}
		return bin[:l.laid], l.buf, nil
	}
	return l.buf, l.buf, nil
}

// inputsByName refuses a request that names an input twice, and for one
// of many inputs returns them by name (nil: few, found by a linear search,
// as requests have; a map above, so that a header of many inputs costs no
// quadratic time).
func inputsByName(got []inferTensor) (map[string]int, error) {
	var byName map[string]int
	if len(got) > 16 {
		byName = make(map[string]int, len(got))
	}
	for i := range got {
		dup := false
		if byName != nil {
			_, dup = byName[got[i].name]
			byName[got[i].name] = i
		} else {
			for j := range i {
				dup = dup || got[j].name == got[i].name
			}
		}
		if dup {
			return nil, fmt.Errorf("input %s is given twice", errdefs.QuoteName(got[i].name))
		}
	}
	return byName, nil
}

// binOffsets sets each input's offset in bin, in request order, and
// returns where the last ends. A size that cannot be right (negative)
// takes no room: its input fails its own check. The running
// offset stops past the end of bin, so that sums cannot overflow; an input
// placed there fails the bounds check.
func binOffsets(got []inferTensor, bin []byte) int64 {
	end := int64(len(bin)) + 1
	off := int64(0)
	for i := range got {
		t := &got[i]
		t.binOff = off
		if t.hasBinSize && t.binSize > 0 {
			off = min(off+min(t.binSize, end), end)
		}
	}
	return off
}

// takeInput is the index in got of the input named name, taken from
// byName (or, without it, marked in used), or -1.
func takeInput(got []inferTensor, byName map[string]int, used *uint32, name string) int {
	if byName != nil {
		k, ok := byName[name]
		if !ok {
			return -1
		}
		delete(byName, name)
		return k
	}
	for k := range got {
		if *used&(1<<k) == 0 && got[k].name == name {
			*used |= 1 << k
			return k
		}
	}
	return -1
}

// layout is the inputs laid out so far in declared order: while inPlace,
// bin's first laid bytes; after, buf.
type layout struct {
	bin, buf []byte
	inPlace  bool
	laid     int64
	short    *inferTensor // the first binary input past the end of bin
	parts    int          // the header's values, and the empty arrays of data so far
}

// add lays out got[i], declared as d and checked by layInputs (its size
// set), after those before it.
func (l *layout) add(got []inferTensor, i int, d abi.Tensor) error {
	t := &got[i]
	if t.hasBinSize {
		return l.addBinary(t, d, t.size)
	}
	l.leave()
	var err error
	if l.buf, err = appendElements(l.buf, d.Datatype, t.data, t.size/abi.DatatypeSize[d.Datatype], &l.parts); err != nil {
		return fmt.Errorf("input %q: inputs[%d].%v", d.Name, i, err)
	}
	return nil
}

// addBinary lays out binary input t of size bytes: in place while each
// starts where the one declared before it ends.
func (l *layout) addBinary(t *inferTensor, d abi.Tensor, size int64) error {
	if t.binSize != size {
		return fmt.Errorf("input %q: binary_data_size %d: want %d bytes (shape %v of %s), with that many left in the body", d.Name, t.binSize, size, t.shape, d.Datatype)
	}
	if size > int64(len(l.bin))-t.binOff {
		// Reported once every input's own size is checked: an input
		// listed before it may be the one that is wrong.
		if l.short == nil {
			l.short = t
		}
		return nil
	}
	if l.inPlace && (t.binOff == l.laid || size == 0) {
		l.laid += size
		return nil
	}
	l.leave()
	l.buf = append(l.buf, l.bin[t.binOff:t.binOff+size]...)
	return nil
}

// leave ends the layout in place: what was laid in bin is copied to buf.
func (l *layout) leave() {
	if l.inPlace {
		l.buf = append(l.buf, l.bin[:l.laid]...)
		l.inPlace = false
	}
}

// appendElements appends JSON data (an array, flat or nested: the
// protocol's row-major order either way; or one bare value) to out as n
// elements of datatype dt, little-endian. It reads data as it goes and
// writes each element as it reads it, keeping nothing per element: data
// decoded whole, as values, took 30 bytes of memory for each 2 sent (a
// 31 MiB body of "0," for a shape of [1] raised the heap 2.3 GiB before
// its 400). Past n elements it stops at once. An array that holds no
// element takes a part (*parts, the header's values counted with it, at
// most oip.MaxParts): a shape of [0] with 24 MiB of "[]," is refused, not
// read through. Errors start with the field ("data", "data[k]"), for the
// caller to put inputs[i]. before.
func appendElements(out []byte, dt string, data []byte, n int64, parts *int) ([]byte, error) {
	if len(data) == 0 {
		return out, fmt.Errorf("data is missing (send \"data\" or the binary extension's binary_data_size)")
	}
	es := abi.DatatypeSize[dt]
	// Room for every element, but no more than data can hold (an element
	// and its comma take 2 bytes at least): a shape may claim more
	// elements than its data has.
	out = slices.Grow(out, int(min(n, int64(len(data))/2+1)*es))
	p := hdrParser{b: data}
	var open [maxDepth]int64 // the elements read when each open array began
	depth := 0
	var k int64 // elements read
	for {
		// A value: an array opens, or an element.
		p.ws()
		if p.i < len(p.b) && p.b[p.i] == '[' {
			if depth == maxDepth {
				return out, fmt.Errorf("data nests arrays deeper than %d", maxDepth)
			}
			p.i++
			if !p.eat(']') {
				open[depth] = k
				depth++
				continue
			}
			if *parts++; *parts > oip.MaxParts { // [], an array without elements
				return out, errEmptyArrays
			}
		} else {
			if k == n {
				return out, fmt.Errorf("data holds more than the %d elements its shape holds", n)
			}
			var err error
			if out, err = appendElement(out, dt, &p); err != nil {
				return out, fmt.Errorf("data[%d]: %v", k, err)
			}
			k++
		}
		// After a value: the arrays it closes, then a comma or the end.
		for {
			if depth == 0 {
				if !p.end() {
					return out, fmt.Errorf("data is not one JSON value")
				}
				if k != n {
					return out, fmt.Errorf("data holds %d elements, its shape holds %d", k, n)
				}
				return out, nil
			}
			if p.eat(',') {
				break
			}
			if !p.eat(']') {
				return out, fmt.Errorf("data is invalid JSON at byte %d", p.i)
			}
			depth--
			if k == open[depth] {
				if *parts++; *parts > oip.MaxParts {
					return out, errEmptyArrays
				}
			}
		}
	}
}

var errEmptyArrays = fmt.Errorf("data holds arrays without elements that, with the header's values, pass the %d parts a request may hold", oip.MaxParts)

// appendElement reads one element of datatype dt at p and appends its
// bytes to out.
func appendElement(out []byte, dt string, p *hdrParser) ([]byte, error) {
	start := p.i
	if p.i >= len(p.b) {
		return out, fmt.Errorf("missing")
	}
	switch c := p.b[p.i]; {
	case c == 't' && p.literal("true"), c == 'f' && p.literal("false"):
		if dt != "BOOL" {
			return out, fmt.Errorf("%s is not a number (%s)", p.b[start:p.i], dt)
		}
		if c == 't' {
			return append(out, 1), nil
		}
		return append(out, 0), nil
	case c == '-' || '0' <= c && c <= '9':
		if !p.number() {
			return out, fmt.Errorf("%s is not a JSON number", errdefs.QuoteName(string(p.b[start:min(p.i+1, len(p.b))])))
		}
	default:
		what := "null"
		switch c {
		case '"':
			what = "a string"
		case '{':
			what = "an object"
		case 'n':
		default:
			what = "not JSON"
		}
		want := "want a number"
		if dt == "BOOL" {
			want = "want true or false"
		}
		return out, fmt.Errorf("it is %s, %s", what, want)
	}
	num := b2s(p.b[start:p.i]) // for strconv only: not kept
	if dt == "BOOL" {
		return out, fmt.Errorf("%s is not a boolean", shown(num))
	}
	return appendNumber(out, dt, num)
}

// shown is a number a client sent, as an error quotes it: its head past 64
// bytes, and its length. A number is one value however long: one of 8 MiB
// was copied whole into every message wrapping it and sent back in the
// 400 (a review's probe).
func shown(num string) string { return errdefs.Clip(num, 64) }

// appendNumber appends JSON number num as an element of datatype dt
// (not BOOL). A float that no element of dt can hold (1e39 as FP32,
// 70000 as FP16) is refused, where it became an infinity that the
// function was given and the answer then could not carry in JSON.
func appendNumber(out []byte, dt, num string) ([]byte, error) {
	switch dt {
	case "FP32", "FP64", "FP16":
		f, err := strconv.ParseFloat(num, 64)
		if err != nil {
			return out, fmt.Errorf("%s is past the range of %s", shown(num), dt)
		}
		switch dt {
		case "FP32":
			f32 := float32(f)
			if math.IsInf(float64(f32), 0) {
				return out, fmt.Errorf("%s is past the range of FP32 (at most %g)", shown(num), math.MaxFloat32)
			}
			return binary.LittleEndian.AppendUint32(out, math.Float32bits(f32)), nil
		case "FP64":
			return binary.LittleEndian.AppendUint64(out, math.Float64bits(f)), nil
		}
		h := float16bits(f)
		if h&0x7fff == 0x7c00 {
			return out, fmt.Errorf("%s is past the range of FP16 (at most 65504)", shown(num))
		}
		return binary.LittleEndian.AppendUint16(out, h), nil
	}
	size := abi.DatatypeSize[dt]
	var u uint64
	if strings.HasPrefix(dt, "UINT") {
		v, err := strconv.ParseUint(num, 10, int(size*8))
		if err != nil {
			return out, fmt.Errorf("%s is not a %s", shown(num), dt)
		}
		u = v
	} else {
		v, err := strconv.ParseInt(num, 10, int(size*8))
		if err != nil {
			return out, fmt.Errorf("%s is not an %s", shown(num), dt)
		}
		u = uint64(v)
	}
	for b := range size {
		out = append(out, byte(u>>(8*b)))
	}
	return out, nil
}

// float16bits rounds f to IEEE half precision (round to nearest even),
// from its float64 bits: through a float32 first it was rounded twice,
// and a value just past a tie (1.000488282) or just under the overflow
// point (65519.999) went the wrong way (a review's probe).
func float16bits(f float64) uint16 {
	b := math.Float64bits(f)
	sign := uint16(b>>48) & 0x8000
	exp := int((b>>52)&0x7ff) - 1023 + 15
	man := b & (1<<52 - 1)
	switch {
	case (b>>52)&0x7ff == 0x7ff: // inf, nan
		if man != 0 {
			return sign | 0x7e00
		}
		return sign | 0x7c00
	case exp >= 0x1f:
		return sign | 0x7c00
	case exp <= 0:
		if exp < -10 {
			return sign
		}
		man |= 1 << 52
		shift := uint(43 - exp)
		h := uint16(man >> shift)
		if (man>>(shift-1))&1 != 0 && ((man&((1<<(shift-1))-1)) != 0 || h&1 != 0) {
			h++
		}
		return sign | h
	}
	h := sign | uint16(exp)<<10 | uint16(man>>42)
	if man&(1<<41) != 0 && (man&(1<<41-1) != 0 || h&1 != 0) {
		h++ // a carry into the exponent is right: up to the next power, or infinity
	}
	return h
}

func float16to32(h uint16) float32 {
	sign := uint32(h&0x8000) << 16
	exp := uint32(h>>10) & 0x1f
	man := uint32(h & 0x3ff)
	switch {
	case exp == 0x1f:
		return math.Float32frombits(sign | 0x7f800000 | man<<13)
	case exp == 0:
		if man == 0 {
			return math.Float32frombits(sign)
		}
		f := float32(man) / 1024 / 16384
		if sign != 0 {
			f = -f
		}
		return f
	}
	return math.Float32frombits(sign | (exp+112)<<23 | man<<13)
}
