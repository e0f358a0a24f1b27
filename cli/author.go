package cli

// The function author's loop: plover init writes a function source
// directory, plover build compiles it into bundle directories (build/host,
// build/cuda), plover run runs one in a worker process on the CPU, and
// plover deploy (in deploy.go) deploys the built bundle of a source
// directory.

import (
	"bytes"
	"embed"
	"encoding/binary"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"strings"
	"text/template"
	"time"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/bundle"
)

//go:embed scaffold
var scaffold embed.FS

// BuildDir is where plover build puts a source directory's bundles, one
// directory per target (build/host, build/cuda), and where plover run and
// plover deploy look for them.
const BuildDir = "build"

// usagef prints a command-line mistake the flag package cannot see and
// returns it as a usage error (exit status 2).
func usagef(env *Env, cmd, format string, a ...any) error {
	msg := fmt.Sprintf(format, a...)
	fmt.Fprintf(env.Stderr, "plover %s: %s (see plover %s --help)\n", cmd, msg, cmd)
	return &usageError{msg}
}

// initSpec is what plover init's templates are filled with.
type initSpec struct {
	Name      string // the function name (manifest "name")
	Symbol    string // the entry point: NAME_entry (see newInitSpec)
	Kernel    string // the __global__ function
	Source    string // NAME.cu
	Library   string // NAME.so
	Constants string // constants.bin
}

// Sizes of the function plover init writes: up to 16384 float32s (64 KiB)
// in and out, room for gen_input.py's 1000 and more. Larger buffers cost
// every request: a 4 MiB out zeroed per request once took 55 µs against
// the kernel's 1.4 µs. The kernel writes every byte it returns, so out is
// not zeroed either (zero_out false); the README.txt written says both.
const initMaxFloats = 1 << 14

func newInitSpec(name string) (*initSpec, error) {
	if !abi.ValidName(name) {
		return nil, fmt.Errorf("function name %q must match [a-z0-9][a-z0-9-]{0,62} (lower case, digits and dashes)", name)
	}
	base := strings.ReplaceAll(name, "-", "_")
	// The entry is NAME_entry, never NAME: a function is often named for a
	// word the headers plover_kernel.h includes already declare (printf,
	// read, min, dim3, y0, std, ...), and an entry so named fails to
	// compile, or worse, an exported "free" stands in for libc's. No list
	// of such words kept here could be whole; no header declares a lower
	// case name ending in _entry or _kernel (TestInitSymbolsNoHeaderDeclares
	// checks), so the suffix cannot collide. A C identifier cannot start
	// with a digit, and plover_ is the ABI's: fn_ goes before those.
	if base[0] >= '0' && base[0] <= '9' || strings.HasPrefix(base+"_", abi.ReservedPrefix) {
		base = "fn_" + base
	}
	return &initSpec{Name: name, Symbol: base + "_entry", Kernel: base + "_kernel", Source: name + ".cu",
		Library: name + ".so", Constants: "constants.bin"}, nil
}

// manifest is the plover.json plover init writes.
func (s *initSpec) manifest() *abi.Manifest {
	return &abi.Manifest{
		Name: s.Name, ABI: abi.Major, Target: abi.TargetHost, Library: s.Library, Constants: s.Constants,
		MaxInputBytes: 4 * initMaxFloats, OutBytes: 4 * initMaxFloats, ZeroOut: new(bool),
		Chain: []abi.Launch{{Kernel: s.Symbol, Grid: 1, Block: 256}},
		Build: &abi.Build{Sources: []string{s.Source}, Include: []string{"include"}, CUDAArch: []string{"80", "90"}},
	}
}

// files returns every file plover init writes, by path in the new directory.
func (s *initSpec) files() (map[string][]byte, error) {
	files := map[string][]byte{}
	m, err := manifestJSON(s.manifest())
	if err != nil {
		return nil, err
	}
	files[abi.ManifestFile] = m
	var ab bytes.Buffer // a = 2, b = 1: y = 2x + 1
	for _, v := range []float32{2, 1} {
		binary.Write(&ab, binary.LittleEndian, math.Float32bits(v))
	}
	files[s.Constants] = ab.Bytes()
	for _, h := range abi.HeaderFiles {
		b, err := abi.Headers.ReadFile(h)
		if err != nil {
			return nil, err
		}
		files["include/"+h] = b
	}
	templates := map[string]string{
		"kernel.cu.tmpl": s.Source, "Makefile.tmpl": "Makefile", "README.txt.tmpl": "README.txt",
		"gitignore.tmpl": ".gitignore", "gen_input.py": "gen_input.py",
	}
	for tmpl, name := range templates {
		src, err := scaffold.ReadFile("scaffold/" + tmpl)
		if err != nil {
			return nil, err
		}
		if !strings.HasSuffix(tmpl, ".tmpl") {
			files[name] = src
			continue
		}
		t, err := template.New(tmpl).Option("missingkey=error").Parse(string(src))
		if err != nil {
			return nil, err
		}
		var b bytes.Buffer
		if err := t.Execute(&b, s); err != nil {
			return nil, err
		}
		files[name] = b.Bytes()
	}
	return files, nil
}

func initCmd() *command {
	var dir string
	var asJSON bool
	return &command{
		nargs: 1,
		name:  "init", summary: "create a function source directory: kernel, plover.json, headers, Makefile",
		usage: "NAME [--dir DIR]",
		example: "  plover init saxpy && cd saxpy && python3 gen_input.py input.bin 1000\n" +
			"  plover build . && plover run . --in input.bin --out output.bin",
		flags: func(fs *flag.FlagSet) {
			fs.StringVar(&dir, "dir", "", "directory to create (default ./NAME); an existing one must be empty")
			fs.BoolVar(&asJSON, "json", false, `print {"dir","name","entry","source","constants"} instead of the next steps`)
		},
		run: func(_ *flag.FlagSet, args []string, env *Env) error {
			spec, err := newInitSpec(args[0])
			if err != nil {
				// NAME is the command line's: one that is no function's
				// name cannot run, as for plover invoke (exit 2).
				return usagef(env, "init", "%v", err)
			}
			if dir == "" {
				dir = args[0]
			}
			if strings.HasPrefix(dir, "~") {
				// The shell expands ~ only at a word's start: --dir=~/x
				// came as it is, and made a directory named ~ here.
				return usagef(env, "init", "--dir %q: the shell did not expand its ~ (it does not after --dir=): write --dir ~/... with a space, or $HOME/...", dir)
			}
			if err := writeInit(dir, spec); err != nil {
				return err
			}
			shown := dir
			if abs, err := filepath.Abs(dir); err == nil {
				shown = abs
			}
			if asJSON {
				return printJSON(env.Stdout, map[string]string{"dir": dir, "name": spec.Name, "entry": spec.Symbol, "source": spec.Source, "constants": spec.Constants})
			}
			fmt.Fprintf(env.Stdout, "created %s: %s (entry %s), plover.json, %s, include/, Makefile, gen_input.py, README.txt\n\n",
				shown, spec.Source, spec.Symbol, spec.Constants)
			fmt.Fprintf(env.Stdout, "Next:\n  cd %s\n", shellQuote(dir))
			fmt.Fprintf(env.Stdout, "  python3 gen_input.py input.bin 1000           # 1000 float32s\n")
			fmt.Fprintf(env.Stdout, "  plover build .                                # -> build/host/ (--target cuda|all)\n")
			fmt.Fprintf(env.Stdout, "  plover run . --in input.bin --out output.bin  # here, on the CPU, no server\n")
			fmt.Fprintf(env.Stdout, "  plover deploy .                               # to $PLOVER_SERVER or %s\n", DefaultServer)
			fmt.Fprintf(env.Stdout, "  plover invoke %s --in input.bin --out output.bin\n", spec.Name)
			return nil
		},
	}
}

// writeInit creates dir (or fills it when it exists and is empty) with
// spec's files.
func writeInit(dir string, spec *initSpec) error {
	files, err := spec.files()
	if err != nil {
		return err
	}
	switch ents, err := os.ReadDir(dir); {
	case err == nil && len(ents) > 0:
		return fmt.Errorf("%s exists and is not empty: pick another NAME or --dir", dir)
	case err != nil && !errors.Is(err, fs.ErrNotExist):
		return err
	}
	if err := os.MkdirAll(filepath.Join(dir, "include"), 0o755); err != nil {
		if link, to, ok := danglingLink(dir); ok {
			where := ""
			if link != filepath.Clean(dir) {
				where = dir + ": "
			}
			return fmt.Errorf("%s%s is a dangling symbolic link (to %s, which does not exist): remove the link, or create what it points to", where, link, to)
		}
		return err
	}
	for name, b := range files {
		mode := os.FileMode(0o644)
		if strings.HasSuffix(name, ".py") {
			mode = 0o755
		}
		if err := os.WriteFile(filepath.Join(dir, name), b, mode); err != nil {
			return err
		}
	}
	return nil
}

// danglingLink finds the symbolic link to nothing on the way to path (path
// itself included), which mkdir answers only with "file exists".
func danglingLink(path string) (link, to string, ok bool) {
	for p := filepath.Clean(path); ; p = filepath.Dir(p) {
		if fi, err := os.Lstat(p); err == nil && fi.Mode()&fs.ModeSymlink != 0 {
			if _, err := os.Stat(p); errors.Is(err, fs.ErrNotExist) {
				to, _ := os.Readlink(p)
				return p, to, true
			}
		}
		if parent := filepath.Dir(p); parent == p {
			return "", "", false
		}
	}
}

// resolveBundle says which bundle directory plover run and plover deploy act
// on for dir. A directory whose plover.json has no build section is a bundle
// as it stands. A function source directory (one with a build section) means
// its built bundle dir/build/<target>, target being the manifest's when "";
// a source directory without that build but with its library built in place
// is taken as a bundle too. A built bundle named directly, <src>/build/<target>,
// is rebuilt first when its sources changed. An unreadable manifest returns
// dir, for the caller's check to report.
func resolveBundle(dir, target string, env *Env) (string, error) {
	m, err := bundle.ReadManifest(dir)
	if err != nil {
		return dir, nil
	}
	// A built bundle named directly (build/host) is checked against the
	// sources above it: plover build's, whose manifest has no build
	// section, and the generated Makefile's, whose manifest is the source
	// plover.json with its target set, build section and all. A bundle of
	// another target than asked for is left to the caller to refuse.
	if src, sm := sourceOf(dir, m.Target); sm != nil {
		if target != "" && target != m.Target {
			return dir, nil
		}
		return dir, rebuildIfStale(src, sm, dir, m.Target, env)
	}
	if m.Build == nil {
		return dir, nil
	}
	if target == "" {
		target = m.Target
	}
	built := filepath.Join(dir, BuildDir, target)
	if _, err := os.Stat(filepath.Join(built, abi.ManifestFile)); err != nil {
		if _, err := os.Stat(filepath.Join(dir, m.Library)); err == nil {
			return dir, nil
		}
		flag := ""
		if target != m.Target {
			flag = " --target " + target
		}
		return "", fmt.Errorf("%s is a function source directory (its plover.json has a build section) with no %s bundle in %s: run `plover build %s%s` first",
			dir, target, built, shellQuote(dir), flag)
	}
	if err := rebuildIfStale(dir, m, built, target, env); err != nil {
		return "", err
	}
	return built, nil
}

// sourceOf returns the function source directory that built dir, a bundle
// for target (dir is <src>/build/<target> and <src>/plover.json has a
// build section), and its manifest; nil for any other directory.
func sourceOf(dir, target string) (string, *abi.Manifest) {
	abs, err := filepath.Abs(dir) // "." inside build/host too
	if err != nil || filepath.Base(abs) != target || filepath.Base(filepath.Dir(abs)) != BuildDir {
		return "", nil
	}
	src := filepath.Dir(filepath.Dir(abs))
	if wd, err := os.Getwd(); err == nil && !filepath.IsAbs(dir) {
		if rel, err := filepath.Rel(wd, src); err == nil {
			src = rel // messages name it as the author did, relative
		}
	}
	m, err := bundle.ReadManifest(src)
	if err != nil || m.Build == nil {
		return "", nil
	}
	return src, m
}

// editableManifest is the manifest an author edits for bundle dir (for
// target): its source directory's when dir is <src>/build/<target>, the
// built copy being rewritten by every build; else dir's own.
func editableManifest(dir, target string) string {
	if src, sm := sourceOf(dir, target); sm != nil {
		return filepath.Join(src, abi.ManifestFile)
	}
	return filepath.Join(dir, abi.ManifestFile)
}

// rebuildIfStale rebuilds target of source directory src (manifest m) into
// built when a source is newer than it: a build older than its sources is
// never used, since its bytes are not the function the author now has (a
// deploy would even call them unchanged).
func rebuildIfStale(src string, m *abi.Manifest, built, target string, env *Env) error {
	stale := staleSources(src, m, built)
	if stale == "" {
		return nil
	}
	fmt.Fprintf(env.Stderr, "%s changed after %s was built: rebuilding it (plover build %s)\n", stale, built, shellQuote(src))
	if _, err := buildTarget(src, filepath.Join(src, BuildDir), target, m, env); err != nil {
		return fmt.Errorf("%s changed after %s was built, and rebuilding it failed: %w", stale, built, err)
	}
	// Still newer than what was just built: its time is in the future (a
	// skewed clock, touch -d). Say so once rather than rebuild on every
	// command.
	if still := staleSources(src, m, built); still != "" {
		fmt.Fprintf(env.Stderr, "warning: %s has a modification time after now; %s was rebuilt from it anyway\n", still, built)
	}
	return nil
}

// staleSources names a file of source directory dir newer than the library
// of its build in built, or "": the manifest, the constants, a source, or a
// header the build read. Every file under build.include counts
// (staleIncludes); past those, which headers the build read the compiler
// said, in the dependency file plover build has it write (depFile), and a
// build without one is checked against the files that could be headers
// (staleUnder).
func staleSources(dir string, m *abi.Manifest, built string) string {
	lib, err := os.Stat(filepath.Join(built, m.Library))
	if err != nil {
		return ""
	}
	since := lib.ModTime()
	names := append([]string{abi.ManifestFile}, m.Build.Sources...)
	if m.Constants != "" {
		names = append(names, m.Constants)
	}
	for _, n := range names {
		if p := filepath.Join(dir, n); newerThan(p, since) {
			return p
		}
	}
	// Every file under build.include, whatever the compiler's list says:
	// a list an earlier plover build wrote outlives a Makefile build after
	// it (which writes none), and would vouch for headers added since.
	if p := staleIncludes(dir, m, since); p != "" {
		return p
	}
	// Only a build of one source writes a list (depFlags; the Makefile
	// likewise): one of several sources found beside the library is an
	// earlier one-source build's, and vouched for headers the sources
	// added since include.
	if name := depFile(m); name != "" && len(m.Build.Sources) == 1 {
		if deps, ok := readDeps(filepath.Join(built, name)); ok {
			for _, d := range deps {
				if !filepath.IsAbs(d) {
					d = filepath.Join(dir, d) // the compiler ran in dir
				}
				if newerThan(d, since) {
					return d
				}
			}
			return ""
		}
	}
	return staleUnder(dir, m, since)
}

// newerThan reports whether the file at p was modified after t.
func newerThan(p string, t time.Time) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.ModTime().After(t)
}

// shellQuote quotes s for a POSIX shell when it needs it.
func shellQuote(s string) string {
	if s != "" && strings.IndexFunc(s, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("-_./=,:+@%", r))
	}) < 0 {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// shellLine renders argv as a line a POSIX shell runs as the same command.
func shellLine(argv []string) string {
	q := make([]string, len(argv))
	for i, a := range argv {
		q[i] = shellQuote(a)
	}
	return strings.Join(q, " ")
}

// manifestJSON renders m the way people write plover.json: one field per
// line, each chain step on a line of its own, other values on one line.
func manifestJSON(m *abi.Manifest) ([]byte, error) {
	b, err := json.Marshal(m)
	if err != nil {
		return nil, err
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(b, &fields); err != nil {
		return nil, err
	}
	dec := json.NewDecoder(bytes.NewReader(b)) // for the struct's field order
	dec.Token()
	var out bytes.Buffer
	out.WriteString("{")
	for i := 0; dec.More(); i++ {
		tok, err := dec.Token()
		if err != nil {
			return nil, err
		}
		var skip json.RawMessage
		if err := dec.Decode(&skip); err != nil {
			return nil, err
		}
		k := tok.(string)
		if i > 0 {
			out.WriteString(",")
		}
		fmt.Fprintf(&out, "\n  %q: ", k)
		if k == "chain" {
			var steps []json.RawMessage
			json.Unmarshal(fields[k], &steps)
			out.WriteString("[")
			for j, s := range steps {
				if j > 0 {
					out.WriteString(",")
				}
				out.WriteString("\n    ")
				out.Write(spaced(s))
			}
			out.WriteString("\n  ]")
			continue
		}
		out.Write(spaced(fields[k]))
	}
	out.WriteString("\n}\n")
	return out.Bytes(), nil
}

// spaced puts a space after each ':' and ',' outside strings of compact JSON.
func spaced(compact []byte) []byte {
	var b bytes.Buffer
	inStr, esc := false, false
	for _, c := range compact {
		b.WriteByte(c)
		switch {
		case esc:
			esc = false
		case inStr && c == '\\':
			esc = true
		case c == '"':
			inStr = !inStr
		case !inStr && (c == ':' || c == ','):
			b.WriteByte(' ')
		}
	}
	return b.Bytes()
}
