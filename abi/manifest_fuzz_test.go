package abi

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"
)

// manifestFields are the top-level keys of plover.json: a FieldError names
// one of them (or a path under one), or the file itself.
var manifestFields = func() map[string]bool {
	fields := map[string]bool{ManifestFile: true}
	rt := reflect.TypeFor[Manifest]()
	for i := range rt.NumField() {
		tag, _, _ := strings.Cut(rt.Field(i).Tag.Get("json"), ",")
		fields[tag] = true
	}
	return fields
}()

// plainFile: a name that filepath.Join(dir, name) keeps inside dir, as the
// bundle and the loader join library and constants.
func plainFile(s string) bool {
	return s != "" && filepath.IsLocal(s) && filepath.Base(s) == s && !strings.ContainsAny(s, `/\`)
}

// FuzzParseManifest fuzzes plover.json bytes into a validated manifest.
func FuzzParseManifest(f *testing.F) {
	samples, err := filepath.Glob("../samples/*/plover.json")
	if err != nil || len(samples) == 0 {
		f.Fatalf("no sample manifests: %v", err)
	}
	for _, p := range samples {
		b, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	for _, s := range []string{
		valid,
		// Every optional part a function may set, and a pipeline's forms.
		`{"name":"typed","abi":2,"target":"cuda","library":"t.so","constants":"w.bin","max_input_bytes":4096,"tmp_bytes":64,"out_bytes":4096,` +
			`"zero_tmp":true,"zero_out":false,"graph":false,"chain":[{"kernel":"k1","grid":2,"block":1024},{"kernel":"k2","grid":1,"block":1}],` +
			`"min_instances":1,"max_instances":4,"max_queue":64,"idle_ttl":"30s","max_host_memory_mb":512,"gpu_share":50,"share":0.5,"priority":"latency",` +
			`"build":{"sources":["src/k.cu"],"include":["include"],"cuda_arch":["80","90a"],"cxxflags":["-O3"],"nvccflags":["-lineinfo"]},` +
			`"tensors":{"inputs":[{"name":"x","datatype":"FP32","shape":[2,-1]}],"outputs":[{"name":"a:0","datatype":"INT64","shape":[1]},{"name":"rest","datatype":"FP16","shape":[-1]}]},` +
			`"batch":{"max_items":4,"max_delay":"200us","item_input_bytes":1024,"item_output_bytes":1024}}`,
		`{"name":"p","kind":"pipeline","steps":["a",{"function":"b","version":"0123abcd"},{"parallel":["c",{"function":"d"}]}]}`,
		// Tricky: JSON that encoding/json takes loosely (keys folded in
		// case, a key twice, escapes), numbers at and past the limits, a
		// batch whose sizes multiply past an int64, bytes after the object.
		`{"NAME":"x","Abi":1,"target":"host","library":"x.so","max_input_bytes":1,"out_bytes":1,"chain":[{"kernel":"k","grid":1,"block":1}],"name":"\u0079"}`,
		`{"name":"x","abi":1,"target":"host","library":"x.so","max_input_bytes":1073741824,"out_bytes":1073741825,"chain":[{"kernel":"k","grid":2147483647,"block":1}]}`,
		`{"name":"x","abi":2,"target":"host","library":"x.so","max_input_bytes":1000,"out_bytes":8,"chain":[{"kernel":"k","grid":1,"block":1}],` +
			`"batch":{"max_items":4,"item_input_bytes":250,"item_output_bytes":2}}`,
		`{"name":"x","abi":1,"target":"host","library":"../x.so","max_input_bytes":1,"out_bytes":1,"chain":[{"kernel":"k","grid":1,"block":1}]}`,
		`{"name":"x","abi":1,"target":"host","library":"x.so","max_input_bytes":1,"out_bytes":1,"chain":[{"kernel":"k","grid":1,"block":1}],"share":1e-300,"idle_ttl":"-1s"}`,
		`{"name":"p","kind":"pipeline","steps":[{"parallel":[{"parallel":["a","b"]},"c"]}],"abi":1}`,
		`{"name":"f","max_queue":"64"}`,
		`{"name":"f"} {}`,
		`[1]`,
		`{"name":"p","kind":"pipeline","steps":["a",{"function":1}]}`,
		`{"name":"p","kind":"pipeline","steps":[{"parallel":["a",{"version":[]}]},7]}`,
		``,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := ParseManifest(bytes.NewReader(data))
		if err != nil {
			// The convention: a FieldError naming the field at fault (or
			// the file), in JSON's words rather than Go's.
			fe, ok := AsFieldError(err)
			if !ok {
				t.Fatalf("not a FieldError: %T %v", err, err)
			}
			top := fe.Field
			if q, err := strconv.QuotedPrefix(top); err == nil { // a key that is no plain name
				top = q
			} else if top != ManifestFile {
				top, _, _ = strings.Cut(top, ".")
				top, _, _ = strings.Cut(top, "[")
			}
			// An unknown key is named by its path: at the top it is no
			// field, below it sits under one.
			unknown := strings.HasPrefix(fe.Reason, "no such field")
			nested := top != fe.Field
			if fe.Reason == "" || manifestFields[top] == (unknown && !nested) {
				t.Fatalf("error names no field of plover.json: field %q, reason %q", fe.Field, fe.Reason)
			}
			if msg := err.Error(); strings.Contains(msg, "Go struct") || strings.Contains(msg, "Go value") {
				t.Fatalf("error in Go's words: %q", msg)
			}
			return
		}
		checkManifest(t, m)

		// What was taken encodes to a manifest that is taken again, the
		// same: the bundle rewrites plover.json from the parsed manifest.
		js, err := json.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		m2, err := ParseManifest(bytes.NewReader(js))
		if err != nil {
			t.Fatalf("re-encoded manifest refused: %v\n%s", err, js)
		}
		if js2, _ := json.Marshal(m2); !bytes.Equal(js, js2) {
			t.Fatalf("re-encoding changed the manifest:\n%s\n%s", js, js2)
		}
	})
}

// checkManifest holds a taken manifest to what its users rely on, checked
// here without Validate's code: file names that stay in the bundle's
// directory, buffer sizes the runtime can allocate, a batch that divides
// its buffers exactly, durations that parse.
func checkManifest(t *testing.T, m *Manifest) {
	t.Helper()
	if !ValidName(m.Name) {
		t.Fatalf("name %q", m.Name)
	}
	if m.IsPipeline() {
		if m.Library != "" || m.Constants != "" || m.Chain != nil || len(m.Steps) == 0 || len(m.Steps) > MaxPipelineSteps {
			t.Fatalf("pipeline %+v", m)
		}
		for _, fn := range Functions(m.Steps) {
			if !ValidName(fn) || fn == m.Name {
				t.Fatalf("pipeline %s runs %q", m.Name, fn)
			}
		}
		return
	}
	if !plainFile(m.Library) || !strings.HasSuffix(m.Library, ".so") || m.Constants != "" && !plainFile(m.Constants) ||
		m.Library == ManifestFile || m.Constants == ManifestFile || m.Library == m.Constants {
		t.Fatalf("files: library %q, constants %q", m.Library, m.Constants)
	}
	for _, n := range []int64{m.MaxInputBytes, m.OutBytes, m.TmpBytes + 1} {
		if n < 1 || n > MaxBufferBytes+1 {
			t.Fatalf("buffers: input %d, tmp %d, out %d", m.MaxInputBytes, m.TmpBytes, m.OutBytes)
		}
	}
	if len(m.Chain) == 0 || len(m.Chain) > MaxChainLength {
		t.Fatalf("chain of %d", len(m.Chain))
	}
	for _, l := range m.Chain {
		if !ValidSymbol(l.Kernel) || strings.HasPrefix(l.Kernel, ReservedPrefix) || l.Grid < 1 || l.Block < 1 || l.Block > MaxBlock {
			t.Fatalf("launch %+v", l)
		}
	}
	if b := m.Build; b != nil {
		for _, p := range append(append([]string{}, b.Sources...), b.Include...) {
			if !filepath.IsLocal(p) || strings.Contains(p, `\`) {
				t.Fatalf("build path %q leaves the function directory", p)
			}
		}
	}
	if d, ok := m.IdleTTLDuration(); m.IdleTTL != "" && (!ok || d < 0) {
		t.Fatalf("idle_ttl %q", m.IdleTTL)
	}
	if b := m.Batch; b != nil {
		// Division, not multiplication: a product may wrap past an int64.
		n := int64(b.MaxItems)
		if n < 2 || n > MaxBatchItems || m.ABI == 1 ||
			m.MaxInputBytes%n != 0 || m.MaxInputBytes/n != b.ItemInputBytes ||
			m.OutBytes%n != 0 || m.OutBytes/n != b.ItemOutputBytes {
			t.Fatalf("batch %+v does not divide max_input_bytes %d and out_bytes %d", *b, m.MaxInputBytes, m.OutBytes)
		}
		if d := b.Delay(); d < 0 || d > time.Second {
			t.Fatalf("batch max_delay %q", b.MaxDelay)
		}
	}
}
