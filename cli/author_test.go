package cli

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/bundle"
	"github.com/plover-run/plover/internal/testkit"
)

func TestAuthorArguments(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "taken"), nil, 0o644)
	tests := []struct {
		args     []string
		terminal bool
		code     int
		want     string // in stdout or stderr (help goes to stdout)
	}{
		{[]string{"init"}, false, 2, "plover init: takes 1 argument(s), got 0"},
		{[]string{"init", "a", "b"}, false, 2, "plover init: takes 1 argument(s), got 2"},
		{[]string{"init", "Bad_Name", "--dir", filepath.Join(dir, "x")}, false, 2, `function name "Bad_Name" must match`},
		{[]string{"init", "ok", "--dir", dir}, false, 1, "exists and is not empty"},
		{[]string{"init", "--help"}, false, 0, "plover init NAME [--dir DIR]"},
		{[]string{"build"}, false, 2, "plover build: takes 1 argument(s), got 0"},
		{[]string{"build", dir, "--bogus"}, false, 2, "unknown flag: --bogus"},
		{[]string{"build", filepath.Join(dir, "none")}, false, 1, "manifest:"},
		{[]string{"run", dir}, false, 2, "--in FILE is required"},
		{[]string{"run", dir, "--in", "x", "--repeat", "0"}, false, 2, "--repeat 0: want 1 or more"},
		{[]string{"run", dir, "--in", "x", "--repeat", "many"}, false, 2, `invalid argument "many" for "--repeat"`},
		{[]string{"run", dir, "--in", "x"}, true, 2, "the output is binary"},
		{[]string{"run", "--in", "x"}, false, 2, "plover run: takes 1 argument(s), got 0"},
		{[]string{"run", filepath.Join(dir, "none"), "--in", filepath.Join(dir, "taken"), "--out", filepath.Join(dir, "o")}, false, 1, "manifest:"},
		{[]string{"run", filepath.Join(dir, "none"), "--in", filepath.Join(dir, "absent")}, false, 1, "--in: open"},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			var out, errb bytes.Buffer
			code := Main(tt.args, &Env{Stdin: strings.NewReader(""), Stdout: &out, Stderr: &errb, StdoutIsTerminal: tt.terminal})
			if code != tt.code || !strings.Contains(out.String()+errb.String(), tt.want) {
				t.Fatalf("exit %d, output %q; want exit %d and %q", code, out.String()+errb.String(), tt.code, tt.want)
			}
		})
	}
}

func TestBuildTargetFlag(t *testing.T) {
	dir := initDir(t, "tflag")
	var out, errb bytes.Buffer
	if code := Main([]string{"build", dir, "--target", "gpu"}, &Env{Stdout: &out, Stderr: &errb}); code != 2 || !strings.Contains(errb.String(), `--target "gpu": want host, cuda or all`) {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	for _, tt := range []struct {
		flag, manifest string
		want           []string
	}{
		{"", "host", []string{"host"}}, {"", "cuda", []string{"cuda"}}, {"cuda", "host", []string{"cuda"}},
		{"all", "cuda", []string{"host", "cuda"}},
	} {
		if got, ok := buildTargets(tt.flag, tt.manifest); !ok || !reflect.DeepEqual(got, tt.want) {
			t.Errorf("buildTargets(%q, %q) = %v, %v; want %v", tt.flag, tt.manifest, got, ok, tt.want)
		}
	}
}

func TestShellLine(t *testing.T) {
	if q := shellLine([]string{"nvcc", "-gencode", "arch=compute_90,code=[sm_90,compute_90]", "a b.cu", "it's"}); q != `nvcc -gencode 'arch=compute_90,code=[sm_90,compute_90]' 'a b.cu' 'it'\''s'` {
		t.Errorf("shellLine: %s", q)
	}
}

// targetFlags are the registered target's fixed compiler flags.
func targetFlags(t *testing.T, name string) []string {
	t.Helper()
	tg, ok := abi.TargetOf(name)
	if !ok {
		t.Fatalf("no target %q", name)
	}
	return tg.Flags
}

// compilerFor skips t unless target's compiler is here (and, for nvcc,
// unless -short: it takes seconds a build).
func compilerFor(t *testing.T, target string) {
	t.Helper()
	tool := map[string]string{abi.TargetHost: "g++", abi.TargetCUDA: "nvcc"}[target]
	if _, err := exec.LookPath(tool); err != nil {
		t.Skipf("%s not found: the %s build is not checked here", tool, target)
	}
	if testing.Short() && target == abi.TargetCUDA {
		t.Skip("-short: nvcc is slow")
	}
}

// initDir runs plover init name in a fresh directory and returns the
// function directory.
func initDir(t *testing.T, name string) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), name)
	if _, stderr, err := runCommand(initCmd(), name, "--dir", dir); err != nil {
		t.Fatalf("init: %v\n%s", err, stderr)
	}
	return dir
}

func TestInit(t *testing.T) {
	for _, tt := range []struct{ name, symbol string }{
		{"saxpy", "saxpy_entry"}, {"my-func-2", "my_func_2_entry"}, {"3d", "fn_3d_entry"}, {"plover-x", "fn_plover_x_entry"},
		{"plover", "fn_plover_entry"}, {"main", "main_entry"}, {"free", "free_entry"}, {"default", "default_entry"}, {"printf", "printf_entry"},
	} {
		spec, err := newInitSpec(tt.name)
		if err != nil || spec.Symbol != tt.symbol || !abi.ValidSymbol(spec.Symbol) {
			t.Errorf("%s: symbol %q, err %v; want %q", tt.name, spec.Symbol, err, tt.symbol)
		}
	}
	// An existing empty directory is filled; the output says what to run.
	dir := t.TempDir()
	out, _, err := runCommand(initCmd(), "my-func", "--dir", dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"plover build .", "plover run . --in input.bin", "plover deploy .", "plover invoke my-func"} {
		if !strings.Contains(out, s) {
			t.Errorf("init's output lacks %q:\n%s", s, out)
		}
	}
	for _, f := range []string{"my-func.cu", "plover.json", "constants.bin", "include/plover.h", "include/plover_kernel.h", "Makefile", "gen_input.py", "README.txt", ".gitignore"} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			t.Errorf("init wrote no %s: %v", f, err)
		}
	}
	for _, h := range abi.HeaderFiles {
		want, _ := abi.Headers.ReadFile(h)
		if got, _ := os.ReadFile(filepath.Join(dir, "include", h)); !bytes.Equal(got, want) {
			t.Errorf("include/%s differs from the embedded header", h)
		}
	}
	f, _ := os.Open(filepath.Join(dir, "plover.json"))
	defer f.Close()
	m, err := abi.ParseManifest(f)
	if err != nil {
		t.Fatal(err)
	}
	if m.ABI != abi.Major || m.Target != "host" || m.Library != "my-func.so" || m.Chain[0].Kernel != "my_func_entry" ||
		m.Build == nil || !reflect.DeepEqual(m.Build.Sources, []string{"my-func.cu"}) {
		t.Fatalf("manifest %+v build %+v", m, m.Build)
	}
	// Buffers sized for the example, and out not zeroed since the kernel
	// writes every byte it returns; README.txt and the source say so
	// (issue 37, item 11). plover run runs in a worker, not "in this
	// process" (item 12).
	if m.MaxInputBytes != 64<<10 || m.OutBytes != 64<<10 || m.ZeroesOut() || m.TmpBytes != 0 {
		t.Errorf("sizes: max_input_bytes %d, out_bytes %d, zero_out %v, tmp_bytes %d; want 64 KiB, 64 KiB, false, 0", m.MaxInputBytes, m.OutBytes, m.ZeroesOut(), m.TmpBytes)
	}
	readme, _ := os.ReadFile(filepath.Join(dir, "README.txt"))
	for _, tt := range []struct {
		file, text string
		want       bool
	}{
		{"README.txt", "in a worker process on the CPU", true},
		{"README.txt", "in this process", false},
		{"README.txt", `"zero_out": false`, true},
		{"README.txt", "55 us against 1.4 us", true},
		{"my-func.cu", `"zero_out": false`, true},
	} {
		b := readme
		if tt.file != "README.txt" {
			b, _ = os.ReadFile(filepath.Join(dir, tt.file))
		}
		if bytes.Contains(b, []byte(tt.text)) != tt.want {
			t.Errorf("%s: contains %q is %v, want %v", tt.file, tt.text, !tt.want, tt.want)
		}
	}
	src, _ := os.ReadFile(filepath.Join(dir, "my-func.cu"))
	for _, s := range []string{`#include "plover_kernel.h"`, "PLOVER_BUNDLE(PLOVER_TARGET);", "PLOVER_ENTRY(my_func_entry)", "PLOVER_LAUNCH(my_func_kernel,", "ENTRIES ARE HOST CODE"} {
		if !bytes.Contains(src, []byte(s)) {
			t.Errorf("the kernel source lacks %q", s)
		}
	}
	// The Makefile builds as plover build does, warnings on (issue 37,
	// item 7).
	mk, _ := os.ReadFile(filepath.Join(dir, "Makefile"))
	for _, s := range []string{strings.Join(targetFlags(t, abi.TargetHost), " ") + " -Iinclude", strings.Join(targetFlags(t, abi.TargetCUDA), " ") + " -Iinclude",
		"-gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=[sm_90,compute_90]", "g++-11", "PTX"} {
		if !bytes.Contains(mk, []byte(s)) {
			t.Errorf("the Makefile lacks %q", s)
		}
	}
	consts, _ := os.ReadFile(filepath.Join(dir, "constants.bin"))
	if len(consts) != 8 || math.Float32frombits(binary.LittleEndian.Uint32(consts)) != 2 || math.Float32frombits(binary.LittleEndian.Uint32(consts[4:])) != 1 {
		t.Fatalf("constants %x, want float32 2 and 1", consts)
	}
	// Now it is not empty.
	if _, _, err := runCommand(initCmd(), "other", "--dir", dir); err == nil || !strings.Contains(err.Error(), "not empty") {
		t.Fatalf("init into a non-empty directory: %v", err)
	}
}

func TestManifestJSON(t *testing.T) {
	spec, _ := newInitSpec("fmt")
	m := spec.manifest()
	yes := true
	m.ZeroOut, m.IdleTTL, m.Chain = &yes, "30s", append(m.Chain, abi.Launch{Kernel: "second", Grid: 2, Block: 32})
	b, err := manifestJSON(m)
	if err != nil {
		t.Fatal(err)
	}
	back, err := abi.ParseManifest(bytes.NewReader(b))
	if err != nil {
		t.Fatalf("%v\n%s", err, b)
	}
	if !reflect.DeepEqual(back, m) {
		t.Fatalf("round trip:\n%+v\n%+v", back, m)
	}
	if !bytes.Contains(b, []byte("\n    {\"kernel\": \"second\", \"grid\": 2, \"block\": 32}\n  ]")) {
		t.Fatalf("layout:\n%s", b)
	}
}

func TestResolveBundle(t *testing.T) {
	var errb bytes.Buffer
	env := &Env{Stderr: &errb}
	// A bundle without a build section is itself.
	plain := testkit.BundleDir(t, testkit.Manifest("plain"), nil)
	if got, err := resolveBundle(plain, "", env); err != nil || got != plain {
		t.Fatalf("plain bundle: %q, %v", got, err)
	}
	// A source directory not built yet names the command to run.
	src := initDir(t, "src")
	if _, err := resolveBundle(src, "", env); err == nil || !strings.Contains(err.Error(), "run `plover build "+src+"` first") {
		t.Fatalf("unbuilt: %v", err)
	}
	if _, err := resolveBundle(src, "cuda", env); err == nil || !strings.Contains(err.Error(), "--target cuda` first") {
		t.Fatalf("unbuilt cuda: %v", err)
	}
	// Built: its build/<target>, with no warning until a source changes.
	built := filepath.Join(src, "build", "host")
	os.MkdirAll(built, 0o755)
	os.WriteFile(filepath.Join(built, "plover.json"), []byte("{}"), 0o644)
	os.WriteFile(filepath.Join(built, "src.so"), nil, 0o644)
	old := mustStat(t, filepath.Join(src, "src.cu")).ModTime()
	for _, f := range []string{"src.cu", "plover.json", "constants.bin", "include/plover.h", "include/plover_kernel.h"} { // all in the past
		os.Chtimes(filepath.Join(src, f), old, old.Add(-3e9))
	}
	os.Chtimes(filepath.Join(built, "src.so"), old, old.Add(-2e9))
	if got, err := resolveBundle(src, "", env); err != nil || got != built || errb.Len() != 0 {
		t.Fatalf("built: %q, %v, stderr %q", got, err, errb.String())
	}
	// A source newer than the build: rebuilt before it is used.
	os.Chtimes(filepath.Join(src, "src.cu"), old, old.Add(-1e9))
	if got, err := resolveBundle(src, "host", env); err != nil || got != built || !strings.Contains(errb.String(), "src.cu changed after") || !strings.Contains(errb.String(), "rebuilding") {
		t.Fatalf("stale: %q, %v, stderr %q", got, err, errb.String())
	}
	if staleSources(src, mustManifest(t, src), built) != "" {
		t.Fatal("still stale after the rebuild")
	}
	// An edited header is a change too.
	os.Chtimes(filepath.Join(src, "include", "plover.h"), old, time.Now().Add(-500*time.Millisecond))
	os.Chtimes(filepath.Join(src, "src.cu"), old, old.Add(-3e9))
	os.Chtimes(filepath.Join(built, "src.so"), old, old.Add(-2e9))
	if staleSources(src, mustManifest(t, src), built) != filepath.Join(src, "include", "plover.h") {
		t.Fatal("an edited header does not make the build stale")
	}
	os.Chtimes(filepath.Join(src, "include", "plover.h"), old, old.Add(-3e9))
	// The build directory named itself (plover deploy build/host, as the
	// generated Makefile has it) is checked against its sources as well.
	if m := mustManifest(t, built); m.Build != nil {
		t.Fatal("the built manifest has a build section")
	}
	errb.Reset()
	if got, err := resolveBundle(built, "", env); err != nil || got != built || errb.Len() != 0 {
		t.Fatalf("build dir, fresh: %q, %v, stderr %q", got, err, errb.String())
	}
	os.Chtimes(filepath.Join(src, "src.cu"), old, old.Add(-1e9))
	if got, err := resolveBundle(built+"/", "", env); err != nil || got != built+"/" || !strings.Contains(errb.String(), "src.cu changed after") {
		t.Fatalf("build dir, stale: %q, %v, stderr %q", got, err, errb.String())
	}
	if staleSources(src, mustManifest(t, src), built) != "" {
		t.Fatal("build dir still stale after the rebuild")
	}
	// What a message asks the author to edit is the source's manifest,
	// not the build's copy, which the next build rewrites.
	if got := editableManifest(built, "host"); got != filepath.Join(src, "plover.json") {
		t.Errorf("the manifest to edit for %s: %s, want the source's", built, got)
	}
	if got := editableManifest(plain, "host"); got != filepath.Join(plain, "plover.json") {
		t.Errorf("the manifest to edit for a plain bundle: %s, want its own", got)
	}
	// From inside the build dir ("."), and not for another target than
	// the bundle's (the caller refuses that bundle).
	os.Chtimes(filepath.Join(src, "src.cu"), old, time.Now().Add(time.Second))
	errb.Reset()
	if got, err := resolveBundle(built, abi.TargetCUDA, env); err != nil || got != built || errb.Len() != 0 {
		t.Fatalf("build dir for another target: %q, %v, stderr %q", got, err, errb.String())
	}
	t.Chdir(built)
	if got, err := resolveBundle(".", "", env); err != nil || got != "." || !strings.Contains(errb.String(), "../../src.cu changed after . was built") {
		t.Fatalf("build dir as '.': %q, %v, stderr %q", got, err, errb.String())
	}
	// A rebuild that fails is an error naming the change, not the old bytes.
	os.WriteFile(filepath.Join(src, "src.cu"), []byte("this is not C++\n"), 0o644)
	if _, err := resolveBundle(src, "host", env); err == nil || !strings.Contains(err.Error(), "rebuilding it failed") {
		t.Fatalf("failed rebuild: %v", err)
	}
	if _, err := resolveBundle(built, "", env); err == nil || !strings.Contains(err.Error(), "rebuilding it failed") {
		t.Fatalf("failed rebuild through the build dir: %v", err)
	}
	// A source directory with its library built in place is a bundle.
	inPlace := initDir(t, "inplace")
	os.WriteFile(filepath.Join(inPlace, "inplace.so"), nil, 0o644)
	if got, err := resolveBundle(inPlace, "", env); err != nil || got != inPlace {
		t.Fatalf("in place: %q, %v", got, err)
	}
}

func mustStat(t *testing.T, path string) os.FileInfo {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return fi
}

func TestBuildErrors(t *testing.T) {
	// No build section.
	plain := testkit.BundleDir(t, testkit.Manifest("plain"), nil)
	if _, _, err := runCommand(buildCmd(), plain); err == nil || !strings.Contains(err.Error(), `has no "build" section`) {
		t.Fatalf("no build section: %v", err)
	}
	dir := initDir(t, "errs")
	// Compilers missing.
	t.Setenv("CXX", "no-such-cxx")
	if _, _, err := runCommand(buildCmd(), dir); err == nil || !strings.Contains(err.Error(), "no-such-cxx not found") || !strings.Contains(err.Error(), "install g++") {
		t.Fatalf("no g++: %v", err)
	}
	t.Setenv("NVCC", "no-such-nvcc")
	if _, _, err := runCommand(buildCmd(), dir, "--target", "cuda"); err == nil || !strings.Contains(err.Error(), "no-such-nvcc not found") || !strings.Contains(err.Error(), "make install-nvcc") {
		t.Fatalf("no nvcc: %v", err)
	}
	// A missing source or constants file.
	os.Rename(filepath.Join(dir, "errs.cu"), filepath.Join(dir, "moved.cu"))
	if _, _, err := runCommand(buildCmd(), dir); err == nil || !strings.Contains(err.Error(), "build.sources[0]") {
		t.Fatalf("missing source: %v", err)
	}
	os.Rename(filepath.Join(dir, "moved.cu"), filepath.Join(dir, "errs.cu"))
	os.Remove(filepath.Join(dir, "constants.bin"))
	want := filepath.Join(dir, "plover.json") + ": constants: " + filepath.Join(dir, "constants.bin") + ": no such file or directory"
	if _, _, err := runCommand(buildCmd(), dir); err == nil || err.Error() != want {
		t.Fatalf("missing constants: %v; want %q", err, want)
	}
}

// TestBuildAndRun builds plover init's function with the real g++ and runs
// it in this process.
func TestBuildAndRun(t *testing.T) {
	if _, err := exec.LookPath("g++"); err != nil {
		t.Skip("no g++")
	}
	dir := initDir(t, "loop")
	// A compile error: the compiler's message reaches stderr unchanged.
	src := filepath.Join(dir, "loop.cu")
	good, _ := os.ReadFile(src)
	os.WriteFile(src, append(good, []byte("\nnot_a_type x;\n")...), 0o644)
	_, stderr, err := runCommand(buildCmd(), dir)
	if err == nil || !strings.Contains(err.Error(), "host build of") || !strings.Contains(stderr, "loop.cu:") || !strings.Contains(stderr, "not_a_type") {
		t.Fatalf("compile error: %v\n%s", err, stderr)
	}
	os.WriteFile(src, good, 0o644)
	stdout, stderr, err := runCommand(buildCmd(), dir)
	if err != nil {
		t.Fatalf("%v\n%s", err, stderr)
	}
	if !strings.Contains(stderr, "g++ -x c++ -std=c++17 -O2 -shared -fPIC -Wl,--exclude-libs,libstdc++.a:libsupc++.a:libgcc_eh.a -Wall -Wextra -Iinclude -o build/host/loop.so loop.cu") || !strings.Contains(stdout, "built ") {
		t.Fatalf("stdout %q stderr %q", stdout, stderr)
	}
	bm, err := checkDir(filepath.Join(dir, "build", "host"))
	if err != nil || bm.Build != nil || bm.Target != "host" {
		t.Fatalf("built bundle: %+v, %v", bm, err)
	}

	const n = 1000
	in := make([]byte, 4*n)
	for i := 0; i < n; i++ {
		binary.LittleEndian.PutUint32(in[4*i:], math.Float32bits(float32(i)/2))
	}
	inPath := filepath.Join(t.TempDir(), "in.bin")
	os.WriteFile(inPath, in, 0o644)
	stdout, stderr, err = runCommand(runCmd(), dir, "--in", inPath, "--repeat", "5", "--json")
	if err != nil {
		t.Fatalf("%v\n%s", err, stderr)
	}
	var rep runReport
	if err := json.Unmarshal([]byte(stdout), &rep); err != nil {
		t.Fatalf("%v\n%s", err, stdout)
	}
	if rep.Runs != 5 || rep.InputBytes != 4*n || rep.OutputBytes != 4*n || len(rep.Output) != 4*n || rep.Function != "loop" ||
		rep.Timing.Load <= 0 || rep.Timing.Kernels.Min <= 0 || rep.Timing.Kernels.Min > rep.Timing.Kernels.Median || rep.Timing.Kernels.Median > rep.Timing.Kernels.P99 {
		t.Fatalf("report %+v", rep)
	}
	for i := 0; i < n; i++ {
		if got := math.Float32frombits(binary.LittleEndian.Uint32(rep.Output[4*i:])); got != float32(i)+1 {
			t.Fatalf("y[%d] = %v, want %v", i, got, float32(i)+1)
		}
	}
	// The human form: output to a file, the timing breakdown on stderr.
	outPath := filepath.Join(t.TempDir(), "out.bin")
	stdout, stderr, err = runCommand(runCmd(), dir, "--in", inPath, "--out", outPath, "--repeat", "3")
	if err != nil || stdout != "" {
		t.Fatalf("%v, stdout %q\n%s", err, stdout, stderr)
	}
	for _, s := range []string{"load (library + constants)", "instance creation", "min", "median", "p99", "kernels", "copy-out"} {
		if !strings.Contains(stderr, s) {
			t.Errorf("timing lacks %q:\n%s", s, stderr)
		}
	}
	if got, _ := os.ReadFile(outPath); !bytes.Equal(got, rep.Output) {
		t.Fatal("--out differs from --json's output")
	}
	// A malformed input is refused (plover_reject: the client's fault, 422
	// on a server), not failed (500), named with the chain.
	os.WriteFile(inPath, in[:3], 0o644)
	if _, _, err := runCommand(runCmd(), dir, "--in", inPath, "--out", outPath); err == nil ||
		!strings.Contains(err.Error(), "the chain [loop_entry] refused its input (plover_reject: a server answers 422 invalid_input): input length is not a multiple of 4") {
		t.Fatalf("bad input: %v", err)
	}
	// The function's own fault stays a failure: constants too short.
	os.WriteFile(inPath, in, 0o644)
	consts, _ := os.ReadFile(filepath.Join(dir, "constants.bin"))
	os.WriteFile(filepath.Join(dir, "constants.bin"), consts[:4], 0o644) // rebuilt into the bundle
	if _, _, err := runCommand(runCmd(), dir, "--in", inPath, "--out", outPath); err == nil ||
		!strings.Contains(err.Error(), "the chain [loop_entry] failed: the constants file must hold a and b") {
		t.Fatalf("short constants: %v", err)
	}
	os.WriteFile(filepath.Join(dir, "constants.bin"), consts, 0o644)
	// Over max_input_bytes.
	os.WriteFile(inPath, make([]byte, 4*initMaxFloats+4), 0o644)
	if _, _, err := runCommand(runCmd(), dir, "--in", inPath, "--out", outPath); err == nil || !strings.Contains(err.Error(), fmt.Sprintf("over max_input_bytes %d", 4*initMaxFloats)) {
		t.Fatalf("big input: %v", err)
	}
}

// The generated Makefile's build/host is checked against the sources above
// it as plover build's is: its manifest is the source plover.json with the
// target set (build section and all), and plover run (and deploy, through
// the same resolveBundle) of it after an edit rebuilds, never running the
// old bytes.
func TestMakefileBundleRebuiltWhenStale(t *testing.T) {
	needMake(t)
	compilerFor(t, abi.TargetHost)
	dir := initDir(t, "mk")
	runMake(t, dir, "host")
	built := filepath.Join(dir, "build", "host")
	in := float32sLE(1, 2, 3, 4)
	inPath := filepath.Join(t.TempDir(), "in.bin")
	os.WriteFile(inPath, in, 0o644)
	if ys, stderr := runFloats(t, built, inPath); !reflect.DeepEqual(ys, []float32{3, 5, 7, 9}) || strings.Contains(stderr, "rebuilding") {
		t.Fatalf("fresh Makefile build: %v, stderr %q", ys, stderr)
	}
	// y = 2x + 101 now; the library is older than the edit.
	src := filepath.Join(dir, "mk.cu")
	b, _ := os.ReadFile(src)
	edited := strings.Replace(string(b), "ab[1];", "ab[1] + 100.0f;", 1)
	if edited == string(b) {
		t.Fatal("test bug: the kernel has no \"ab[1];\"")
	}
	past := time.Now().Add(-time.Minute)
	for _, f := range []string{"plover.json", "constants.bin", "include/plover.h", "include/plover_kernel.h"} {
		os.Chtimes(filepath.Join(dir, f), past.Add(-time.Second), past.Add(-time.Second))
	}
	os.Chtimes(filepath.Join(built, "mk.so"), past, past)
	os.WriteFile(src, []byte(edited), 0o644)
	ys, stderr := runFloats(t, built, inPath)
	if !reflect.DeepEqual(ys, []float32{103, 105, 107, 109}) {
		t.Fatalf("after the edit: %v (stale bytes run), stderr %q", ys, stderr)
	}
	if !strings.Contains(stderr, src+" changed after "+built+" was built: rebuilding it") {
		t.Fatalf("stderr does not say it rebuilt: %q", stderr)
	}
	// A rebuild that fails refuses, naming the change, as for the source dir.
	os.WriteFile(src, []byte("this is not C++\n"), 0o644)
	os.Chtimes(filepath.Join(built, "mk.so"), past, past)
	if _, err := resolveBundle(built, "", &Env{Stderr: io.Discard}); err == nil || !strings.Contains(err.Error(), "rebuilding it failed") {
		t.Fatalf("failed rebuild through the Makefile's build dir: %v", err)
	}
}

// runFloats runs plover run dir on the input in inPath and returns its
// output as float32s, and its stderr.
func runFloats(t *testing.T, dir, inPath string) ([]float32, string) {
	t.Helper()
	stdout, stderr, err := runCommand(runCmd(), dir, "--in", inPath, "--json")
	if err != nil {
		t.Fatalf("plover run %s: %v\n%s", dir, err, stderr)
	}
	var rep runReport
	if err := json.Unmarshal([]byte(stdout), &rep); err != nil {
		t.Fatalf("%v\n%s", err, stdout)
	}
	var ys []float32
	for i := 0; i+4 <= len(rep.Output); i += 4 {
		ys = append(ys, math.Float32frombits(binary.LittleEndian.Uint32(rep.Output[i:])))
	}
	return ys, stderr
}

// float32sLE is vs as little-endian float32s.
func float32sLE(vs ...float32) []byte {
	b := make([]byte, 4*len(vs))
	for i, v := range vs {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(v))
	}
	return b
}

func mustManifest(t *testing.T, dir string) *abi.Manifest {
	t.Helper()
	m, err := bundle.ReadManifest(dir)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// A manifest that names no include directories builds with include/ (the
// default), so a header there that changed makes the build stale too.
func TestStaleSourcesDefaultInclude(t *testing.T) {
	src := initDir(t, "noinc")
	m := mustManifest(t, src)
	m.Build.Include = nil
	built := filepath.Join(src, "build", "host")
	os.MkdirAll(built, 0o755)
	lib := filepath.Join(built, m.Library)
	os.WriteFile(lib, nil, 0o644)
	at := backdate(t, lib, src)
	if got := staleSources(src, m, built); got != "" {
		t.Fatalf("fresh build reported stale by %s", got)
	}
	h := filepath.Join(src, "include", "plover.h")
	os.Chtimes(h, at, at.Add(time.Minute))
	if got := staleSources(src, m, built); got != h {
		t.Fatalf("stale by %q, want the edited header %s", got, h)
	}
}

// plover build refuses an --out whose <target> is the source directory
// itself, however named: the bundle's plover.json replaced the source's
// (its build section gone), and its constants, linked onto themselves,
// were deleted.
func TestBuildOutIsTheSource(t *testing.T) {
	src := initDir(t, "host")
	parent := filepath.Dir(src)
	link := filepath.Join(t.TempDir(), "via-link")
	if err := os.Symlink(parent, link); err != nil {
		t.Fatal(err)
	}
	manifest, _ := os.ReadFile(filepath.Join(src, "plover.json"))
	for _, tt := range []struct {
		name, cwd string
		args      []string
		bdir, dir string // in the message
	}{
		{"the parent", "", []string{"build", src, "--out", parent}, src, src},
		{"through a link", "", []string{"build", src, "--out", link}, filepath.Join(link, "host"), src},
		{"in the parent: host --out .", parent, []string{"build", "host", "--out", "."}, "host", "host"},
		{"in the source: . --out ..", src, []string{"build", ".", "--out", ".."}, filepath.Join("..", "host"), "."},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if tt.cwd != "" {
				t.Chdir(tt.cwd)
			}
			_, errs, code := runMain(t, nil, tt.args...)
			want := fmt.Sprintf("plover build: --out %s: the host bundle would be written to %s, which is the source directory %s: its plover.json would be overwritten; give another --out", tt.args[3], tt.bdir, tt.dir)
			if code != 2 || !strings.HasPrefix(errs, want) {
				t.Errorf("exit %d, stderr %q; want exit 2 and %q", code, errs, want)
			}
			if b, _ := os.ReadFile(filepath.Join(src, "plover.json")); !bytes.Equal(b, manifest) {
				t.Errorf("the source plover.json changed:\n%s", b)
				os.WriteFile(filepath.Join(src, "plover.json"), manifest, 0o644) // for the next case
			}
			if _, err := os.Stat(filepath.Join(src, "constants.bin")); err != nil {
				t.Errorf("the source's constants: %v", err)
			}
		})
	}
}

// plover init says what a --dir it cannot use is: a ~ the shell left
// unexpanded (--dir=~/x made ./~/x and said "created ~/x"), a dangling
// link ("mkdir dangling: file exists"); and where it created the
// directory, as an absolute path.
func TestInitDirSlips(t *testing.T) {
	tmp := t.TempDir()
	t.Chdir(tmp)
	if err := os.Symlink(filepath.Join(tmp, "gone"), "dangling"); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		dir  string
		code int
		want string // stdout and stderr
	}{
		{"~/x", 2, `plover init: --dir "~/x": the shell did not expand its ~ (it does not after --dir=): write --dir ~/... with a space, or $HOME/...`},
		{"~", 2, `plover init: --dir "~": the shell did not expand its ~`},
		{"dangling", 1, "plover init: dangling is a dangling symbolic link (to " + filepath.Join(tmp, "gone") + ", which does not exist): remove the link, or create what it points to"},
		{"dangling/sub", 1, "plover init: dangling/sub: dangling is a dangling symbolic link"},
		{"made", 0, "created " + filepath.Join(tmp, "made") + ": fn.cu"},
	} {
		out, errs, code := runMain(t, nil, "init", "fn", "--dir="+tt.dir)
		if code != tt.code || !strings.Contains(out+errs, tt.want) {
			t.Errorf("--dir=%s: exit %d, output %q; want exit %d and %q", tt.dir, code, out+errs, tt.code, tt.want)
		}
	}
	if _, err := os.Lstat("~"); err == nil {
		t.Errorf("a directory named ~ was made")
	}
}

// plover build reads no $PLOVER_OUT: that is plover invoke's and run's
// output file, and a build in a shell that exported it made a directory
// of that name, where the next invoke could not write its output.
func TestBuildReadsNoPloverOut(t *testing.T) {
	compilerFor(t, abi.TargetHost)
	dir := initDir(t, "noout")
	result := filepath.Join(t.TempDir(), "result.bin")
	if _, errs, code := runMain(t, envOf(map[string]string{"PLOVER_OUT": result}), "build", dir); code != 0 {
		t.Fatalf("build with $PLOVER_OUT set: exit %d: %s", code, errs)
	}
	if _, err := os.Stat(filepath.Join(dir, BuildDir, abi.TargetHost, abi.ManifestFile)); err != nil {
		t.Errorf("the bundle is not in DIR/%s/%s: %v", BuildDir, abi.TargetHost, err)
	}
	if _, err := os.Stat(result); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("build made %s from $PLOVER_OUT (stat: %v)", result, err)
	}
	if out, _, _ := runMain(t, nil, "build", "--help"); !strings.Contains(out, "(the command line wins): PLOVER_JSON, PLOVER_TARGET.") {
		t.Errorf("build --help lists PLOVER_OUT among its variables:\n%s", out)
	}
}
