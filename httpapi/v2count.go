package httpapi

import (
	"bytes"
	"fmt"

	"github.com/plover-run/plover/oip"
)

// errHeaderParts refuses an inference header whose parts would take far
// more memory than its bytes (oip.MaxParts).
var errHeaderParts = fmt.Errorf("the inference header holds more than %d values besides its tensors' data (tensors, their names, shapes and parameters), or nests them more than %d deep", oip.MaxParts, maxHeaderNesting)

// The roles a JSON value plays in headerParts' walk.
const (
	roleOther   = iota
	roleTop     // the header's object
	roleTensors // the value of its "inputs" or "outputs"
	roleTensor  // an element of that array
	roleData    // a tensor's "data", and all within it: not counted
)

// partFrame is a container headerParts is inside.
type partFrame struct {
	obj  bool
	role int
}

// headerParts counts the values of an inference header as parse counts
// them, every value but its tensors' data, for decode to refuse a header
// of too many before encoding/json allocates them: n stops just past
// limit. ok is false where the header is not one JSON value (decode then
// says why, from a syntax check before it allocates anything). Keys match
// as encoding/json matches them, case folded; an escaped key matches none,
// so the data under it is counted: more, never fewer. No recursion: a
// header may nest as deep as encoding/json allows, maxNesting, and no
// deeper: a frame a bracket, a tensor's data nested 16 MiB deep took 1.6
// GB to count (its values are not counted, so the limit never cut it; a
// review's probe), before encoding/json refused it. Values other than
// data nested deeper than deep count as past limit (maxHeaderNesting for
// /v2's header, which decodes parameters by recursion).
func headerParts(b []byte, limit, deep int) (n int, ok bool) {
	p := hdrParser{b: b}
	var stack []partFrame
	role := roleTop // the role of the value read next
	for {
		p.ws()
		if p.i >= len(p.b) {
			return n, false
		}
		if role != roleData {
			if n++; n > limit {
				return n, true
			}
		}
		c := p.b[p.i]
		switch c {
		case '{', '[':
			f := partFrame{obj: c == '{', role: role}
			p.i++
			if !p.eat(closer(f)) {
				if len(stack) >= maxNesting {
					return n, false // decode's syntax check says why
				}
				if f.role != roleData && len(stack) >= deep {
					return limit + 1, true
				}
				stack = append(stack, f)
				if role, ok = p.member(f); !ok {
					return n, false
				}
				continue
			}
		case '"':
			ok = p.skipString()
		case 't':
			ok = p.literal("true")
		case 'f':
			ok = p.literal("false")
		case 'n':
			ok = p.literal("null")
		default:
			ok = p.number()
		}
		if c != '{' && c != '[' && !ok {
			return n, false
		}
		// The value ended: the next member or element, or the ends of
		// the containers it closes.
		for {
			if len(stack) == 0 {
				return n, true // what follows is not decode's
			}
			f := stack[len(stack)-1]
			if p.eat(',') {
				if role, ok = p.member(f); !ok {
					return n, false
				}
				break
			}
			if !p.eat(closer(f)) {
				return n, false
			}
			stack = stack[:len(stack)-1]
		}
	}
}

// maxNesting is how deep encoding/json reads a document (its scanner's
// maxNestingDepth): a deeper one is refused, "exceeded max depth".
const maxNesting = 10000

// maxHeaderNesting bounds the nesting of what encoding/json decodes by
// recursion, all but tensors' data (kept raw, skipped by its scanner's
// loop): a parameters value nested 10,000 deep took about a MiB of the
// request goroutine's stack. Past what parse takes (its skip's maxDepth
// within a tensor's parameters), so that the two give one answer.
const maxHeaderNesting = 128

func closer(f partFrame) byte {
	if f.obj {
		return '}'
	}
	return ']'
}

// member reads up to the next value inside f (an object's key and colon)
// and says the role that value plays.
func (p *hdrParser) member(f partFrame) (int, bool) {
	if !f.obj {
		switch f.role {
		case roleData:
			return roleData, true
		case roleTensors:
			return roleTensor, true
		}
		return roleOther, true
	}
	p.ws()
	start := p.i
	if !p.skipString() {
		return 0, false
	}
	key := p.b[start+1 : p.i-1] // between the quotes
	if !p.eat(':') {
		return 0, false
	}
	switch {
	case f.role == roleData:
		return roleData, true
	case f.role == roleTop && (bytes.EqualFold(key, []byte("inputs")) || bytes.EqualFold(key, []byte("outputs"))):
		return roleTensors, true
	case f.role == roleTensor && bytes.EqualFold(key, []byte("data")):
		return roleData, true
	}
	return roleOther, true
}

// tooManyValues reports whether a JSON document holds more than
// oip.MaxParts values, its strings counting one each: bounded first from
// counts the CPU makes at memory speed (a value past a container's first
// follows a comma, so there are at most one more than its commas, braces
// and brackets), walked only where that bound is passed.
func tooManyValues(b []byte) bool {
	if bytes.Count(b, []byte{','})+bytes.Count(b, []byte{'{'})+bytes.Count(b, []byte{'['}) < oip.MaxParts {
		return false
	}
	n, ok := headerParts(b, oip.MaxParts, maxNesting) // /v1's fields are typed: no recursion to bound
	return ok && n > oip.MaxParts
}
