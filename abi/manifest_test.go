package abi

import (
	"fmt"
	"io"
	"os"
	"reflect"
	"runtime"
	"strings"
	"testing"
	"time"
)

const valid = `{"name":"vecadd","abi":1,"target":"host","library":"vecadd.so","constants":"b.bin",
 "max_input_bytes":4000000,"tmp_bytes":0,"out_bytes":4000000,"zero_tmp":false,
 "chain":[{"kernel":"vecadd","grid":256,"block":256}]}`

func TestParseManifest(t *testing.T) {
	tests := []struct {
		name      string
		from, to  string // replace from with to in valid
		wantField string // "" means valid
	}{
		{"valid", "", "", ""},
		{"name uppercase", `"name":"vecadd"`, `"name":"VecAdd"`, "name"},
		{"name leading dash", `"name":"vecadd"`, `"name":"-x"`, "name"},
		{"name too long", `"name":"vecadd"`, `"name":"` + strings.Repeat("a", 64) + `"`, "name"},
		{"abi 2", `"abi":1`, `"abi":2`, ""},
		{"build", `"chain"`, `"build":{"sources":["src/k.cu"],"cuda_arch":["80","90a"]},"graph":false,"chain"`, ""},
		{"abi 3", `"abi":1`, `"abi":3`, "abi"},
		{"abi 0", `"abi":1`, `"abi":0`, "abi"},
		{"build without sources", `"chain"`, `"build":{"sources":[]},"chain"`, "build.sources"},
		{"build source escapes", `"chain"`, `"build":{"sources":["../x.cu"]},"chain"`, "build.sources[0]"},
		{"build arch", `"chain"`, `"build":{"sources":["x.cu"],"cuda_arch":["sm_80"]},"chain"`, "build.cuda_arch[0]"},
		{"target gpu", `"target":"host"`, `"target":"gpu"`, "target"},
		{"library traversal", `"library":"vecadd.so"`, `"library":"../vecadd.so"`, "library"},
		{"library not .so", `"library":"vecadd.so"`, `"library":"vecadd.dll"`, "library"},
		{"constants slash", `"constants":"b.bin"`, `"constants":"a/b.bin"`, "constants"},
		{"constants same as library", `"constants":"b.bin"`, `"constants":"vecadd.so"`, "constants"},
		{"max input zero", `"max_input_bytes":4000000`, `"max_input_bytes":0`, "max_input_bytes"},
		{"max input huge", `"max_input_bytes":4000000`, `"max_input_bytes":2000000000`, "max_input_bytes"},
		{"tmp negative", `"tmp_bytes":0`, `"tmp_bytes":-1`, "tmp_bytes"},
		{"out zero", `"out_bytes":4000000`, `"out_bytes":0`, "out_bytes"},
		{"zero_tmp without tmp", `"zero_tmp":false`, `"zero_tmp":true`, "zero_tmp"},
		{"empty chain", `[{"kernel":"vecadd","grid":256,"block":256}]`, `[]`, "chain"},
		{"kernel not identifier", `"kernel":"vecadd"`, `"kernel":"vec add"`, "chain[0].kernel"},
		{"kernel reserved", `"kernel":"vecadd"`, `"kernel":"plover_last_error"`, "chain[0].kernel"},
		{"grid zero", `"grid":256`, `"grid":0`, "chain[0].grid"},
		{"block too big", `"block":256`, `"block":2048`, "chain[0].block"},
		{"min over max", `"zero_tmp":false`, `"zero_tmp":false,"min_instances":3,"max_instances":2`, "min_instances"},
		{"negative queue", `"zero_tmp":false`, `"zero_tmp":false,"max_queue":-1`, "max_queue"},
		{"share and priority", `"zero_tmp":false`, `"zero_tmp":false,"share":2.5,"priority":"latency"`, ""},
		{"batch priority", `"zero_tmp":false`, `"zero_tmp":false,"priority":"batch"`, ""},
		{"negative share", `"zero_tmp":false`, `"zero_tmp":false,"share":-1`, "share"},
		{"share too large", `"zero_tmp":false`, `"zero_tmp":false,"share":1001`, "share"},
		{"share too small", `"zero_tmp":false`, `"zero_tmp":false,"share":1e-300`, "share"},
		{"unknown priority", `"zero_tmp":false`, `"zero_tmp":false,"priority":"high"`, "priority"},
		{"string for a number", `"zero_tmp":false`, `"zero_tmp":false,"max_queue":"64"`, "max_queue"},
		{"number for a bool", `"zero_tmp":false`, `"zero_tmp":1`, "zero_tmp"},
		{"bad idle_ttl", `"zero_tmp":false`, `"zero_tmp":false,"idle_ttl":"soon"`, "idle_ttl"},
		{"negative idle_ttl", `"zero_tmp":false`, `"zero_tmp":false,"idle_ttl":"-1s"`, "idle_ttl"},
		{"zero idle_ttl", `"zero_tmp":false`, `"zero_tmp":false,"idle_ttl":"0s"`, "idle_ttl"},
		{"positive idle_ttl", `"zero_tmp":false`, `"zero_tmp":false,"idle_ttl":"1ns"`, ""},
		{"unknown field", `"zero_tmp":false`, `"zero_tmpp":false`, "zero_tmpp"},
		{"batch valid", `"abi":1,`, `"abi":2,"batch":{"max_items":4,"max_delay":"200us","item_input_bytes":1000000,"item_output_bytes":1000000},`, ""},
		{"batch on abi 1", `"zero_tmp":false`, `"zero_tmp":false,"batch":{"max_items":4,"item_input_bytes":1000000,"item_output_bytes":1000000}`, "batch"},
		{"batch item size overflowing to the buffer", `"abi":1,`, `"abi":2,"batch":{"max_items":4,"item_input_bytes":4611686018428387904,"item_output_bytes":1000000},`, "batch.item_input_bytes"},
		{"batch one item", `"abi":1,`, `"abi":2,"batch":{"max_items":1,"item_input_bytes":4000000,"item_output_bytes":4000000},`, "batch.max_items"},
		{"batch input not max_items items", `"abi":1,`, `"abi":2,"batch":{"max_items":4,"item_input_bytes":999999,"item_output_bytes":1000000},`, "batch.item_input_bytes"},
		{"batch output not max_items items", `"abi":1,`, `"abi":2,"batch":{"max_items":4,"item_input_bytes":1000000,"item_output_bytes":3},`, "batch.item_output_bytes"},
		{"batch delay", `"abi":1,`, `"abi":2,"batch":{"max_items":4,"max_delay":"2s","item_input_bytes":1000000,"item_output_bytes":1000000},`, "batch.max_delay"},
		{"batch unknown field", `"abi":1,`, `"abi":2,"batch":{"max_item":4,"item_input_bytes":1000000,"item_output_bytes":1000000},`, "batch.max_item"},
		{"unknown field in a chain step", `"block":256`, `"blok":256`, "chain[0].blok"},
		{"wrong type", `"abi":1`, `"abi":"1"`, "abi"},
		{"trailing data", `}]}`, `}]} {}`, "plover.json"},
		// json.Decoder's More is false before a stray '}' or ']' as at the
		// end: those passed, where jq and editors refuse the file.
		{"a stray brace after the object", `}]}`, "}]}}", "plover.json"},
		{"a stray bracket after the object", `}]}`, "}]}\n]", "plover.json"},
		{"whitespace after the object", `}]}`, "}]}\r\n\t \n", ""},
		{"not json", valid, `not json`, "plover.json"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			src := valid
			if tt.from != "" {
				if !strings.Contains(src, tt.from) {
					t.Fatalf("test bug: %q not in manifest", tt.from)
				}
				src = strings.Replace(src, tt.from, tt.to, 1)
			}
			m, err := ParseManifest(strings.NewReader(src))
			if tt.wantField == "" {
				if err != nil {
					t.Fatalf("valid manifest refused: %v", err)
				}
				if m.Name != "vecadd" || len(m.Chain) != 1 || m.Chain[0].Grid != 256 {
					t.Fatalf("parsed wrong: %+v", m)
				}
				return
			}
			fe, ok := AsFieldError(err)
			if !ok {
				t.Fatalf("want a FieldError for %s, got %v", tt.wantField, err)
			}
			if fe.Field != tt.wantField {
				t.Fatalf("error names field %q, want %q (%v)", fe.Field, tt.wantField, err)
			}
			if fe.Reason == "" {
				t.Fatal("error has no reason")
			}
		})
	}
}

// A required field left out is told as missing, not by the zero value the
// author never wrote ("abi: is 0", "target: \"\" must be ..."); one given
// a bad value keeps its message.
func TestManifestMissingField(t *testing.T) {
	targets := orList(quoted(Targets())) // "host" or "cuda", and a test's
	for _, tt := range []struct {
		name     string
		from, to string // replace from with to in valid
		want     string // the whole error
	}{
		{"no name", `"name":"vecadd",`, ``, `name: required, missing: the function's name, [a-z0-9][a-z0-9-]{0,62}`},
		{"no abi", `"abi":1,`, ``, `abi: required, missing: 2 (or 1 for a library built against the ABI 1 header), the major version the library was built for`},
		{"abi null", `"abi":1`, `"abi":null`, `abi: required, missing: 2 (or 1 for a library built against the ABI 1 header), the major version the library was built for`},
		{"no target", `"target":"host",`, ``, `target: required, missing: ` + targets},
		{"no library", `"library":"vecadd.so",`, ``, `library: required, missing: the .so file name in the bundle`},
		{"no max_input_bytes", `"max_input_bytes":4000000,`, ``, `max_input_bytes: required, missing: the largest input in bytes, 1..1073741824`},
		{"no out_bytes", `"out_bytes":4000000,`, ``, `out_bytes: required, missing: the size of out in bytes, 1..1073741824`},
		{"no chain", `,
 "chain":[{"kernel":"vecadd","grid":256,"block":256}]`, ``, `chain: required, missing: the entries to run, [{"kernel": ..., "grid": ..., "block": ...}]`},
		// Present but bad: the value's own message, as before.
		{"abi 0", `"abi":1`, `"abi":0`, `abi: is 0, this runtime speaks ABI 2 (and loads ABI 1 bundles): the major version the library was built for`},
		{"target empty", `"target":"host"`, `"target":""`, `target: "" must be ` + targets},
		{"library empty", `"library":"vecadd.so"`, `"library":""`, `library: "" must be a plain file name ending in .so`},
		{"max_input_bytes 0", `"max_input_bytes":4000000`, `"max_input_bytes":0`, `max_input_bytes: 0 must be in 1..1073741824`},
		{"out_bytes 0", `"out_bytes":4000000`, `"out_bytes":0`, `out_bytes: 0 must be in 1..1073741824`},
		{"chain empty", `[{"kernel":"vecadd","grid":256,"block":256}]`, `[]`, `chain: must name at least one kernel`},
		// The first problem in the fields' order: a bad name before a
		// missing abi.
		{"bad name, no abi", `"name":"vecadd","abi":1,`, `"name":"Vec",`, `name: "Vec" must match [a-z0-9][a-z0-9-]{0,62}`},
		{"pipeline without a name", valid, `{"kind":"pipeline","steps":["a"]}`, `name: required, missing: the pipeline's name, [a-z0-9][a-z0-9-]{0,62}`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if !strings.Contains(valid, tt.from) {
				t.Fatalf("test bug: %q not in the manifest", tt.from)
			}
			src := strings.Replace(valid, tt.from, tt.to, 1)
			for _, parse := range []func(io.Reader) (*Manifest, error){ParseManifest, ParseStoredManifest} {
				if _, err := parse(strings.NewReader(src)); err == nil || err.Error() != tt.want {
					t.Fatalf("%v\nwant %s\n%s", err, tt.want, src)
				}
			}
		})
	}
	// A manifest checked without its JSON (Validate) has no keys to miss.
	if err := (&Manifest{Name: "x"}).Validate(); err == nil || !strings.HasPrefix(err.Error(), "abi: is 0") {
		t.Fatalf("Validate: %v", err)
	}
}

func TestChainLimitAndKernels(t *testing.T) {
	chain := make([]Launch, MaxChainLength+1)
	for i := range chain {
		chain[i] = Launch{Kernel: "k", Grid: 1, Block: 1}
	}
	if err := ValidateChain("chain", chain); err == nil {
		t.Fatalf("chain of %d accepted", len(chain))
	}
	got := Kernels([]Launch{{Kernel: "a"}, {Kernel: "b"}, {Kernel: "a"}})
	if strings.Join(got, ",") != "a,b" {
		t.Fatalf("Kernels = %v", got)
	}
}

// A value of the wrong type names the field, the value and the type
// wanted, in JSON's words (it once said "cannot unmarshal string into Go
// struct field Manifest.out_bytes of type int64").
func TestManifestTypeErrors(t *testing.T) {
	for _, tt := range []struct{ json, want string }{
		{`{"name":"f","out_bytes":"400"}`, `out_bytes: "400" is a string, want a whole number`},
		{`{"name":"f","zero_tmp":"yes"}`, `zero_tmp: "yes" is a string, want true or false`},
		{`{"name":"f","chain":{"kernel":"k"}}`, `chain: is an object, want an array`},
		{`{"name":"f","batch":{"max_items":2.5}}`, `batch.max_items: 2.5 is a number, want a whole number`},
		{`{"name":"f",}`, `plover.json: invalid JSON at line 1, column 13: invalid character '}'`},
		// Paths are printed as Validate prints them: with the index.
		{`{"name":"f","chain":[{"grid":1},{"grid":"2"}]}`, `chain[1].grid: "2" is a string, want a whole number`},
		{`{"name":"f","chain":[{"grid":1},{"grid":{}}]}`, `chain[1].grid: is an object, want a whole number`},
		{`{"name":"f","build":{"sources":["a",3]}}`, `build.sources[1]: 3 is a number, want a string`},
		{`{"name":"f","tensors":{"inputs":[{"name":"x","shape":[1,"2"]}]}}`, `tensors.inputs[0].shape[1]: "2" is a string, want a whole number`},
		// A step decodes on its own; the path still names which.
		{`{"name":"p","kind":"pipeline","steps":[{"function":"a"},{"function":5}]}`, `steps[1].function: a step's "function" is a number, want a string`},
		{`{"name":"p","kind":"pipeline","steps":["a",{"parallel":["b",{"function":"c","version":true}]}]}`, `steps[1].parallel[1].version: a step's "version" is a boolean, want a string`},
		// A syntax error: the line and column.
		{"{\n  \"name\": \"f\",\n  \"abi\": 2,,\n}", `plover.json: invalid JSON at line 3, column 12: invalid character ','`},
		{"{\n  \"name\": \"f\",\n  \"chain\": [", `plover.json: invalid JSON: it ends at line 3, column 13 before the object does`},
		{"  \n", `plover.json: is empty`},
		// An unknown field: where it is, and the field meant.
		{`{"name":"f","zero_temp":true}`, `zero_temp: no such field (did you mean "zero_tmp"?)`},
		{`{"name":"f","Zero_Temp":true}`, `Zero_Temp: no such field (did you mean "zero_tmp"?)`},
		{`{"name":"f","chain":[{"kernel":"k"},{"kernel":"k","blok":1}]}`, `chain[1].blok: no such field in chain[1] (did you mean "block"?)`},
		{`{"name":"f","build":{"sources":["a"],"cxxflag":["-O3"]}}`, `build.cxxflag: no such field in build (did you mean "cxxflags"?)`},
		{`{"name":"p","kind":"pipeline","steps":["a",{"functon":"b"}]}`, `steps[1].functon: no such field in steps[1] (did you mean "function"?)`},
		{`{"name":"f","xyzzy":1}`, `xyzzy: no such field; a manifest has name, kind, steps, abi, target,`},
		{`{"NAME":0}`, `name: 0 is a number, want a string`}, // as the field is spelt
		{`{"name":"f","":1}`, `"": no such field; a manifest has name,`},
		{`{"name":"f","chain":[{"a.b":1}]}`, `chain[0]."a.b": no such field; chain[0] has kernel, grid, block`},
		{`{"name":"f","batch":{"max_items":2,"colour":1}}`, `batch.colour: no such field; batch has max_items, max_delay, item_input_bytes, item_output_bytes`},
	} {
		_, err := ParseManifest(strings.NewReader(tt.json))
		if err == nil || !strings.HasPrefix(err.Error(), tt.want) || strings.Contains(err.Error(), "Go struct") {
			t.Errorf("%s: %v, want %q", tt.json, err, tt.want)
		}
	}
}

// encoding/json takes a key given twice (the last wins) and a field's name
// in another case; either lets plover.json say one thing to whoever reads
// it (a reviewer, jq .zero_out) and another to the server, so both are
// refused as an unknown field is, naming where.
func TestManifestKeysSpeltOnce(t *testing.T) {
	valid := `"name":"f","abi":2,"target":"host","library":"f.so","max_input_bytes":16,"out_bytes":16,"chain":[{"kernel":"k","grid":1,"block":1}]`
	for _, tt := range []struct{ json, want string }{
		{`{` + valid + `,"zero_out":true,"zero_out":false}`, `zero_out: given twice (both on line 1): a field may appear once`},
		{"{\n" + valid + ",\n\"zero_out\": true,\n\"ZERO_OUT\": false}", `ZERO_OUT: no such field (did you mean "zero_out"? field names are case-sensitive)`},
		{`{` + valid + `,"Zero_Tmp":true,"tmp_bytes":4}`, `Zero_Tmp: no such field (did you mean "zero_tmp"?`},
		{"{\n\"out_bytes\": 1,\n" + valid + "}", `out_bytes: given twice (lines 2 and 3)`},
		{`{"name":"f","abi":2,"target":"host","library":"f.so","max_input_bytes":16,"out_bytes":16,"chain":[{"kernel":"k","grid":1,"block":1,"grid":2}]}`, `chain[0].grid: given twice`},
		{`{` + valid + `,"batch":{"max_items":2,"Max_Items":4,"item_input_bytes":8,"item_output_bytes":8}}`, `batch.Max_Items: no such field (did you mean "max_items"?`},
		{`{"name":"p","kind":"pipeline","steps":["a",{"function":"b","Function":"c"}]}`, `steps[1].Function: no such field (did you mean "function"?`},
		{`{"name":"p","kind":"pipeline","steps":["a",{"parallel":["b",{"function":"c","function":"d"}]}]}`, `steps[1].parallel[1].function: given twice`},
	} {
		_, err := ParseManifest(strings.NewReader(tt.json))
		if err == nil || !strings.HasPrefix(err.Error(), tt.want) {
			t.Errorf("%s:\n got %v\nwant %q", tt.json, err, tt.want)
		}
	}
	// The same key in sibling objects is no repeat.
	ok := `{` + valid[:strings.Index(valid, `"chain"`)] + `"chain":[{"kernel":"k","grid":1,"block":1},{"kernel":"k","grid":1,"block":1}]}`
	if _, err := ParseManifest(strings.NewReader(ok)); err != nil {
		t.Errorf("two launches with the same keys: %v", err)
	}
}

// A declared tensor's fixed bytes must fit the largest buffer: sizes whose
// product overflowed an int64 made /v2 cut an output of a negative length,
// a panic that took the whole server down.
func TestTensorShapesFitABuffer(t *testing.T) {
	manifest := func(in, out string) string {
		return `{"name":"f","abi":2,"target":"host","library":"f.so","max_input_bytes":64,"out_bytes":16,"chain":[{"kernel":"k","grid":1,"block":1}],` +
			`"tensors":{"inputs":[` + in + `],"outputs":[` + out + `]}}`
	}
	x := `{"name":"x","datatype":"UINT8","shape":[-1]}`
	y := `{"name":"y","datatype":"FP32","shape":[4]}`
	for _, tt := range []struct{ json, want string }{
		{manifest(x, `{"name":"y","datatype":"FP32","shape":[2305843009213693953]}`), "tensors.outputs[0].shape: [2305843009213693953] of FP32 takes more than 1073741824 bytes, the most a buffer holds"},
		{manifest(x, `{"name":"y","datatype":"FP32","shape":[4611686018427387904,4]}`), "tensors.outputs[0].shape: "}, // 2^64 elements: 0 when wrapped
		{manifest(x, `{"name":"y","datatype":"FP32","shape":[-1,4611686018427387904]}`), "tensors.outputs[0].shape: "},
		{manifest(x, `{"name":"y","datatype":"FP64","shape":[134217729]}`), "tensors.outputs[0].shape: [134217729] of FP64 takes more than 1073741824 bytes"},
		{manifest(x, `{"name":"y","datatype":"UINT8","shape":[1073741824]},{"name":"z","datatype":"UINT8","shape":[1]}`), "tensors.outputs[1].shape: [1] of UINT8 takes more than 1073741824 bytes, the most a buffer holds with the tensors declared before it"},
		{manifest(`{"name":"x","datatype":"INT64","shape":[9223372036854775807]}`, y), "tensors.inputs[0].shape: "},
		{manifest(`{"name":"x","datatype":"INT16","shape":[65536,8193,-1]}`, y), "tensors.inputs[0].shape: [65536 8193 -1] of INT16 takes more than 1073741824 bytes"},
		{manifest(x, y), ""},
		{manifest(`{"name":"x","datatype":"UINT8","shape":[1073741824]}`, `{"name":"y","datatype":"FP32","shape":[2,-1]}`), ""},
	} {
		_, err := ParseManifest(strings.NewReader(tt.json))
		if tt.want == "" && err != nil || tt.want != "" && (err == nil || !strings.HasPrefix(err.Error(), tt.want)) {
			t.Errorf("%s:\n got %v\nwant %q", tt.json, err, tt.want)
		}
	}
}

// Nesting is bounded before the document is decoded: each level of
// nested steps decoded itself again (Step.UnmarshalJSON, a decoder whose
// depth limit starts afresh), so a manifest under 1 MiB of nested
// parallel steps around padding cost its deploy seconds to minutes of
// CPU before validation refused it (parallel steps do not nest).
func TestManifestNestingBounded(t *testing.T) {
	nested := func(depth int, pad string) string {
		return `{"name":"p","kind":"pipeline","steps":[` + strings.Repeat(`{"parallel":["a",`, depth) + `"b"` + pad + strings.Repeat(`]}`, depth) + `]}`
	}
	t0 := time.Now()
	_, err := ParseManifest(strings.NewReader(nested(1000, strings.Repeat(" ", 900<<10))))
	if took := time.Since(t0); err == nil || !strings.HasPrefix(err.Error(), "plover.json: nests deeper than 16 levels at line 1, column ") || took > time.Second {
		t.Errorf("1000 nested parallel steps: %v after %v, want refused at once for its nesting", err, took)
	}
	// One level of nesting keeps its message; strings, escaped quotes
	// and all, are not levels.
	for _, tt := range []struct{ json, want string }{
		{nested(2, ""), `steps[0].parallel[1]: parallel steps do not nest`},
		{`{"name":"f","build":{"sources":["a"],"cxxflags":["-D\"X={{{{{{{{{{{{{{{{{{[[[[[[[[[[[[[["]},"abi":0}`, "abi: is 0"},
		{strings.Repeat("[", 17) + strings.Repeat("]", 17), "plover.json: nests deeper than 16 levels at line 1, column 17"},
	} {
		if _, err := ParseManifest(strings.NewReader(tt.json)); err == nil || !strings.HasPrefix(err.Error(), tt.want) {
			t.Errorf("%.80s: %v, want %q", tt.json, err, tt.want)
		}
	}
}

func TestSuggest(t *testing.T) {
	fields := []string{"zero_tmp", "zero_out", "tmp_bytes", "out_bytes", "max_queue"}
	for _, tt := range []struct{ name, want string }{
		{"zero_temp", "zero_tmp"}, // one insertion
		{"zero_otu", "zero_out"},  // one swap
		{"ZERO_OUT", "zero_out"},  // case
		{"tmp_byts", "tmp_bytes"},
		{"max_queues", "max_queue"},
		{"colour", ""}, // nothing close
		{"zt", ""},     // too short to guess from
		{"out", ""},    // a prefix is not a typo
		{"outbytes", "out_bytes"},
	} {
		if got := Suggest(tt.name, fields); got != tt.want {
			t.Errorf("Suggest(%q) = %q, want %q", tt.name, got, tt.want)
		}
	}
}

// README's manifest table lists every field of plover.json, each with its
// JSON type and a default, so that it cannot drift from Manifest (issue
// 37, item 9).
func TestReadmeManifestTable(t *testing.T) {
	b, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	readme := string(b)
	start := strings.Index(readme, "### The manifest (`plover.json`)")
	if start < 0 {
		t.Fatal("README has no manifest section")
	}
	section := readme[start:]
	if end := strings.Index(section[1:], "\n## "); end >= 0 {
		section = section[:end+1]
	}
	rows := map[string][]string{}
	for _, line := range strings.Split(section, "\n") {
		cells := strings.Split(line, "|")
		if len(cells) < 6 || !strings.HasPrefix(strings.TrimSpace(cells[1]), "`") {
			continue
		}
		rows[strings.Trim(strings.TrimSpace(cells[1]), "`")] = cells[2:5]
	}
	rt := reflect.TypeFor[Manifest]()
	for i := range rt.NumField() {
		f := rt.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		row, ok := rows[name]
		if !ok {
			t.Errorf("README's manifest table has no row for %q", name)
			continue
		}
		typ := map[reflect.Kind]string{reflect.String: "string", reflect.Int: "integer", reflect.Int64: "integer",
			reflect.Bool: "boolean", reflect.Float64: "number", reflect.Slice: "array", reflect.Struct: "object"}[deref(f.Type).Kind()]
		if got := strings.TrimSpace(row[0]); got != typ {
			t.Errorf("README says %s is %q, want %q", name, got, typ)
		}
		if strings.TrimSpace(row[1]) == "" || strings.TrimSpace(row[2]) == "" {
			t.Errorf("README's row for %s has no default or no meaning: %q", name, row)
		}
		delete(rows, name)
	}
	for name := range rows {
		t.Errorf("README's manifest table has %q, which is no field of plover.json", name)
	}
}

// The key check walks every key of a manifest: it must cost the size of the
// document, not keys x size. Finding each key's line by counting the bytes
// before it took 18 s for a 1 MB manifest of 30,000 objects on one line.
func TestManifestKeysCheckedInLinearTime(t *testing.T) {
	var b strings.Builder
	b.WriteString(`{"name":"f","abi":2,"target":"host","library":"f.so","max_input_bytes":16,"out_bytes":16,"zero_out":true,"chain":[`)
	for i := range 30000 {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(`{"kernel":"k","grid":1,"block":1}`)
	}
	b.WriteString(`],"zero_out":false}`) // a repeat after every other key
	if b.Len() > 1<<20 {
		t.Fatalf("manifest of %d bytes, over the 1 MiB limit", b.Len())
	}
	began := time.Now()
	_, err := ParseManifest(strings.NewReader(b.String()))
	took := time.Since(began)
	if want := "zero_out: given twice (both on line 1)"; err == nil || !strings.HasPrefix(err.Error(), want) {
		t.Errorf("got %v, want %q", err, want)
	}
	// Generous for a loaded machine: linear, it takes well under a second.
	if took > 5*time.Second {
		t.Errorf("checking %d bytes with %d keys took %v", b.Len(), 3*30000+8, took)
	}
}

// Rules that came after servers had stored bundles hold for manifests
// being admitted only: a stored one that broke them still loads.
func TestStoredManifestsKeepOlderRules(t *testing.T) {
	fn := `"name":"f","abi":2,"target":"host","library":"f.so","max_input_bytes":16,"out_bytes":16,"chain":[{"kernel":"k","grid":1,"block":1}]`
	long := "0." + strings.Repeat("0", 40) + "1s"
	for _, tt := range []struct{ json, want string }{
		{`{` + fn + `,"Zero_Out":false}`, `Zero_Out: no such field (did you mean "zero_out"?`},
		{`{` + fn + `,"zero_out":true,"zero_out":false}`, `zero_out: given twice`},
		{`{` + fn + `,"idle_ttl":"` + long + `"}`, `idle_ttl: is 44 bytes long, at most 32`},
		// 0 read as "never release" until deploys refused it; stored, it
		// loads, and the engine reads it as the server's --idle-ttl.
		{`{` + fn + `,"idle_ttl":"0s"}`, `idle_ttl: "0s" would release no idle instance ever: want a positive Go duration such as "30s" or "5m" (a function that must stay warm sets min_instances)`},
		{`{` + fn + `,"idle_ttl":"0"}`, `idle_ttl: "0" would release no idle instance ever`},
		{`{` + fn + `,"min_instances":1,"idle_ttl":"-0ms"}`, `idle_ttl: "-0ms" would release no idle instance ever`},
		{`{` + fn + `}}`, `plover.json: trailing data after the JSON object at line 1`}, // its required keys read from the object alone
		{`{"name":"f","abi":2,"target":"host","library":"f.so","max_input_bytes":16,"out_bytes":16,"chain":[{"kernel":"k","grid":1,"block":1}],` +
			`"batch":{"max_items":2,"max_delay":"` + long + `","item_input_bytes":8,"item_output_bytes":8}}`, `batch.max_delay: is 44 bytes long, at most 32`},
	} {
		if _, err := ParseManifest(strings.NewReader(tt.json)); err == nil || !strings.HasPrefix(err.Error(), tt.want) {
			t.Errorf("admitted %s:\n got %v\nwant %q", tt.json, err, tt.want)
		}
		if _, err := ParseStoredManifest(strings.NewReader(tt.json)); err != nil {
			t.Errorf("stored %s: %v", tt.json, err)
		}
	}
	m, err := ParseStoredManifest(strings.NewReader(`{` + fn + `,"Zero_Out":false}`))
	if err != nil || m.ZeroesOut() {
		t.Errorf("stored Zero_Out false: %v, zeroes out %v; want it read as before", err, m != nil && m.ZeroesOut())
	}
}

// A name may be a request's, as long as its body limit: Suggest passes
// over every candidate whose length is beyond a typo's reach before it
// allocates, instead of a len(name) x len(candidate) table per candidate.
func TestSuggestAllocatesNothingForANameNoCandidateIsNear(t *testing.T) {
	names := []string{"saxpy", strings.Repeat("a", MaxNameLen), "zero_tmp"}
	for _, n := range []int{MaxNameLen + 4, 4 << 10, 1 << 20} {
		name := strings.Repeat("A", n)
		if got := Suggest(name, names); got != "" {
			t.Errorf("Suggest(%d bytes) = %q, want none", n, got)
		}
		if a := testing.AllocsPerRun(5, func() { Suggest(name, names) }); a != 0 {
			t.Errorf("Suggest(%d bytes) allocated %v times, want 0", n, a)
		}
	}
	// Within reach, a long name is still compared, ignoring case.
	if got := Suggest(strings.Repeat("A", MaxNameLen+1), names); got != names[1] {
		t.Errorf("Suggest(64 A's) = %q, want the 63 a's", got)
	}
}

// A manifest key longer than any field by more than a typo gets no
// suggestion, and its refusal costs a few copies of it, not a table of
// len(key) ints per field.
func TestUnknownLongManifestKeyRefusedInBoundedMemory(t *testing.T) {
	key := strings.Repeat("z", 64<<10)
	data := strings.Replace(valid, `"abi":1,`, `"abi":1,"`+key+`":1,`, 1)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	_, err := ParseManifest(strings.NewReader(data))
	runtime.ReadMemStats(&after)
	if err == nil || !strings.Contains(err.Error(), "no such field") || strings.Contains(err.Error(), "did you mean") {
		t.Errorf("a 64 KiB unknown key: %.200v, want no such field and no suggestion", err)
	}
	if n := after.TotalAlloc - before.TotalAlloc; n > 4<<20 {
		t.Errorf("a 64 KiB unknown key allocated %d KiB", n>>10)
	}
}

// A side declares at most MaxTensors tensors when admitted: every version
// of a function's record keeps a copy of them, and a manifest of some
// 20,000 one-byte inputs made a few deploys' record too large to read
// back. A stored manifest with more still loads.
func TestTensorCountBounded(t *testing.T) {
	tensors := func(prefix string, n int) string {
		ts := make([]string, n)
		for i := range ts {
			ts[i] = fmt.Sprintf(`{"name":"%s%d","datatype":"BOOL","shape":[1]}`, prefix, i)
		}
		return strings.Join(ts, ",")
	}
	manifest := func(in, out int) string {
		return `{"name":"f","abi":2,"target":"host","library":"f.so","max_input_bytes":4096,"out_bytes":4096,"chain":[{"kernel":"k","grid":1,"block":1}],` +
			`"tensors":{"inputs":[` + tensors("x", in) + `],"outputs":[` + tensors("y", out) + `]}}`
	}
	for _, tt := range []struct {
		in, out int
		want    string // "": admitted
	}{
		{MaxTensors, MaxTensors, ""},
		{MaxTensors + 1, 1, "tensors.inputs: declares 1025 tensors, at most 1024"},
		{1, MaxTensors + 1, "tensors.outputs: declares 1025 tensors, at most 1024"},
		{20000, 1, "tensors.inputs: declares 20000 tensors, at most 1024"},
	} {
		doc := manifest(tt.in, tt.out)
		_, err := ParseManifest(strings.NewReader(doc))
		if tt.want == "" && err != nil || tt.want != "" && (err == nil || err.Error() != tt.want) {
			t.Errorf("%d inputs, %d outputs:\n got %v\nwant %q", tt.in, tt.out, err, tt.want)
		}
		if _, err := ParseStoredManifest(strings.NewReader(doc)); err != nil {
			t.Errorf("%d inputs, %d outputs, stored: %v", tt.in, tt.out, err)
		}
	}
}
