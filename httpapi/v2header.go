package httpapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/plover-run/plover/apierr"
	"github.com/plover-run/plover/oip"
)

// An inference request's JSON header: a typed reader (hdrParser) for the
// shapes clients send, which allocates next to nothing, and encoding/json
// (decode) for everything else; a fuzz test holds the two to one answer.

// v2Tensor is a tensor in an inference request, as the general decoder
// (encoding/json) reads it.
type v2Tensor struct {
	Name       string          `json:"name"`
	Datatype   string          `json:"datatype"`
	Shape      []int64         `json:"shape"`
	Data       json.RawMessage `json:"data,omitempty"`
	Parameters map[string]any  `json:"parameters,omitempty"`
}

type v2Request struct {
	ID         string         `json:"id,omitempty"`
	Inputs     []v2Tensor     `json:"inputs"`
	Outputs    []v2Tensor     `json:"outputs,omitempty"`
	Parameters map[string]any `json:"parameters,omitempty"`
}

// inferHeader is an inference request's JSON header reduced to what the
// server acts on. Its strings and data may borrow the request body's bytes:
// it lives no longer than the request.
type inferHeader struct {
	id           string
	inputs       []inferTensor
	outputs      []inferTensor
	binaryOutput bool // parameters.binary_data_output
	// over: the header holds more than oip.MaxParts values besides its
	// tensors' data (parse stopped there, or decode's count found them);
	// parts: how many parse read.
	over  bool
	parts int
}

type inferTensor struct {
	name, datatype string
	shape          []int64
	data           []byte // the JSON value of "data", as sent; nil: none
	// parameters.binary_data_size of an input: hasBinSize, binSize (an
	// integer: read refuses any other value).
	hasBinSize bool
	binSize    int64
	binOff     int64 // layInputs: where an input's binary bytes start
	size       int64 // layInputs: its byte size, from its shape
	binary     bool  // parameters.binary_data of an output
}

// allBinary reports whether every output answered goes in the binary
// extension.
func (h *inferHeader) allBinary(ans []oip.Cut) bool {
	if h.binaryOutput {
		return true
	}
	for i := range ans {
		if !h.wantsBinary(ans[i].Decl.Name) {
			return false
		}
	}
	return true
}

// outputName is a requested output's name, for oip.Requested.
func outputName(t inferTensor) string { return t.name }

func (h *inferHeader) wantsBinary(name string) bool {
	for i := range h.outputs {
		if h.outputs[i].binary && h.outputs[i].name == name {
			return true
		}
	}
	return false
}

// read reads header, by parse or, for what parse leaves, decode: a 400
// naming the request body where neither takes it or it holds too many
// parts (errHeaderParts), or naming the field whose value is of the wrong
// kind.
func (h *inferHeader) read(header []byte) error {
	if h.parse(header) {
		return oip.CheckID(h.id)
	}
	var err error
	if !h.over {
		err = h.decode(header)
	}
	var field *apierr.Error
	switch {
	case h.over:
		return badField("request body", errHeaderParts.Error())
	case errors.As(err, &field):
		return err
	case err != nil:
		return badField("request body", bodyReason(err))
	}
	return oip.CheckID(h.id)
}

// decode reads header with encoding/json, for what parse leaves to it.
func (h *inferHeader) decode(header []byte) error {
	// Counted first: encoding/json decodes what it is given, and a value
	// of a few bytes takes a hundred in memory.
	n, ok := headerParts(header, oip.MaxParts, maxHeaderNesting)
	if h.over = ok && n > oip.MaxParts; h.over {
		return errHeaderParts
	}
	var req v2Request
	dec := json.NewDecoder(bytes.NewReader(header))
	dec.UseNumber()
	if err := dec.Decode(&req); err != nil {
		return err
	}
	// One JSON value and nothing after it but whitespace, as parse takes
	// it: a Decoder reads one value and would leave the rest unread. With
	// the binary extension the header is its Inference-Header-Content-Length
	// bytes, so bytes the client miscounted are told here, not taken for
	// nothing.
	if rest := header[dec.InputOffset():]; len(bytes.TrimLeft(rest, " \t\r\n")) > 0 {
		return badField("request body", fmt.Sprintf("%d bytes follow the JSON header (a binary extension request's Inference-Header-Content-Length is the header's length)", len(rest)))
	}
	bo, err := paramBool(req.Parameters, "binary_data_output", "parameters")
	if err != nil {
		return err
	}
	*h = inferHeader{id: req.ID, binaryOutput: bo, parts: n}
	for i, t := range req.Inputs {
		it := inferTensor{name: t.Name, datatype: t.Datatype, shape: t.Shape, data: t.Data}
		if v, ok := t.Parameters["binary_data_size"]; ok {
			it.hasBinSize = true
			if it.binSize, ok = paramInt(v); !ok {
				return badField(fmt.Sprintf("inputs[%d].parameters.binary_data_size", i), "it is "+jsonKind(v)+", want an integer (the input's bytes in the binary extension)")
			}
		}
		h.inputs = append(h.inputs, it)
	}
	for i, t := range req.Outputs {
		b, err := paramBool(t.Parameters, "binary_data", fmt.Sprintf("outputs[%d].parameters", i))
		if err != nil {
			return err
		}
		h.outputs = append(h.outputs, inferTensor{name: t.Name, binary: b})
	}
	return nil
}

// paramBool is p[key], false when absent; any value but true or false is
// a 400 naming it (at path), where it was taken for false: a client that
// sent "binary_data_output": "true" got JSON and no word why.
func paramBool(p map[string]any, key, path string) (bool, error) {
	v, ok := p[key]
	if !ok || v == nil { // null, as absent: clients that write every field send it
		return false, nil
	}
	b, ok := v.(bool)
	if !ok {
		return false, badField(path+"."+key, "it is "+jsonKind(v)+", want true or false")
	}
	return b, nil
}

// paramInt is v as an int64, when it is a JSON integer that fits one.
func paramInt(v any) (int64, bool) {
	n, ok := v.(json.Number)
	if !ok {
		return 0, false
	}
	i, err := n.Int64()
	return i, err == nil
}

// jsonKind says what a value decoded with UseNumber is, for messages: a
// number as it was sent ("16.0"), other values by kind.
func jsonKind(v any) string {
	switch x := v.(type) {
	case nil:
		return "null"
	case bool:
		return "a boolean"
	case json.Number:
		return "the number " + shown(x.String())
	case string:
		return "a string"
	case []any:
		return "an array"
	}
	return "an object"
}

// parse decodes the header without encoding/json, for the requests clients
// send: keys spelled as the protocol spells them, each once, strings in
// plain ASCII, integers where integers go. Anything else, valid or not, it
// declines (false) and decode reads it, so that what is accepted and what
// it means stay encoding/json's. Strings borrow header's bytes.
func (h *inferHeader) parse(header []byte) bool {
	p := hdrParser{b: header}
	h.id, h.binaryOutput = "", false
	h.inputs, h.outputs = h.inputs[:0], h.outputs[:0]
	ok := p.object(headerKeys, true, func(k int) bool {
		switch k {
		case 0:
			if !p.count() {
				return false
			}
			id, ok := p.str()
			h.id = b2s(id)
			return ok
		case 1:
			return p.tensors(&h.inputs, true)
		case 2:
			return p.tensors(&h.outputs, false)
		}
		return p.object(binaryOutputKey, false, func(int) bool {
			v, ok := p.bool()
			h.binaryOutput = v
			return ok && p.count()
		})
	}) && p.end()
	h.over, h.parts = p.over, p.n
	return ok
}

// hdrParser reads JSON from b at i, counting the values it reads but
// those it skips quietly (n; over once past oip.MaxParts, where it stops).
type hdrParser struct {
	b     []byte
	i     int
	n     int
	quiet bool
	over  bool
}

// count counts a value: false once past oip.MaxParts.
func (p *hdrParser) count() bool {
	if p.quiet {
		return true
	}
	if p.n++; p.n > oip.MaxParts {
		p.over = true
		return false
	}
	return true
}

// maxDepth bounds skip's recursion; deeper values are decode's.
const maxDepth = 64

func (p *hdrParser) ws() {
	for p.i < len(p.b) {
		switch p.b[p.i] {
		case ' ', '\t', '\n', '\r':
			p.i++
		default:
			return
		}
	}
}

// eat consumes c after any whitespace.
func (p *hdrParser) eat(c byte) bool {
	p.ws()
	if p.i < len(p.b) && p.b[p.i] == c {
		p.i++
		return true
	}
	return false
}

// end: nothing but whitespace is left. (decode, reading one value, would
// ignore what follows; parse leaves that case to it.)
func (p *hdrParser) end() bool {
	p.ws()
	return p.i == len(p.b)
}

// str reads a string of printable ASCII without escapes.
func (p *hdrParser) str() ([]byte, bool) {
	if !p.eat('"') {
		return nil, false
	}
	start := p.i
	for ; p.i < len(p.b); p.i++ {
		switch c := p.b[p.i]; {
		case c == '"':
			p.i++
			return p.b[start : p.i-1], true
		case c < 0x20 || c >= 0x80 || c == '\\':
			return nil, false
		}
	}
	return nil, false
}

// int reads an integer that fits an int64 with room to spare (18 digits).
func (p *hdrParser) int() (int64, bool) {
	p.ws()
	neg := p.i < len(p.b) && p.b[p.i] == '-'
	if neg {
		p.i++
	}
	start := p.i
	var n int64
	for ; p.i < len(p.b) && p.b[p.i] >= '0' && p.b[p.i] <= '9'; p.i++ {
		if p.i-start == 18 {
			return 0, false
		}
		n = n*10 + int64(p.b[p.i]-'0')
	}
	if digits := p.i - start; digits == 0 || (digits > 1 && p.b[start] == '0') {
		return 0, false
	}
	if p.i < len(p.b) && (p.b[p.i] == '.' || p.b[p.i] == 'e' || p.b[p.i] == 'E') {
		return 0, false
	}
	if neg {
		if n == 0 {
			return 0, false // -0 would not print as sent
		}
		n = -n
	}
	return n, true
}

func (p *hdrParser) bool() (v, ok bool) {
	p.ws()
	switch {
	case bytes.HasPrefix(p.b[p.i:], []byte("true")):
		p.i += 4
		return true, true
	case bytes.HasPrefix(p.b[p.i:], []byte("false")):
		p.i += 5
		return false, true
	}
	return false, false
}

// tensors reads an array of tensors into *dst, reusing its capacity.
func (p *hdrParser) tensors(dst *[]inferTensor, input bool) bool {
	if !p.eat('[') || !p.count() {
		return false
	}
	if p.eat(']') {
		return true
	}
	for {
		n := len(*dst)
		if n < cap(*dst) {
			*dst = (*dst)[:n+1]
		} else {
			*dst = append(*dst, inferTensor{})
		}
		t := &(*dst)[n]
		*t = inferTensor{shape: t.shape[:0]}
		if !p.tensor(t, input) {
			return false
		}
		if p.eat(',') {
			continue
		}
		return p.eat(']')
	}
}

// tensor reads one tensor object. Of its parameters only an input's
// binary_data_size and an output's binary_data mean anything here.
func (p *hdrParser) tensor(t *inferTensor, input bool) bool {
	return p.object(tensorKeys, true, func(k int) bool {
		switch k {
		case 0:
			b, ok := p.str()
			t.name = b2s(b)
			return ok && p.count()
		case 1:
			b, ok := p.str()
			t.datatype = b2s(b)
			return ok && p.count()
		case 2:
			return p.shape(t)
		case 3: // kept as sent, not counted: its numbers become the input
			p.ws()
			start := p.i
			p.quiet = true
			ok := p.skip(0)
			p.quiet = false
			t.data = p.b[start:p.i]
			return ok
		}
		if input {
			return p.object(binarySizeKey, false, func(int) bool {
				n, ok := p.int()
				t.hasBinSize, t.binSize = true, n
				return ok && p.count()
			})
		}
		return p.object(binaryDataKey, false, func(int) bool {
			v, ok := p.bool()
			t.binary = v
			return ok && p.count()
		})
	})
}

func (p *hdrParser) shape(t *inferTensor) bool {
	if !p.eat('[') || !p.count() {
		return false
	}
	if p.eat(']') {
		return true
	}
	for {
		d, ok := p.int()
		if !ok || !p.count() {
			return false
		}
		t.shape = append(t.shape, d)
		if p.eat(',') {
			continue
		}
		return p.eat(']')
	}
}

// object reads a JSON object, handing each key that is one of names to
// field (with its index), at most once per key; other keys are skipped. With
// fold, a key that matches a name only case-insensitively declines the
// object, since encoding/json would take it for that field (parameters are
// a map there, so for them fold is false).
func (p *hdrParser) object(names []string, fold bool, field func(k int) bool) bool {
	if !p.eat('{') || !p.count() {
		return false
	}
	if p.eat('}') {
		return true
	}
	var seen uint32
	for {
		key, ok := p.str()
		if !ok || !p.eat(':') {
			return false
		}
		k := -1
		for i, n := range names {
			if string(key) == n {
				k = i
				break
			}
		}
		switch {
		case k >= 0:
			if seen&(1<<k) != 0 || !field(k) {
				return false
			}
			seen |= 1 << k
		case fold && foldsTo(key, names...), !p.skip(0):
			return false
		}
		if p.eat(',') {
			continue
		}
		return p.eat('}')
	}
}

// foldsTo reports whether key matches one of names only case-insensitively,
// which encoding/json would take for that field: left to decode.
func foldsTo(key []byte, names ...string) bool {
	for _, n := range names {
		if bytes.EqualFold(key, []byte(n)) {
			return true
		}
	}
	return false
}

// skip consumes one valid JSON value of any kind, counting its values.
func (p *hdrParser) skip(depth int) bool {
	p.ws()
	if p.i >= len(p.b) || depth > maxDepth || !p.count() {
		return false
	}
	switch p.b[p.i] {
	case '"':
		return p.skipString()
	case '{':
		p.i++
		if p.eat('}') {
			return true
		}
		for {
			if !p.skipString() || !p.eat(':') || !p.skip(depth+1) {
				return false
			}
			if p.eat(',') {
				continue
			}
			return p.eat('}')
		}
	case '[':
		p.i++
		if p.eat(']') {
			return true
		}
		for {
			if !p.skip(depth + 1) {
				return false
			}
			if p.eat(',') {
				continue
			}
			return p.eat(']')
		}
	case 't':
		return p.literal("true")
	case 'f':
		return p.literal("false")
	case 'n':
		return p.literal("null")
	}
	return p.number()
}

func (p *hdrParser) literal(s string) bool {
	if !bytes.HasPrefix(p.b[p.i:], []byte(s)) {
		return false
	}
	p.i += len(s)
	return true
}

// skipString consumes a string, escapes and all (any byte from 0x20 up is
// allowed unescaped, as encoding/json allows it).
func (p *hdrParser) skipString() bool {
	if !p.eat('"') {
		return false
	}
	for p.i < len(p.b) {
		c := p.b[p.i]
		p.i++
		switch {
		case c == '"':
			return true
		case c < 0x20:
			return false
		case c == '\\':
			if p.i >= len(p.b) {
				return false
			}
			e := p.b[p.i]
			p.i++
			switch e {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
			case 'u':
				if p.i+4 > len(p.b) {
					return false
				}
				for _, x := range p.b[p.i : p.i+4] {
					if !('0' <= x && x <= '9' || 'a' <= x && x <= 'f' || 'A' <= x && x <= 'F') {
						return false
					}
				}
				p.i += 4
			default:
				return false
			}
		}
	}
	return false
}

// number consumes -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?.
func (p *hdrParser) number() bool {
	digits := func() int {
		start := p.i
		for p.i < len(p.b) && p.b[p.i] >= '0' && p.b[p.i] <= '9' {
			p.i++
		}
		return p.i - start
	}
	if p.i < len(p.b) && p.b[p.i] == '-' {
		p.i++
	}
	start := p.i
	if n := digits(); n == 0 || (n > 1 && p.b[start] == '0') {
		return false
	}
	if p.i < len(p.b) && p.b[p.i] == '.' {
		p.i++
		if digits() == 0 {
			return false
		}
	}
	if p.i < len(p.b) && (p.b[p.i] == 'e' || p.b[p.i] == 'E') {
		p.i++
		if p.i < len(p.b) && (p.b[p.i] == '+' || p.b[p.i] == '-') {
			p.i++
		}
		if digits() == 0 {
			return false
		}
	}
	return true
}

// The keys parse reads, in the order the field functions number them.
var (
	headerKeys      = []string{"id", "inputs", "outputs", "parameters"}
	tensorKeys      = []string{"name", "datatype", "shape", "data", "parameters"}
	binaryOutputKey = []string{"binary_data_output"}
	binarySizeKey   = []string{"binary_data_size"}
	binaryDataKey   = []string{"binary_data"}
)
