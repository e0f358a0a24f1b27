package cli

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"

	"github.com/plover-run/plover/fileutil"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/bundle"
)

// buildTargets turns --target into the targets to build: one, plover.json's
// (""), or every registered target ("all").
func buildTargets(flagValue, manifestTarget string) ([]string, bool) {
	switch _, ok := abi.TargetOf(flagValue); {
	case flagValue == "":
		return []string{manifestTarget}, true
	case ok:
		return []string{flagValue}, true
	case flagValue == "all":
		return abi.Targets(), true
	}
	return nil, false
}

func buildCmd() *command {
	var target, out string
	var asJSON bool
	known := abi.Targets()
	dirs := make([]string, len(known))
	for i, t := range known {
		dirs[i] = BuildDir + "/" + t
	}
	return &command{
		nargs: 1,
		name:  "build", summary: "compile a function source directory into bundle directories (" + strings.Join(dirs, ", ") + ")",
		usage: "DIR [--target " + strings.Join(known, "|") + "|all] [--out OUT]",
		example: "  plover build saxpy                 # saxpy/build/host (plover.json's target)\n" +
			"  plover build saxpy --target all    # and saxpy/build/cuda, with nvcc\n" +
			"Compilers: $CXX (default g++) for host, $NVCC (default nvcc) for cuda.",
		// $PLOVER_OUT is plover invoke's and run's output file: exported
		// for them, build made a directory of that name, and the next
		// invoke could not write its output there.
		noEnv: []string{"out"},
		flags: func(fs *flag.FlagSet) {
			fs.StringVar(&target, "target", "", strings.Join(known, ", ")+" or all (default: plover.json's target)")
			fs.StringVar(&out, "out", "", "put the bundles in OUT/<target> (default DIR/"+BuildDir+"); not read from $PLOVER_OUT, which is plover invoke's and run's output file")
			fs.BoolVar(&asJSON, "json", false, `print {"bundles": [{"target","dir","library","library_bytes","constants","constants_bytes"}]} to stdout (compiler lines stay on stderr)`)
		},
		run: func(_ *flag.FlagSet, args []string, env *Env) error {
			dir := args[0]
			m, err := bundle.ReadManifest(dir)
			if err != nil {
				return err
			}
			if m.Build == nil {
				return fmt.Errorf("%s has no \"build\" section, so plover build does not know the sources: add one, e.g. \"build\": {\"sources\": [\"kernel.cu\"]} (plover init writes it); a directory holding a library built otherwise deploys as it is",
					filepath.Join(dir, abi.ManifestFile))
			}
			targets, ok := buildTargets(target, m.Target)
			if !ok {
				return usagef(env, "build", "--target %q: want %s or all", target, strings.Join(known, ", "))
			}
			if out == "" {
				out = filepath.Join(dir, BuildDir)
			}
			for _, t := range targets {
				if bdir := filepath.Join(out, t); sameFile(bdir, dir) {
					// The bundle's plover.json (no build section) would
					// replace the source's, and its constants copied onto
					// themselves were deleted.
					return usagef(env, "build", "--out %s: the %s bundle would be written to %s, which is the source directory %s: its plover.json would be overwritten; give another --out", out, t, bdir, dir)
				}
			}
			var built []*builtBundle
			for _, t := range targets {
				b, err := buildTarget(dir, out, t, m, env)
				if err != nil {
					return err
				}
				if !asJSON {
					fmt.Fprintf(env.Stdout, "built %s: %s (%s), %s", b.Dir, b.Library, humanBytes(b.LibraryBytes), abi.ManifestFile)
					if b.Constants != "" {
						fmt.Fprintf(env.Stdout, ", %s (%s)", b.Constants, humanBytes(b.ConstantsBytes))
					}
					fmt.Fprintln(env.Stdout)
				}
				built = append(built, b)
			}
			if asJSON {
				return printJSON(env.Stdout, map[string]any{"bundles": built})
			}
			return nil
		},
	}
}

// builtBundle is one bundle plover build made.
type builtBundle struct {
	Target         string `json:"target"`
	Dir            string `json:"dir"`
	Library        string `json:"library"`
	LibraryBytes   int64  `json:"library_bytes"`
	Constants      string `json:"constants,omitempty"`
	ConstantsBytes int64  `json:"constants_bytes,omitempty"`
}

// buildTarget compiles source directory dir for target into out/<target>
// and checks the bundle as plover deploy would.
func buildTarget(dir, out, target string, m *abi.Manifest, env *Env) (*builtBundle, error) {
	for i, s := range m.Build.Sources {
		if _, err := os.Stat(filepath.Join(dir, s)); err != nil {
			return nil, fmt.Errorf("build.sources[%d]: %w", i, err)
		}
	}
	var constants os.FileInfo
	if m.Constants != "" {
		fi, err := os.Stat(filepath.Join(dir, m.Constants))
		if err != nil {
			return nil, constantsError(dir, m, err)
		}
		constants = fi
	}
	bdir := filepath.Join(out, target)
	if err := os.MkdirAll(bdir, 0o755); err != nil {
		return nil, err
	}
	lib, err := outputPath(dir, filepath.Join(bdir, m.Library))
	if err != nil {
		return nil, err
	}
	t, ok := abi.TargetOf(target)
	if !ok {
		return nil, fmt.Errorf("target %q: want %s", target, strings.Join(abi.Targets(), ", "))
	}
	deps, err := freshDepFile(dir, bdir, m)
	if err != nil {
		return nil, err
	}
	argv, err := t.Command(m.Build, lib, deps)
	if err != nil {
		return nil, err
	}
	fmt.Fprintln(env.Stderr, shellLine(argv))
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Dir = dir
	warnings := &warningCounter{}
	// One writer for both: exec then copies through one pipe, so writes to
	// env.Stderr never race.
	both := io.MultiWriter(env.Stderr, warnings)
	cmd.Stdout, cmd.Stderr = both, both
	err = cmd.Run()
	if n := warnings.count(); n > 0 && err == nil {
		what := "1 compiler warning above; read it"
		if n > 1 {
			what = fmt.Sprintf("%d compiler warnings above; read them", n)
		}
		fmt.Fprintf(env.Stderr, "%s build of %s: %s: a warning is often the bug (a loop that never ends, a value never set)\n", target, dir, what)
	}
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return nil, fmt.Errorf("%s build of %s failed (%s: %v; its messages are above)", target, dir, filepath.Base(argv[0]), ee.ProcessState)
		}
		return nil, fmt.Errorf("%s build: %w", target, err)
	}
	// The bundle's manifest: the target set, the build section dropped (the
	// bundle holds no sources).
	bm := *m
	bm.Target, bm.Build = target, nil
	mb, err := manifestJSON(&bm)
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(bdir, abi.ManifestFile), mb, 0o644); err != nil {
		return nil, err
	}
	if constants != nil {
		if err := fileutil.LinkOrCopy(filepath.Join(dir, m.Constants), filepath.Join(bdir, m.Constants)); err != nil {
			return nil, fmt.Errorf("constants: %w", err)
		}
	}
	if _, err := checkDir(bdir); err != nil {
		return nil, fmt.Errorf("the built bundle %s fails deploy's check: %w", bdir, err)
	}
	fi, err := os.Stat(filepath.Join(bdir, m.Library))
	if err != nil {
		return nil, err
	}
	b := &builtBundle{Target: target, Dir: bdir, Library: m.Library, LibraryBytes: fi.Size()}
	if constants != nil {
		b.Constants, b.ConstantsBytes = m.Constants, constants.Size()
	}
	return b, nil
}

// sameFile reports whether a and b are one file or directory, however
// named (a relative path, .., a symbolic link); false where either is not
// there.
func sameFile(a, b string) bool {
	ai, err := os.Stat(a)
	if err != nil {
		return false
	}
	bi, err := os.Stat(b)
	return err == nil && os.SameFile(ai, bi)
}

// outputPath is path as the compiler, run in dir, should see it: relative
// when it lies inside dir (so the printed command line stays short).
func outputPath(dir, path string) (string, error) {
	absDir, err := filepath.Abs(dir)
	if err != nil {
		return "", err
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return "", err
	}
	if rel, err := filepath.Rel(absDir, abs); err == nil && rel != ".." && !strings.HasPrefix(rel, ".."+string(filepath.Separator)) {
		return rel, nil
	}
	return abs, nil
}

// warningCounter counts the compiler's warnings in what it writes: every
// line of g++'s "file:line:col: warning: ..." (the same line for each
// expansion of a macro that warns, so each counts), and each distinct line
// of nvcc's "warning #" (its front end, which says its own again for every
// compilation pass), "nvcc warning : " and "ptxas warning : " (ptxas runs
// once per cuda_arch) once.
type warningCounter struct {
	n       int
	seen    map[string]bool // nvcc's lines
	partial []byte          // the line being written
}

func (w *warningCounter) Write(p []byte) (int, error) {
	w.partial = append(w.partial, p...)
	for {
		i := bytes.IndexByte(w.partial, '\n')
		if i < 0 {
			break
		}
		w.line(w.partial[:i])
		w.partial = w.partial[i+1:]
	}
	return len(p), nil
}

// warningRE is a warning in any of the forms warningCounter counts: not
// the word in prose ("warnings"), which no colon or # follows.
var warningRE = regexp.MustCompile(`warning\s*[:#]`)

func (w *warningCounter) line(l []byte) {
	at := warningRE.Find(l)
	switch {
	case at == nil:
	case string(at) == "warning:":
		w.n++
	default:
		if w.seen == nil {
			w.seen = map[string]bool{}
		}
		if k := string(bytes.TrimSpace(l)); !w.seen[k] {
			w.seen[k] = true
			w.n++
		}
	}
}

func (w *warningCounter) count() int {
	if len(w.partial) > 0 {
		w.line(w.partial)
		w.partial = nil
	}
	return w.n
}
