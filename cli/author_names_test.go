package cli

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/plover-run/plover/abi"
)

// The scaffold builds whatever the function is called. Its entry once took
// the function's name, so each of these failed to compile: a C library
// function (printf, read), a math function (y0), a namespace (std), and for
// nvcc a CUDA device function (min, max) and type (dim3).
func TestInitBuildsForNamesHeadersDeclare(t *testing.T) {
	for _, target := range []string{abi.TargetHost, abi.TargetCUDA} {
		t.Run(target, func(t *testing.T) {
			compilerFor(t, target)
			for _, name := range []string{"printf", "read", "min", "max", "dim3", "y0", "std"} {
				t.Run(name, func(t *testing.T) {
					dir := initDir(t, name)
					if out, errs, code := runMain(t, nil, "build", dir, "--target", target); code != 0 {
						t.Fatalf("plover init %s && plover build --target %s: exit %d\n%s%s", name, target, code, out, errs)
					}
				})
			}
		})
	}
}

// entrySuffixRE matches what plover init names an entry or a kernel.
var entrySuffixRE = regexp.MustCompile(`\b[a-z0-9_]+_(entry|kernel)\b`)

// Why no function name can collide: nothing the headers of either target
// declare or define, preprocessed as plover build compiles them, has the
// form plover init gives entries and kernels (the ABI's own plover_ names
// aside, which plover init never makes).
func TestInitSymbolsNoHeaderDeclares(t *testing.T) {
	for _, tt := range []struct {
		target   string
		dD       []string // keep the macro definitions in the output
		declares string   // a name its headers do declare: the output is theirs
	}{
		{abi.TargetHost, []string{"-dD"}, "printf"},
		{abi.TargetCUDA, []string{"-Xcompiler", "-dD"}, "dim3"},
	} {
		t.Run(tt.target, func(t *testing.T) {
			compilerFor(t, tt.target)
			dir := initDir(t, "probe")
			if err := os.WriteFile(filepath.Join(dir, "probe.cu"), []byte("#include \"plover_kernel.h\"\nPLOVER_BUNDLE(PLOVER_TARGET);\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			tg, _ := abi.TargetOf(tt.target)
			argv, err := tg.Command(&abi.Build{Sources: []string{"probe.cu"}}, "probe.i", "")
			if err != nil {
				t.Fatal(err)
			}
			cmd := exec.Command(argv[0], append(append(argv[1:], "-E"), tt.dD...)...)
			cmd.Dir = dir
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Fatalf("%s: %v\n%s", shellLine(cmd.Args), err, out)
			}
			pre, err := os.ReadFile(filepath.Join(dir, "probe.i"))
			if err != nil || !regexp.MustCompile(`\b`+tt.declares+`\b`).Match(pre) {
				t.Fatalf("the preprocessed headers lack %s: %v", tt.declares, err)
			}
			for _, line := range strings.Split(string(pre), "\n") {
				if strings.HasPrefix(line, "# ") {
					continue // a line marker: the header's file name
				}
				for _, id := range entrySuffixRE.FindAllString(line, -1) {
					if !strings.HasPrefix(id, abi.ReservedPrefix) {
						t.Errorf("the %s headers have %s, a name plover init may give an entry or kernel: %s", tt.target, id, line)
					}
				}
			}
		})
	}
}
