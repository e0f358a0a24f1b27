package abi_test

import (
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// On the CUDA target the first failure or refusal of a request wins, a
// launch's pending error included, whatever clears that error after it:
// plover_fail and plover_reject that found one pending only peeked at it,
// and an author's or a library's cudaGetLastError (Thrust, CUB) after them
// lost both, and the request succeeded (a review's probe). Built with the
// host's C compiler against a stand-in CUDA runtime (testdata), as no GPU
// need be here.
func TestCUDAErrorsFirstWins(t *testing.T) {
	cc, err := exec.LookPath("gcc")
	if err != nil {
		t.Skip("no gcc")
	}
	bin := filepath.Join(t.TempDir(), "cuda_errors")
	if out, err := exec.Command(cc, "-Wall", "-Werror", "-o", bin, filepath.Join("testdata", "cuda_errors.c")).CombinedOutput(); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	out, err := exec.Command(bin).Output()
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"launch, fail, clear: cudaErrorLaunchFailure",
		"launch, reject, clear: cudaErrorLaunchFailure",
		"launch, fail: cudaErrorLaunchFailure",
		"reject, launch: bad input",
		"fail: failed",
		"launch: cudaErrorLaunchFailure",
	}
	if got := strings.Split(strings.TrimSpace(string(out)), "\n"); strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("plover_last_error:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}
