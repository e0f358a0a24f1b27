// Package fakecuda builds the fake CUDA driver (device/testdata/fakecuda) and
// a CUDA-target test bundle linked against it, so that the CUDA device and
// worker processes on it are tested without a GPU.
package fakecuda

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
)

var shared struct {
	once sync.Once
	dir  string
	err  error
	lent bool // dir is another process's (DirEnv): not removed here
}

// DirEnv names a build another process made and keeps, which Shared uses
// instead of building its own: a test's child processes, which may not be
// able to remove a build of their own (a child under Landlock).
const DirEnv = "PLOVER_FAKECUDA_DIR"

// Shared is Build done once per process, for tests that load the driver
// into their own process: a second build loaded beside the first does not
// get its own bundle, since the bundle's libfakecuda.so resolves by soname
// to the copy loaded first (with its own current contexts), and launches
// fail where the test ran more than once (-count). Remove removes it.
func Shared() (string, error) {
	shared.once.Do(func() {
		if d := os.Getenv(DirEnv); d != "" {
			shared.dir, shared.lent = d, true
			return
		}
		shared.dir, shared.err = Build()
	})
	return shared.dir, shared.err
}

// Remove removes Shared's build, if any and its own (from TestMain, after
// the tests).
func Remove() {
	if shared.dir != "" && !shared.lent {
		os.RemoveAll(shared.dir)
	}
}

// Build compiles into a new temporary directory (the caller removes it):
// libfakecuda.so (the driver), libfakecuda_old.so (one without
// cuGraphLaunch) and fakebundle.so (a "cuda" bundle using the driver).
func Build() (string, error) {
	gcc, err := exec.LookPath("gcc")
	if err != nil {
		return "", fmt.Errorf("gcc not found: %w", err)
	}
	dir, err := os.MkdirTemp("", "plover-fakecuda-")
	if err != nil {
		return "", err
	}
	_, file, _, _ := runtime.Caller(0)
	root := filepath.Join(filepath.Dir(file), "..", "..")
	src := filepath.Join(root, "device", "testdata", "fakecuda")
	builds := [][]string{
		{"-shared", "-fPIC", "-O2", "-Wall", "-Wl,-soname,libfakecuda.so",
			"-o", filepath.Join(dir, "libfakecuda.so"), filepath.Join(src, "fakecuda.c")},
		{"-shared", "-fPIC", "-O2", "-Wall", "-DFAKECUDA_OMIT_GRAPH_LAUNCH", "-Wl,-soname,libfakecuda_old.so",
			"-o", filepath.Join(dir, "libfakecuda_old.so"), filepath.Join(src, "fakecuda.c")},
		{"-shared", "-fPIC", "-O2", "-Wall", "-I" + filepath.Join(root, "abi"),
			"-o", filepath.Join(dir, "fakebundle.so"), filepath.Join(src, "fakebundle.c"),
			"-L" + dir, "-lfakecuda", "-Wl,-rpath," + dir},
	}
	for _, args := range builds {
		if out, err := exec.Command(gcc, args...).CombinedOutput(); err != nil {
			os.RemoveAll(dir)
			return "", fmt.Errorf("gcc %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	return dir, nil
}
