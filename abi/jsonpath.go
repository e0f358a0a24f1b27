package abi

import (
	"bytes"
	"encoding/json"
	"fmt"
	"reflect"
	"strconv"
	"strings"
)

// Paths into a manifest are printed one way everywhere: object keys joined
// by dots, array elements by index ("chain[0].grid", "build.sources[1]").
// encoding/json's errors leave the indices out ("chain.grid") and give
// offsets in bytes; these helpers find the path and the line and column.

// jsonFrame is one open object or array while walking a document.
type jsonFrame struct {
	array   bool
	index   int          // array: the current element, from 0
	key     string       // object: the current key, as the field is spelt
	raw     string       // object: the current key as the document spells it
	typ     reflect.Type // what the object or array decodes into; nil: unknown
	wantKey bool         // object: the next token is a key or '}'
}

// jsonPathOf renders the position of the current value of the innermost
// frame.
func jsonPathOf(frames []jsonFrame) string {
	var b strings.Builder
	for _, f := range frames {
		if f.array {
			fmt.Fprintf(&b, "[%d]", f.index)
			continue
		}
		if b.Len() > 0 {
			b.WriteByte('.')
		}
		b.WriteString(pathKey(f.key))
	}
	return b.String()
}

// pathKey is key as a path shows it: as it is when it is a plain name, else
// quoted ("", "a.b", "x[0]" would read as paths).
func pathKey(key string) string {
	if key != "" && strings.IndexFunc(key, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '_' || r == '-')
	}) < 0 {
		return key
	}
	return strconv.Quote(key)
}

// walkJSON calls visit for every object key (isKey) and every value (a
// scalar, or the '{' or '[' that opens one) of data, in order, with the
// open frames (the innermost one's key or index is the token's position)
// and the offset just past the token. root is the Go type the document
// decodes into. visit returns true to stop the walk. A syntax error ends it.
func walkJSON(data []byte, root reflect.Type, visit func(frames []jsonFrame, tok json.Token, isKey bool, end int64) bool) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var st []jsonFrame
	valueDone := func() {
		if n := len(st); n > 0 && !st[n-1].array {
			st[n-1].wantKey = true
		}
	}
	for {
		tok, err := dec.Token()
		if err != nil {
			return
		}
		var top *jsonFrame
		if n := len(st); n > 0 {
			top = &st[n-1]
		}
		if d, ok := tok.(json.Delim); ok && (d == '}' || d == ']') {
			st = st[:len(st)-1]
			valueDone()
			continue
		}
		if top != nil && !top.array && top.wantKey {
			key, _ := tok.(string)
			top.raw = key
			if name, _ := structField(top.typ, key); name != "" {
				key = name // as the field is spelt: "NAME" decodes into name
			}
			top.key, top.wantKey = key, false
			if visit(st, key, true, dec.InputOffset()) {
				return
			}
			continue
		}
		typ := root
		if top != nil {
			if top.array {
				top.index++
				typ = elemType(top.typ)
			} else {
				typ = fieldType(top.typ, top.key)
			}
		}
		if visit(st, tok, false, dec.InputOffset()) {
			return
		}
		if d, ok := tok.(json.Delim); ok {
			st = append(st, jsonFrame{array: d == '[', index: -1, typ: deref(typ), wantKey: d == '{'})
			continue
		}
		valueDone()
	}
}

func deref(t reflect.Type) reflect.Type {
	for t != nil && t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	return t
}

func elemType(t reflect.Type) reflect.Type {
	if t = deref(t); t != nil && (t.Kind() == reflect.Slice || t.Kind() == reflect.Array) {
		return t.Elem()
	}
	return nil
}

// jsonFields lists the JSON names of struct type t's fields, in order.
func jsonFields(t reflect.Type) []string {
	var names []string
	for i := range t.NumField() {
		if name, ok := jsonName(t.Field(i)); ok {
			names = append(names, name)
		}
	}
	return names
}

// jsonName is field f's name in JSON, as encoding/json reads the tag;
// false for a field JSON leaves out.
func jsonName(f reflect.StructField) (string, bool) {
	name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
	if !f.IsExported() || name == "-" {
		return "", false
	}
	if name == "" {
		name = f.Name
	}
	return name, true
}

// fieldType is the type of struct t's field named key in JSON, matched as
// encoding/json matches it (exactly, else ignoring case); nil when t is no
// struct or has no such field.
func fieldType(t reflect.Type, key string) reflect.Type {
	_, ft := structField(t, key)
	return ft
}

// structField is the JSON name and the type of struct t's field that key
// decodes into (exactly, else ignoring case, as encoding/json matches);
// "" and nil when t is no struct or has no such field.
func structField(t reflect.Type, key string) (string, reflect.Type) {
	t = deref(t)
	if t == nil || t.Kind() != reflect.Struct {
		return "", nil
	}
	foldName, fold := "", reflect.Type(nil)
	for i := range t.NumField() {
		f := t.Field(i)
		name, ok := jsonName(f)
		if !ok {
			continue
		}
		if name == key {
			return name, f.Type
		}
		if fold == nil && strings.EqualFold(name, key) {
			foldName, fold = name, f.Type
		}
	}
	return foldName, fold
}

// jsonPathAt is the path of the value of data that a decoding error's
// offset points past (a scalar's end, or just past the '{' or '[' of a
// compound value), or "" when it cannot be found.
func jsonPathAt(data []byte, root reflect.Type, off int64) string {
	path := ""
	walkJSON(data, root, func(frames []jsonFrame, _ json.Token, isKey bool, end int64) bool {
		if isKey || end < off {
			return false
		}
		path = jsonPathOf(frames)
		return true
	})
	return path
}

// unknownJSONField finds the first key of data, in document order, that
// names no field of the struct its object decodes into (what
// DisallowUnknownFields refuses): the path of the object holding it ("" at
// the top), the key, and the fields that struct has.
func unknownJSONField(data []byte, root reflect.Type) (parent, key string, fields []string, ok bool) {
	walkJSON(data, root, func(frames []jsonFrame, tok json.Token, isKey bool, _ int64) bool {
		if !isKey {
			return false
		}
		top := frames[len(frames)-1]
		if top.typ == nil || top.typ.Kind() != reflect.Struct || fieldType(top.typ, top.key) != nil {
			return false
		}
		parent, key, fields, ok = jsonPathOf(frames[:len(frames)-1]), top.key, jsonFields(top.typ), true
		return true
	})
	return parent, key, fields, ok
}

// maxDepth is how deep a manifest's objects and arrays may nest: a
// pipeline's parallel step's function is 5 levels down, a tensor's shape
// too, and parallel steps do not nest.
const maxDepth = 16

// tooDeep is the offset of the first '{' or '[' of data that opens a level
// past maxDepth, or -1. Decoding cannot be left to find it: Step decodes
// itself, so each level of nested steps is scanned again by its own
// decoder, whose depth limit starts afresh, and 4000 levels around 900 KiB
// cost a deploy a minute of CPU.
func tooDeep(data []byte) int64 {
	depth, inString := 0, false
	for i := 0; i < len(data); i++ {
		c := data[i]
		switch {
		case inString && c == '\\':
			i++ // the escaped byte is no quote
		case c == '"':
			inString = !inString
		case inString:
		case c == '{' || c == '[':
			if depth++; depth > maxDepth {
				return int64(i)
			}
		case c == '}' || c == ']':
			depth--
		}
	}
	return -1
}

// keySpelling finds the first key of data, in document order, that
// encoding/json would take but a reader of the file would not: a key given
// twice in one object (the last one wins), or a field's name in another
// case ("ZERO_OUT" sets zero_out). Either lets a manifest say one thing to
// a person or a tool reading it (jq .zero_out) and another to the server.
func keySpelling(data []byte, root reflect.Type) *FieldError {
	var found *FieldError
	// Per open object, by depth: its keys and where each ends. Offsets,
	// not lines: a line counts the bytes before it, and counted for every
	// key the check cost keys x size (18 s for 1 MB on one line).
	var seen []map[string]int64
	walkJSON(data, root, func(frames []jsonFrame, tok json.Token, isKey bool, end int64) bool {
		if !isKey {
			if d, ok := tok.(json.Delim); ok && d == '{' {
				for len(seen) <= len(frames) {
					seen = append(seen, nil)
				}
				seen[len(frames)] = map[string]int64{} // the frame this '{' opens
			}
			return false
		}
		depth := len(frames) - 1
		top := frames[depth]
		if top.raw != top.key {
			path := pathKey(top.raw)
			if parent := jsonPathOf(frames[:depth]); parent != "" {
				path = parent + "." + path
			}
			found = &FieldError{Field: path, Reason: fmt.Sprintf("no such field (did you mean %q? field names are case-sensitive)", top.key)}
			return true
		}
		if depth < len(seen) && seen[depth] != nil {
			if firstEnd, twice := seen[depth][top.raw]; twice {
				first, _ := lineColumn(data, firstEnd)
				line, _ := lineColumn(data, end)
				at := fmt.Sprintf("lines %d and %d", first, line)
				if first == line {
					at = fmt.Sprintf("both on line %d", line)
				}
				found = &FieldError{Field: jsonPathOf(frames), Reason: fmt.Sprintf("given twice (%s): a field may appear once", at)}
				return true
			}
			seen[depth][top.raw] = end
		}
		return false
	})
	return found
}

// lineColumn is the 1-based line and column (in bytes) of data[pos]; pos
// may be len(data), just past the end.
func lineColumn(data []byte, pos int64) (line, col int) {
	pos = min(max(pos, 0), int64(len(data)))
	before := data[:pos]
	return 1 + bytes.Count(before, []byte{'\n'}), len(before) - bytes.LastIndexByte(before, '\n')
}

// Suggest returns the candidate closest to name, ignoring case, when it is
// within a typo of it (two edits, three for names of 12 or more bytes; a
// swap of neighbours is one edit), else "". Commands, flags, manifest
// fields and entry points all suggest this way. A candidate whose length
// differs from name's by more than the edits allowed cannot be within
// them, and is passed over before anything is allocated: name may be a
// request's (a model name up to the body limit), and the distance's table
// is len(name) by len(candidate).
func Suggest(name string, candidates []string) string {
	limit := 2
	if len(name) >= 12 {
		limit = 3
	}
	best, bestD, lower := "", limit+1, ""
	for _, c := range candidates {
		if len(c) < len(name)-limit || len(c) > len(name)+limit {
			continue
		}
		if lower == "" {
			lower = strings.ToLower(name)
		}
		if d := typoDistance(lower, strings.ToLower(c)); d < bestD && d < len(name) {
			best, bestD = c, d
		}
	}
	return best
}

// OneTypo is the candidate name is one typo away from (a byte inserted,
// dropped, changed, or two swapped; case counts), or "" for none: a
// tighter match than Suggest's, for refusing a name rather than hinting.
func OneTypo(name string, candidates []string) string {
	for _, c := range candidates {
		if typoDistance(name, c) == 1 {
			return c
		}
	}
	return ""
}

// typoDistance is the optimal string alignment distance between a and b:
// insertions, deletions, substitutions and swaps of adjacent bytes.
func typoDistance(a, b string) int {
	d := make([][]int, len(a)+1)
	for i := range d {
		d[i] = make([]int, len(b)+1)
		d[i][0] = i
	}
	for j := range d[0] {
		d[0][j] = j
	}
	for i := 1; i <= len(a); i++ {
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			d[i][j] = min(d[i-1][j]+1, d[i][j-1]+1, d[i-1][j-1]+cost)
			if i > 1 && j > 1 && a[i-1] == b[j-2] && a[i-2] == b[j-1] {
				d[i][j] = min(d[i][j], d[i-2][j-2]+1)
			}
		}
	}
	return d[len(a)][len(b)]
}

// stepFieldPath is the path of the first value in data at a step's field
// (steps[i].field, at any depth of parallel steps) whose JSON kind is the
// one an UnmarshalTypeError names (value: "number", "number 5", "string",
// ...); "" when there is none. A step decodes on its own, so its errors
// carry no index or offset into the file.
func stepFieldPath(data []byte, field, value string) string {
	found := ""
	walkJSON(data, manifestType, func(frames []jsonFrame, tok json.Token, isKey bool, _ int64) bool {
		if isKey || len(frames) < 2 || frames[0].key != "steps" {
			return false
		}
		if last := frames[len(frames)-1]; last.array || last.key != field || !strings.HasPrefix(value, tokenKind(tok)) {
			return false
		}
		found = jsonPathOf(frames)
		return true
	})
	return found
}

// tokenKind is a JSON token's kind as encoding/json's errors name it.
func tokenKind(tok json.Token) string {
	switch v := tok.(type) {
	case json.Delim:
		if v == '[' {
			return "array"
		}
		return "object"
	case json.Number, float64:
		return "number"
	case string:
		return "string"
	case bool:
		return "bool"
	}
	return "null"
}
