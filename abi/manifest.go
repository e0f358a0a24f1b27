package abi

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"time"
)

// Limits a manifest is checked against. They bound what one request may make
// the runtime allocate, not what a GPU could hold.
const (
	MaxBufferBytes = 1 << 30 // per buffer: input, tmp, out
	MaxChainLength = 64
	MaxGrid        = 1<<31 - 1
	MaxBlock       = 1024
	// MaxInstances bounds min_instances and max_instances (plover serve's
	// --worker-max-pids may bound them lower: each instance in a worker
	// holds one of its threads); MaxQueue bounds max_queue.
	MaxInstances = 1024
	MaxQueue     = 1 << 20
)

// Manifest is plover.json: what to load and what to run for each request.
type Manifest struct {
	Name string `json:"name"`
	// Kind is "function" (or empty) for a library's chain, "pipeline" for
	// functions run in Steps' order (see Step); a pipeline sets nothing else.
	Kind          string `json:"kind,omitempty"`
	Steps         []Step `json:"steps,omitempty"`
	ABI           int    `json:"abi"`
	Target        string `json:"target"`
	Library       string `json:"library"`
	Constants     string `json:"constants,omitempty"`
	MaxInputBytes int64  `json:"max_input_bytes"`
	TmpBytes      int64  `json:"tmp_bytes"`
	OutBytes      int64  `json:"out_bytes"`
	ZeroTmp       bool   `json:"zero_tmp"`
	// ZeroOut (default true) zeroes out before every request, so that no
	// response byte comes from an earlier request; false is for functions
	// whose chain always writes every byte of out.
	ZeroOut *bool `json:"zero_out,omitempty"`
	// Graph (default true) lets a CUDA device record the chain once as a
	// CUDA graph and replay it; false calls the entries on every request
	// (for entries whose host code must run each time). See plover.h.
	Graph *bool    `json:"graph,omitempty"`
	Chain []Launch `json:"chain"`
	// Pool policy; zero values take the server's defaults.
	// MinInstances are created at deploy and at server start and never
	// released for idleness; MaxInstances caps concurrency on a node;
	// MaxQueue bounds the requests waiting for an instance; IdleTTL (a
	// positive Go duration, "30s") releases an idle instance, and unloads
	// the function once it has none left.
	MinInstances int    `json:"min_instances,omitempty"`
	MaxInstances int    `json:"max_instances,omitempty"`
	MaxQueue     int    `json:"max_queue,omitempty"`
	IdleTTL      string `json:"idle_ttl,omitempty"`
	// MaxHostMemoryMB caps the resident memory of the function's worker
	// process (MiB; 0: the server's --worker-max-memory). A worker past it
	// is killed, and the requests it was running fail saying so.
	MaxHostMemoryMB int64 `json:"max_host_memory_mb,omitempty"`
	// GPUShare is the percentage of the GPU's SMs the function's worker
	// may use under NVIDIA MPS (1..100; 0: no limit). Ignored without MPS.
	GPUShare int `json:"gpu_share,omitempty"`
	// Share is the function's weight on a device: functions with runs
	// waiting get device time in proportion to their shares (0.01..1000;
	// 0: 1). A function alone gets the whole device whatever its share.
	Share float64 `json:"share,omitempty"`
	// Priority is the function's scheduling class: "latency" runs go
	// before "default" ones, which go before "batch" ones; a run waits
	// behind higher classes for a bounded time only ("": default).
	Priority string `json:"priority,omitempty"`
	// Build says how `plover build` compiles the function from source; the
	// runtime ignores it.
	Build *Build `json:"build,omitempty"`
	// Tensors declares the inputs and outputs the Open Inference Protocol
	// (/v2) sees; without it, one UINT8 tensor each way: the raw bytes.
	Tensors *Tensors `json:"tensors,omitempty"`
	// Batch, when set, runs concurrent requests as one chain (see Batch).
	Batch *Batch `json:"batch,omitempty"`
}

// The values of a manifest's "priority" ("" is PriorityDefault).
const (
	PriorityLatency = "latency"
	PriorityDefault = "default"
	PriorityBatch   = "batch"
)

// Priorities are the values of a manifest's "priority", highest first.
var Priorities = []string{PriorityLatency, PriorityDefault, PriorityBatch}

// Weight is the manifest's share as a scheduler weight (0: 1).
func (m *Manifest) Weight() float64 {
	if m.Share <= 0 {
		return 1
	}
	return m.Share
}

// Build describes a function's sources for `plover build`. Paths are
// relative to the function directory.
type Build struct {
	Sources []string `json:"sources"`
	// Include directories (default: "include", where plover init puts the
	// ABI headers).
	Include []string `json:"include,omitempty"`
	// CUDAArch lists the SM versions a CUDA build targets, each as a number
	// ("80", "90"); the last also gets PTX, so newer GPUs JIT it. Default
	// ["80", "90"].
	CUDAArch []string `json:"cuda_arch,omitempty"`
	// Extra flags for g++ (host) and nvcc (cuda).
	CXXFlags  []string `json:"cxxflags,omitempty"`
	NVCCFlags []string `json:"nvccflags,omitempty"`
}

// RequestOutBytes is the most output bytes one request gets: out_bytes, or
// a batching function's item_output_bytes (a batch's out is its items').
func (m *Manifest) RequestOutBytes() int64 {
	if m.Batch != nil {
		return m.Batch.ItemOutputBytes
	}
	return m.OutBytes
}

// Graphs reports whether a CUDA device may record and replay the chain.
func (m *Manifest) Graphs() bool { return m.Graph == nil || *m.Graph }

// ZeroesOut reports whether out is zeroed before each request.
func (m *Manifest) ZeroesOut() bool { return m.ZeroOut == nil || *m.ZeroOut }

// IdleTTLDuration parses IdleTTL; ok is false when it is unset.
func (m *Manifest) IdleTTLDuration() (d time.Duration, ok bool) {
	if m.IdleTTL == "" {
		return 0, false
	}
	d, err := time.ParseDuration(m.IdleTTL)
	return d, err == nil
}

// Launch is one step of a chain: the exported entry point and its launch size.
type Launch struct {
	Kernel string `json:"kernel"`
	Grid   int    `json:"grid"`
	Block  int    `json:"block"`
}

// RunsOn refuses a target none of a node's targets is: the server's answer
// to such a deploy, which plover deploy gives before it builds anything.
func RunsOn(target string, targets []string) error {
	if slices.Contains(targets, target) {
		return nil
	}
	return &FieldError{"target", fmt.Sprintf("the bundle is built for %q; this node's devices run %s", target, strings.Join(quoted(targets), " and "))}
}

// FieldError says which manifest field is wrong and why.
type FieldError struct {
	Field  string
	Reason string
}

func (e *FieldError) Error() string { return e.Field + ": " + e.Reason }

// Name classes, checked by hand rather than by regular expressions: a
// bounded repetition such as {0,127} compiles into a program of that many
// states, and compiling them at init cost every process start (each
// worker, each CLI command) about a millisecond.
var (
	nameClass   = byteClass{first: "a-z0-9", rest: "a-z0-9-", max: MaxNameLen} // ^[a-z0-9][a-z0-9-]{0,62}$
	symbolClass = byteClass{first: "A-Za-z_", rest: "A-Za-z0-9_", max: 128}    // ^[A-Za-z_][A-Za-z0-9_]{0,127}$
	fileClass   = byteClass{first: "A-Za-z0-9_", rest: "A-Za-z0-9_.-", max: 128}
)

// MaxNameLen is the longest a function name may be, in bytes.
const MaxNameLen = 63

// ValidName reports whether s is a valid function name.
func ValidName(s string) bool { return nameClass.match(s) }

// ValidSymbol reports whether s can name an exported C entry point.
func ValidSymbol(s string) bool { return symbolClass.match(s) }

// byteClass matches 1..max bytes, the first from first and the rest from
// rest; both are sets in regexp bracket syntax without negation (a-z ranges
// and single bytes; a '-' last is itself).
type byteClass struct {
	first, rest string
	max         int
}

func (c byteClass) match(s string) bool {
	if len(s) == 0 || len(s) > c.max || !inSet(c.first, s[0]) {
		return false
	}
	for i := 1; i < len(s); i++ {
		if !inSet(c.rest, s[i]) {
			return false
		}
	}
	return true
}

func inSet(set string, b byte) bool {
	for i := 0; i < len(set); i++ {
		if i+2 < len(set) && set[i+1] == '-' {
			if set[i] <= b && b <= set[i+2] {
				return true
			}
			i += 2
			continue
		}
		if set[i] == b {
			return true
		}
	}
	return false
}

// jsonError names what is wrong in a manifest that does not decode: for a
// value of the wrong type, the field (its JSON path), the value and the
// type wanted, never Go's struct names.
func jsonError(data []byte, err error) *FieldError {
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) && err != error(te) {
		// Wrapped by Step.UnmarshalJSON, the one decoder of its own: its
		// field and offset are the step's, not the file's.
		if te.Field != "" {
			field := "steps"
			if p := stepFieldPath(data, te.Field, te.Value); p != "" {
				field = p // which step: steps[1].function
			}
			return &FieldError{Field: field, Reason: fmt.Sprintf("a step's %q is %s, want %s", te.Field, jsonKind(te.Value), jsonWant(te.Type))}
		}
		return &FieldError{Field: "steps", Reason: fmt.Sprintf("a step is %s, want a function name or an object", jsonKind(te.Value))}
	}
	if errors.As(err, &te) && te.Field == "" { // the document is no object
		return &FieldError{Field: ManifestFile, Reason: fmt.Sprintf("is %s, want an object", jsonKind(te.Value))}
	}
	if errors.As(err, &te) {
		// encoding/json names the field without array indices
		// ("chain.grid"); the path printed is the one Validate prints
		// ("chain[0].grid").
		field := te.Field
		if p := jsonPathAt(data, manifestType, te.Offset); p != "" {
			field = p
		}
		kind := jsonKind(te.Value)
		if te.Value == "object" || te.Value == "array" { // no short text to quote
			return &FieldError{Field: field, Reason: fmt.Sprintf("is %s, want %s", kind, jsonWant(te.Type))}
		}
		return &FieldError{Field: field, Reason: fmt.Sprintf("%s is %s, want %s", valueBefore(data, te.Offset), kind, jsonWant(te.Type))}
	}
	var se *json.SyntaxError
	if errors.As(err, &se) {
		// Offset counts the bytes read, the one in error included.
		line, col := lineColumn(data, se.Offset-1)
		return &FieldError{Field: ManifestFile, Reason: fmt.Sprintf("invalid JSON at line %d, column %d: %s", line, col, strings.TrimPrefix(se.Error(), "json: "))}
	}
	if len(bytes.TrimSpace(data)) == 0 {
		return &FieldError{Field: ManifestFile, Reason: "is empty, want a JSON object"}
	}
	if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) {
		line, col := lineColumn(data, int64(len(bytes.TrimRight(data, " \t\r\n"))))
		return &FieldError{Field: ManifestFile, Reason: fmt.Sprintf("invalid JSON: it ends at line %d, column %d before the object does (a missing '}' or ']'?)", line, col)}
	}
	if strings.Contains(err.Error(), "json: unknown field ") {
		if parent, key, fields, ok := unknownJSONField(data, manifestType); ok {
			path := pathKey(key)
			if parent != "" {
				path = parent + "." + path
			}
			reason := unknownFieldReason(parent, key, fields)
			if form, _, ok := strings.Cut(err.Error(), ": json: unknown field"); ok && form != "" {
				reason += " (" + form + ")" // Step's: the forms a step takes
			}
			return &FieldError{Field: path, Reason: reason}
		}
	}
	return &FieldError{Field: ManifestFile, Reason: "invalid JSON: " + strings.TrimPrefix(err.Error(), "json: ")}
}

var manifestType = reflect.TypeFor[Manifest]()

// unknownFieldReason says a key is no field, and which field was meant:
// a misspelt "zero_tmp" would otherwise silently be false.
func unknownFieldReason(parent, key string, fields []string) string {
	in, has := "", "a manifest has"
	if parent != "" {
		in, has = " in "+parent, parent+" has"
	}
	if s := Suggest(key, fields); s != "" {
		return fmt.Sprintf("no such field%s (did you mean %q?)", in, s)
	}
	return fmt.Sprintf("no such field; %s %s", has, strings.Join(fields, ", "))
}

// valueBefore is the JSON value that ends at off in data (a string with
// its quotes), shortened to 40 bytes.
func valueBefore(data []byte, off int64) string {
	if off <= 0 || off > int64(len(data)) {
		return "the value"
	}
	end := int(off)
	for end > 0 && (data[end-1] == ' ' || data[end-1] == '\n' || data[end-1] == '\t' || data[end-1] == '\r') {
		end--
	}
	start := end - 1
	if start >= 0 && data[start] == '"' {
		for start--; start >= 0 && !(data[start] == '"' && (start == 0 || data[start-1] != '\\')); start-- {
		}
	} else {
		for start >= 0 && !strings.ContainsRune(":,[{ \n\t\r", rune(data[start])) {
			start--
		}
		start++
	}
	if start < 0 || start >= end {
		return "the value"
	}
	v := string(data[start:end])
	if len(v) > 40 {
		v = v[:37] + "..."
	}
	return v
}

func jsonKind(v string) string {
	switch {
	case v == "string" || strings.HasPrefix(v, "number"):
		return "a " + strings.Fields(v)[0]
	case v == "object" || v == "array":
		return "an " + v
	case v == "bool":
		return "a boolean"
	}
	return v
}

func jsonWant(t reflect.Type) string {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch t.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64, reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "a whole number"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "true or false"
	case reflect.Slice, reflect.Array:
		return "an array"
	}
	return "an object"
}

// ParseManifest decodes and validates a manifest being admitted (a deploy,
// plover deploy and pack, a model repository's folder). Unknown fields are
// errors: a misspelt "zero_tmp" must not silently become false; so are a
// field given twice and one spelt in another case, which encoding/json
// would take, a duration longer than MaxDurationLen, an idle_ttl of 0,
// and more than MaxTensors tensors a side.
func ParseManifest(r io.Reader) (*Manifest, error) { return parseManifest(r, true) }

// ParseStoredManifest decodes and validates the manifest of a bundle
// already taken (one a node fetches from the store or finds in its
// cache): as ParseManifest, without the rules that came after servers had
// stored bundles (those of ParseManifest's keys and durations), so that a
// version deployed before them still loads after an upgrade.
func ParseStoredManifest(r io.Reader) (*Manifest, error) { return parseManifest(r, false) }

// MaxDurationLen bounds a manifest's durations (idle_ttl,
// batch.max_delay) in bytes: time.ParseDuration takes any number of
// fraction digits, and a 300 KB max_delay of 0.000...1s was valid.
const MaxDurationLen = 32

// MaxManifestBytes bounds a manifest's size.
const MaxManifestBytes = 1 << 20

func parseManifest(r io.Reader, admit bool) (*Manifest, error) {
	data, err := io.ReadAll(io.LimitReader(r, MaxManifestBytes+1))
	if err != nil {
		return nil, fmt.Errorf("read manifest: %w", err)
	}
	if len(data) > MaxManifestBytes {
		return nil, &FieldError{Field: ManifestFile, Reason: "larger than 1 MiB"}
	}
	if off := tooDeep(data); off >= 0 {
		line, col := lineColumn(data, off)
		return nil, &FieldError{Field: ManifestFile, Reason: fmt.Sprintf("nests deeper than %d levels at line %d, column %d (parallel steps do not nest)", maxDepth, line, col)}
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var m Manifest
	if err := dec.Decode(&m); err != nil {
		return nil, jsonError(data, err)
	}
	if dec.More() {
		return nil, &FieldError{Field: ManifestFile, Reason: "trailing data after the JSON object"}
	}
	if admit {
		// More is false before a stray '}' or ']' as before the end, so
		// "{...}}" passed it: only JSON's whitespace may follow. Stored
		// manifests keep More's rule, so that one deployed so stays
		// loadable.
		if off := dec.InputOffset(); len(bytes.Trim(data[off:], " \t\r\n")) > 0 {
			line, col := lineColumn(data, off+int64(bytes.IndexFunc(data[off:], func(r rune) bool { return !strings.ContainsRune(" \t\r\n", r) })))
			return nil, &FieldError{Field: ManifestFile, Reason: fmt.Sprintf("trailing data after the JSON object at line %d, column %d", line, col)}
		}
		if fe := keySpelling(data, manifestType); fe != nil {
			return nil, fe
		}
		if fe := m.durationLengths(); fe != nil {
			return nil, fe
		}
		if fe := m.Tensors.counts(); fe != nil {
			return nil, fe
		}
	}
	// The object alone: a stored manifest may have a stray '}' after it.
	var has requiredKeys
	if err := json.Unmarshal(data[:dec.InputOffset()], &has); err != nil { // decoded above: cannot fail
		return nil, jsonError(data, err)
	}
	missing := has.missing()
	if err := m.validate(func(field string) bool { return missing[field] }); err != nil {
		return nil, err
	}
	if admit {
		if fe := m.idleTTLAdmitted(); fe != nil {
			return nil, fe
		}
	}
	return &m, nil
}

// idleTTLAdmitted refuses an idle_ttl of 0 at deploy. The reaper read 0 as
// "never release", so every instance a burst made stayed, and the function
// stayed loaded, where the docs (and the field's name) say an instance
// idle that long is released; "keep it warm" is min_instances' to say.
// Deploy alone: a version stored with 0 before this rule still loads, its
// 0 read as the server's --idle-ttl (engine's policyFor says so in the log).
func (m *Manifest) idleTTLAdmitted() *FieldError {
	if d, ok := m.IdleTTLDuration(); ok && d == 0 {
		return &FieldError{"idle_ttl", fmt.Sprintf("%q would release no idle instance ever: want a positive Go duration such as \"30s\" or \"5m\" (a function that must stay warm sets min_instances)", m.IdleTTL)}
	}
	return nil
}

// requiredKeys are the fields a function's manifest must have (those
// without a default), each as the JSON it had, so that one left out is
// told apart from one given a bad value (abi: "required, missing", not
// "is 0").
type requiredKeys struct {
	Name          json.RawMessage `json:"name"`
	ABI           json.RawMessage `json:"abi"`
	Target        json.RawMessage `json:"target"`
	Library       json.RawMessage `json:"library"`
	MaxInputBytes json.RawMessage `json:"max_input_bytes"`
	OutBytes      json.RawMessage `json:"out_bytes"`
	Chain         json.RawMessage `json:"chain"`
}

// missing is the set of requiredKeys' fields the manifest had no key (or
// null) for.
func (k *requiredKeys) missing() map[string]bool {
	missing := map[string]bool{}
	for f, raw := range map[string]json.RawMessage{
		"name": k.Name, "abi": k.ABI, "target": k.Target, "library": k.Library,
		"max_input_bytes": k.MaxInputBytes, "out_bytes": k.OutBytes, "chain": k.Chain,
	} {
		if len(raw) == 0 || string(raw) == "null" {
			missing[f] = true
		}
	}
	return missing
}

// missingField is the error of a required field the manifest left out;
// want says what it holds.
func missingField(field, want string) *FieldError {
	return &FieldError{field, "required, missing: " + want}
}

// durationLengths refuses a duration longer than MaxDurationLen.
func (m *Manifest) durationLengths() *FieldError {
	ds := [][2]string{{"idle_ttl", m.IdleTTL}}
	if m.Batch != nil {
		ds = append(ds, [2]string{"batch.max_delay", m.Batch.MaxDelay})
	}
	for _, d := range ds {
		if len(d[1]) > MaxDurationLen {
			return &FieldError{d[0], fmt.Sprintf("is %d bytes long, at most %d: a Go duration such as \"200us\"", len(d[1]), MaxDurationLen)}
		}
	}
	return nil
}

// Validate checks every field and returns the first problem as *FieldError.
func (m *Manifest) Validate() error { return m.validate(func(string) bool { return false }) }

// validate is Validate where missing says which required fields the
// manifest's JSON left out (a parsed manifest's), told as missing rather
// than by their zero value.
func (m *Manifest) validate(missing func(field string) bool) error {
	switch m.Kind {
	case KindPipeline:
		return m.validatePipeline(missing)
	case "", KindFunction:
	default:
		return &FieldError{"kind", fmt.Sprintf("%q must be %q (the default) or %q", m.Kind, KindFunction, KindPipeline)}
	}
	switch {
	case m.Steps != nil:
		return &FieldError{"steps", "only a pipeline (\"kind\": \"pipeline\") has steps; a function has a chain"}
	case missing("name"):
		return missingField("name", "the function's name, [a-z0-9][a-z0-9-]{0,62}")
	case !ValidName(m.Name):
		return &FieldError{"name", fmt.Sprintf("%q must match [a-z0-9][a-z0-9-]{0,62}", m.Name)}
	case missing("abi"):
		return missingField("abi", fmt.Sprintf("%d (or 1 for a library built against the ABI 1 header), the major version the library was built for", Major))
	case m.ABI != 1 && m.ABI != Major:
		return &FieldError{"abi", fmt.Sprintf("is %d, this runtime speaks ABI %d (and loads ABI 1 bundles): the major version the library was built for", m.ABI, Major)}
	case missing("target"):
		return missingField("target", orList(quoted(Targets())))
	case !isTarget(m.Target):
		return &FieldError{"target", fmt.Sprintf("%q must be %s", m.Target, orList(quoted(Targets())))}
	case missing("library"):
		return missingField("library", "the .so file name in the bundle")
	case !fileClass.match(m.Library) || !strings.HasSuffix(m.Library, ".so"):
		return &FieldError{"library", fmt.Sprintf("%q must be a plain file name ending in .so", m.Library)}
	case m.Constants != "" && !fileClass.match(m.Constants):
		return &FieldError{"constants", fmt.Sprintf("%q must be a plain file name", m.Constants)}
	case m.Constants == m.Library || m.Constants == ManifestFile || m.Library == ManifestFile:
		return &FieldError{"constants", "library, constants and plover.json must be three different files"}
	case missing("max_input_bytes"):
		return missingField("max_input_bytes", fmt.Sprintf("the largest input in bytes, 1..%d", MaxBufferBytes))
	case m.MaxInputBytes <= 0 || m.MaxInputBytes > MaxBufferBytes:
		return &FieldError{"max_input_bytes", fmt.Sprintf("%d must be in 1..%d", m.MaxInputBytes, MaxBufferBytes)}
	case m.TmpBytes < 0 || m.TmpBytes > MaxBufferBytes:
		return &FieldError{"tmp_bytes", fmt.Sprintf("%d must be in 0..%d", m.TmpBytes, MaxBufferBytes)}
	case missing("out_bytes"):
		return missingField("out_bytes", fmt.Sprintf("the size of out in bytes, 1..%d", MaxBufferBytes))
	case m.OutBytes <= 0 || m.OutBytes > MaxBufferBytes:
		return &FieldError{"out_bytes", fmt.Sprintf("%d must be in 1..%d", m.OutBytes, MaxBufferBytes)}
	case m.ZeroTmp && m.TmpBytes == 0:
		return &FieldError{"zero_tmp", "is set but tmp_bytes is 0"}
	case m.MaxInstances < 0 || m.MaxInstances > MaxInstances:
		return &FieldError{"max_instances", fmt.Sprintf("%d must be in 0..%d", m.MaxInstances, MaxInstances)}
	case m.MinInstances < 0 || m.MinInstances > MaxInstances:
		return &FieldError{"min_instances", fmt.Sprintf("%d must be in 0..%d", m.MinInstances, MaxInstances)}
	case m.MaxInstances > 0 && m.MinInstances > m.MaxInstances:
		return &FieldError{"min_instances", fmt.Sprintf("%d is over max_instances %d", m.MinInstances, m.MaxInstances)}
	case m.MaxQueue < 0 || m.MaxQueue > MaxQueue:
		return &FieldError{"max_queue", fmt.Sprintf("%d must be in 0..%d", m.MaxQueue, MaxQueue)}
	case m.GPUShare < 0 || m.GPUShare > 100:
		return &FieldError{"gpu_share", fmt.Sprintf("%d must be in 1..100 (or 0: no limit)", m.GPUShare)}
	case m.Share != 0 && !(m.Share >= 0.01 && m.Share <= 1000):
		return &FieldError{"share", fmt.Sprintf("%v must be a weight in 0.01..1000 (or 0: the default, 1)", m.Share)}
	case !slices.Contains(Priorities, m.Priority) && m.Priority != "":
		return &FieldError{"priority", fmt.Sprintf("%q must be one of %s", m.Priority, strings.Join(Priorities, ", "))}
	case m.MaxHostMemoryMB < 0 || m.MaxHostMemoryMB > 1<<24:
		return &FieldError{"max_host_memory_mb", fmt.Sprintf("%d must be in 0..%d", m.MaxHostMemoryMB, 1<<24)}
	}
	if m.IdleTTL != "" {
		// 0 passes here for a version stored before deploys refused it
		// (idleTTLAdmitted); none was ever stored negative.
		if d, err := time.ParseDuration(m.IdleTTL); err != nil || d < 0 {
			return &FieldError{"idle_ttl", fmt.Sprintf("%q must be a positive Go duration such as \"30s\" or \"5m\"", m.IdleTTL)}
		}
	}
	if err := m.Build.validate(); err != nil {
		return err
	}
	if err := m.Tensors.validate(); err != nil {
		return err
	}
	if err := m.Batch.validate(m); err != nil {
		return err
	}
	if missing("chain") {
		return missingField("chain", `the entries to run, [{"kernel": ..., "grid": ..., "block": ...}]`)
	}
	return ValidateChain("chain", m.Chain)
}

var (
	relPathRE = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9_.+-]*(/[A-Za-z0-9_][A-Za-z0-9_.+-]*)*$`)
)

func (b *Build) validate() error {
	if b == nil {
		return nil
	}
	if len(b.Sources) == 0 {
		return &FieldError{"build.sources", "must list at least one source file"}
	}
	for i, s := range b.Sources {
		if !relPathRE.MatchString(s) || strings.Contains(s, "..") {
			return &FieldError{fmt.Sprintf("build.sources[%d]", i), fmt.Sprintf("%q must be a relative path inside the function directory", s)}
		}
	}
	for i, s := range b.Include {
		if !relPathRE.MatchString(s) || strings.Contains(s, "..") {
			return &FieldError{fmt.Sprintf("build.include[%d]", i), fmt.Sprintf("%q must be a relative path inside the function directory", s)}
		}
	}
	return checkBuildTargets(b)
}

// ValidateChain checks a chain's shape (not whether its symbols exist).
func ValidateChain(field string, chain []Launch) error {
	if len(chain) == 0 {
		return &FieldError{field, "must name at least one kernel"}
	}
	if len(chain) > MaxChainLength {
		return &FieldError{field, fmt.Sprintf("has %d kernels, at most %d allowed", len(chain), MaxChainLength)}
	}
	for i, l := range chain {
		f := fmt.Sprintf("%s[%d]", field, i)
		switch {
		case !ValidSymbol(l.Kernel):
			return &FieldError{f + ".kernel", fmt.Sprintf("%q is not a C identifier", l.Kernel)}
		case strings.HasPrefix(l.Kernel, ReservedPrefix):
			return &FieldError{f + ".kernel", fmt.Sprintf("%q: the %s prefix is reserved for the ABI", l.Kernel, ReservedPrefix)}
		case l.Grid < 1 || l.Grid > MaxGrid:
			return &FieldError{f + ".grid", fmt.Sprintf("%d must be in 1..%d", l.Grid, MaxGrid)}
		case l.Block < 1 || l.Block > MaxBlock:
			return &FieldError{f + ".block", fmt.Sprintf("%d must be in 1..%d", l.Block, MaxBlock)}
		}
	}
	return nil
}

// Kernels lists the distinct entry points a chain uses, in first-use order.
func Kernels(chain []Launch) []string {
	seen := make(map[string]bool, len(chain))
	var out []string
	for _, l := range chain {
		if !seen[l.Kernel] {
			seen[l.Kernel] = true
			out = append(out, l.Kernel)
		}
	}
	return out
}

// AsFieldError unwraps err to a *FieldError if it holds one.
func AsFieldError(err error) (*FieldError, bool) {
	var fe *FieldError
	ok := errors.As(err, &fe)
	return fe, ok
}
