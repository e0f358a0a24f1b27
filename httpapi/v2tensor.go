package httpapi

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/oip"
)

// Tensors to and from the function's bytes: inputs laid out in declared
// order from JSON data or the binary extension, outputs cut from the
// function's output and encoded per datatype (FP16 included).

// nonFinite finds the first NaN or infinity among decodeElements' values
// (only FP16, FP32 and FP64 ones can be).
func nonFinite(data []any) (k int, v float64, ok bool) {
	for k, x := range data {
		switch f := x.(type) {
		case float32:
			v = float64(f)
		case float64:
			v = f
		default:
			return 0, 0, false // one datatype: no floats at all
		}
		if math.IsNaN(v) || math.IsInf(v, 0) {
			return k, v, true
		}
	}
	return 0, 0, false
}

// layInputs puts the request's tensors in declared order (the function's
// input buffer: inputs back to back, as the model declares them), checking
// names, datatypes and shapes. The binary extension's bytes hold the binary
// inputs in the order the REQUEST lists them (the protocol: "in the same
// order as the tensors appear in the inputs list"), so each one's offset in
// bin is worked out in request order first (kept in its binOff), and the
// bytes are then taken from there in declared order. When the binary bytes
// already are the declared layout (every input binary, each where the one
// declared before it ends: request order is declared order, but for empty
// inputs) the result is bin itself, and the engine reads the inputs where
// they arrived (as invoke's body). Otherwise they are laid out in buf.
func layInputs(got []inferTensor, decl []abi.Tensor, bin []byte, buf []byte) ([]byte, []byte, error) {
	byName, err := inputsByName(got)
	if err != nil {
		return nil, buf, err
	}
	off := binOffsets(got, bin)
	l := layout{bin: bin, buf: buf, inPlace: true}
	var used uint32 // by index, without byName
	for _, d := range decl {
		i := takeInput(got, byName, &used, d.Name)
		if i < 0 {
			return nil, l.buf, fmt.Errorf("input %q is missing (the model takes %s)", d.Name, oip.Names(decl))
		}
		if err := l.add(&got[i], d); err != nil {
			return nil, l.buf, err
		}
	}
	for n := range byName {
		return nil, l.buf, fmt.Errorf("input %q is not one of the model's inputs (%s)", n, oip.Names(decl))
	}
	for k := range got {
		if byName == nil && used&(1<<k) == 0 {
			return nil, l.buf, fmt.Errorf("input %q is not one of the model's inputs (%s)", got[k].name, oip.Names(decl))
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
			return nil, fmt.Errorf("input %q is given twice", got[i].name)
		}
	}
	return byName, nil
}

// binOffsets sets each input's offset in bin, in request order, and
// returns where the last ends. A size that cannot be right (no integer,
// negative) takes no room: its input fails its own check. The running
// offset stops past the end of bin, so that sums cannot overflow; an input
// placed there fails the bounds check.
func binOffsets(got []inferTensor, bin []byte) int64 {
	end := int64(len(bin)) + 1
	off := int64(0)
	for i := range got {
		t := &got[i]
		t.binOff = off
		if t.hasBinSize && !t.binSizeBad && t.binSize > 0 {
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
}

// add lays out input t, declared as d, after those before it.
func (l *layout) add(t *inferTensor, d abi.Tensor) error {
	size, err := oip.CheckInput(t.datatype, t.shape, d)
	if err != nil {
		return err
	}
	if t.hasBinSize {
		return l.addBinary(t, d, size)
	}
	l.leave()
	b, err := encodeElements(d.Datatype, t.data, size/abi.DatatypeSize[d.Datatype])
	if err != nil {
		return fmt.Errorf("input %q: %v", d.Name, err)
	}
	l.buf = append(l.buf, b...)
	return nil
}

// addBinary lays out binary input t of size bytes: in place while each
// starts where the one declared before it ends.
func (l *layout) addBinary(t *inferTensor, d abi.Tensor, size int64) error {
	if t.binSizeBad || t.binSize != size {
		var n any = t.binSize
		if t.binSizeText != "" {
			n = t.binSizeText
		}
		return fmt.Errorf("input %q: binary_data_size %v: want %d bytes (shape %v of %s), with that many left in the body", d.Name, n, size, t.shape, d.Datatype)
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

// encodeElements turns JSON data (flat or nested arrays) into n elements of
// datatype, little-endian.
func encodeElements(dt string, data json.RawMessage, n int64) ([]byte, error) {
	if len(data) == 0 {
		return nil, fmt.Errorf("no data (send \"data\" or the binary extension's binary_data_size)")
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, fmt.Errorf("data: %v", err)
	}
	var flat []any
	var walk func(any)
	walk = func(x any) {
		if a, ok := x.([]any); ok {
			for _, e := range a {
				walk(e)
			}
			return
		}
		flat = append(flat, x)
	}
	walk(v)
	if int64(len(flat)) != n {
		return nil, fmt.Errorf("data has %d elements, the shape holds %d", len(flat), n)
	}
	es := abi.DatatypeSize[dt]
	out := make([]byte, 0, int64(len(flat))*es)
	for i, x := range flat {
		b, err := encodeOne(dt, x)
		if err != nil {
			return nil, fmt.Errorf("data[%d]: %v", i, err)
		}
		out = append(out, b...)
	}
	return out, nil
}

func encodeOne(dt string, x any) ([]byte, error) {
	var b [8]byte
	if dt == "BOOL" {
		v, ok := x.(bool)
		if !ok {
			return nil, fmt.Errorf("%v is not a boolean", x)
		}
		if v {
			return []byte{1}, nil
		}
		return []byte{0}, nil
	}
	num, ok := x.(json.Number)
	if !ok {
		return nil, fmt.Errorf("%v is not a number", x)
	}
	switch dt {
	case "FP32", "FP64", "FP16":
		f, err := num.Float64()
		if err != nil {
			return nil, err
		}
		switch dt {
		case "FP32":
			binary.LittleEndian.PutUint32(b[:], math.Float32bits(float32(f)))
			return b[:4], nil
		case "FP64":
			binary.LittleEndian.PutUint64(b[:], math.Float64bits(f))
			return b[:8], nil
		}
		binary.LittleEndian.PutUint16(b[:], float16bits(float32(f)))
		return b[:2], nil
	}
	size := abi.DatatypeSize[dt]
	if strings.HasPrefix(dt, "UINT") {
		u, err := strconv.ParseUint(num.String(), 10, int(size*8))
		if err != nil {
			return nil, fmt.Errorf("%s is not a %s", num, dt)
		}
		binary.LittleEndian.PutUint64(b[:], u)
		return b[:size], nil
	}
	i, err := strconv.ParseInt(num.String(), 10, int(size*8))
	if err != nil {
		return nil, fmt.Errorf("%s is not an %s", num, dt)
	}
	binary.LittleEndian.PutUint64(b[:], uint64(i))
	return b[:size], nil
}

// decodeElements is the JSON data of a little-endian tensor (flat).
func decodeElements(dt string, b []byte) []any {
	es := int(abi.DatatypeSize[dt])
	out := make([]any, 0, len(b)/es)
	for i := 0; i+es <= len(b); i += es {
		e := b[i : i+es]
		var v any
		switch dt {
		case "BOOL":
			v = e[0] != 0
		case "UINT8":
			v = e[0]
		case "INT8":
			v = int8(e[0])
		case "UINT16":
			v = binary.LittleEndian.Uint16(e)
		case "INT16":
			v = int16(binary.LittleEndian.Uint16(e))
		case "UINT32":
			v = binary.LittleEndian.Uint32(e)
		case "INT32":
			v = int32(binary.LittleEndian.Uint32(e))
		case "UINT64":
			v = binary.LittleEndian.Uint64(e)
		case "INT64":
			v = int64(binary.LittleEndian.Uint64(e))
		case "FP32":
			v = math.Float32frombits(binary.LittleEndian.Uint32(e))
		case "FP64":
			v = math.Float64frombits(binary.LittleEndian.Uint64(e))
		case "FP16":
			v = float16to32(binary.LittleEndian.Uint16(e))
		}
		out = append(out, v)
	}
	return out
}

// float16bits rounds f to IEEE half precision (round to nearest even).
func float16bits(f float32) uint16 {
	b := math.Float32bits(f)
	sign := uint16(b>>16) & 0x8000
	exp := int((b>>23)&0xff) - 127 + 15
	man := b & 0x7fffff
	switch {
	case (b>>23)&0xff == 0xff: // inf, nan
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
		man |= 0x800000
		shift := uint(14 - exp)
		h := uint16(man >> shift)
		if (man>>(shift-1))&1 != 0 && ((man&((1<<(shift-1))-1)) != 0 || h&1 != 0) {
			h++
		}
		return sign | h
	}
	h := sign | uint16(exp)<<10 | uint16(man>>13)
	if man&0x1000 != 0 && (man&0xfff != 0 || h&1 != 0) {
		h++
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
