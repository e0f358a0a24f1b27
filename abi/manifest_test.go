package abi

import (
	"strings"
	"testing"
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
		{"unknown field", `"zero_tmp":false`, `"zero_tmpp":false`, "plover.json"},
		{"batch valid", `"abi":1,`, `"abi":2,"batch":{"max_items":4,"max_delay":"200us","item_input_bytes":1000000,"item_output_bytes":1000000},`, ""},
		{"batch on abi 1", `"zero_tmp":false`, `"zero_tmp":false,"batch":{"max_items":4,"item_input_bytes":1000000,"item_output_bytes":1000000}`, "batch"},
		{"batch item size overflowing to the buffer", `"abi":1,`, `"abi":2,"batch":{"max_items":4,"item_input_bytes":4611686018428387904,"item_output_bytes":1000000},`, "batch.item_input_bytes"},
		{"batch one item", `"abi":1,`, `"abi":2,"batch":{"max_items":1,"item_input_bytes":4000000,"item_output_bytes":4000000},`, "batch.max_items"},
		{"batch input not max_items items", `"abi":1,`, `"abi":2,"batch":{"max_items":4,"item_input_bytes":999999,"item_output_bytes":1000000},`, "batch.item_input_bytes"},
		{"batch output not max_items items", `"abi":1,`, `"abi":2,"batch":{"max_items":4,"item_input_bytes":1000000,"item_output_bytes":3},`, "batch.item_output_bytes"},
		{"batch delay", `"abi":1,`, `"abi":2,"batch":{"max_items":4,"max_delay":"2s","item_input_bytes":1000000,"item_output_bytes":1000000},`, "batch.max_delay"},
		{"batch unknown field", `"abi":1,`, `"abi":2,"batch":{"max_item":4,"item_input_bytes":1000000,"item_output_bytes":1000000},`, "plover.json"},
		{"wrong type", `"abi":1`, `"abi":"1"`, "abi"},
		{"trailing data", `}]}`, `}]} {}`, "plover.json"},
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
		{`{"name":"f",}`, `plover.json: invalid JSON at byte`},
	} {
		_, err := ParseManifest(strings.NewReader(tt.json))
		if err == nil || !strings.HasPrefix(err.Error(), tt.want) || strings.Contains(err.Error(), "Go struct") {
			t.Errorf("%s: %v, want %q", tt.json, err, tt.want)
		}
	}
}
