package main_test

import (
	"bytes"
	"encoding/binary"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// runIn runs the plover binary in dir and returns its combined output.
func runIn(t *testing.T, dir, bin string, env []string, args ...string) string {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("plover %s (in %s): %v\n%s", strings.Join(args, " "), dir, err, out)
	}
	return string(out)
}

// checkSaxpy checks that out holds y = 2x + 1 for plover init's function
// (constants a = 2, b = 1) over the float32s of in.
func checkSaxpy(t *testing.T, what string, in, out []byte) {
	t.Helper()
	x, y := floats(in), floats(out)
	if len(out) != len(in) {
		t.Fatalf("%s: %d output bytes for %d input bytes", what, len(out), len(in))
	}
	for i := range x {
		if want := 2*x[i] + 1; y[i] != want {
			t.Fatalf("%s: y[%d] = %v, want 2*%v+1 = %v", what, i, y[i], x[i], want)
		}
	}
}

// TestAuthorLoop is the function author's loop from an empty directory
// outside the repository, through real processes and compilers: plover
// init, the generated input script, plover build, plover run, then plover
// deploy of the source directory to a real plover serve and plover invoke.
func TestAuthorLoop(t *testing.T) {
	if testing.Short() {
		t.Skip("builds plover, compiles a bundle and starts a server")
	}
	if _, err := exec.LookPath("g++"); err != nil {
		t.Skip("no g++ for the host build")
	}
	bin := buildPlover(t)
	work := t.TempDir()
	if out := runIn(t, work, bin, nil, "init", "saxpy"); !strings.Contains(out, "plover build .") {
		t.Fatalf("init said %q", out)
	}
	fn := filepath.Join(work, "saxpy")

	const n = 1000
	input := filepath.Join(fn, "input.bin")
	if _, err := exec.LookPath("python3"); err == nil {
		gen := exec.Command("python3", "gen_input.py", "input.bin", "1000")
		gen.Dir = fn
		if out, err := gen.CombinedOutput(); err != nil {
			t.Fatalf("gen_input.py: %v\n%s", err, out)
		}
	} else {
		t.Log("no python3: writing the input as gen_input.py would")
		b := make([]byte, 4*n)
		for i := 0; i < n; i++ {
			binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(float32(i)/2))
		}
		os.WriteFile(input, b, 0o644)
	}
	in, err := os.ReadFile(input)
	if err != nil || len(in) != 4*n || floats(in)[7] != 3.5 {
		t.Fatalf("input: %d bytes, %v", len(in), err)
	}

	out := runIn(t, work, bin, nil, "build", "saxpy")
	if !strings.Contains(out, "g++ -x c++ -std=c++17 -O2 -shared -fPIC -Wl,--exclude-libs,libstdc++.a:libsupc++.a:libgcc_eh.a -Wall -Wextra -Iinclude -o build/host/saxpy.so saxpy.cu") ||
		!strings.Contains(out, "built saxpy/build/host") || strings.Contains(out, "warning") {
		t.Fatalf("build said %q", out)
	}

	// In a worker process, from the source directory (build/host).
	runOut := filepath.Join(work, "run.bin")
	out = runIn(t, fn, bin, nil, "run", ".", "--in", "input.bin", "--out", runOut, "--repeat", "3")
	if !strings.Contains(out, "load (library + constants)") || !strings.Contains(out, "median") {
		t.Fatalf("run's timing: %q", out)
	}
	got, _ := os.ReadFile(runOut)
	checkSaxpy(t, "plover run", in, got)

	// Deploy the source directory (its build/host) to a real server.
	srv := startServer(t, bin)
	env := []string{"PLOVER_SERVER=" + srv.url}
	out = runIn(t, work, bin, env, "deploy", "saxpy")
	if !strings.Contains(out, "deploying saxpy/build/host") || !strings.Contains(out, "deployed saxpy version") {
		t.Fatalf("deploy said %q", out)
	}
	invOut := filepath.Join(work, "invoke.bin")
	runIn(t, work, bin, env, "invoke", "saxpy", "--in", input, "--out", invOut)
	inv, _ := os.ReadFile(invOut)
	checkSaxpy(t, "plover invoke", in, inv)
	if !bytes.Equal(inv, got) {
		t.Fatal("plover invoke's output differs from plover run's")
	}

	// An edit, then a deploy of the build directory itself (the generated
	// Makefile's form): the build is older than the source, so it is
	// rebuilt before the deploy, never sent stale.
	src := filepath.Join(fn, "saxpy.cu")
	code, _ := os.ReadFile(src)
	edited := bytes.Replace(code, []byte("ab[0] * x[i] + ab[1];"), []byte("ab[0] * x[i] + ab[1] + 1.0f;"), 1)
	if bytes.Equal(edited, code) {
		t.Fatal("the scaffold's kernel line changed; update this test")
	}
	os.WriteFile(src, edited, 0o644)
	out = runIn(t, fn, bin, env, "deploy", "build/host")
	if !strings.Contains(out, "saxpy.cu changed after build/host was built: rebuilding it") || !strings.Contains(out, "deployed saxpy version") {
		t.Fatalf("deploy build/host after an edit said %q", out)
	}
	runIn(t, work, bin, env, "invoke", "saxpy", "--in", input, "--out", invOut)
	inv, _ = os.ReadFile(invOut)
	if x, y := floats(in), floats(inv); len(y) != len(x) || y[7] != 2*x[7]+2 {
		t.Fatalf("after the edit, y[7] = %v for x[7] = %v, want 2x+2", y[7], x[7])
	}

	t.Run("cuda build", func(t *testing.T) {
		if _, err := exec.LookPath("nvcc"); err != nil {
			t.Skip("nvcc not on PATH: the CUDA build is not checked (make install-nvcc installs Debian's CUDA 11.8)")
		}
		out := runIn(t, work, bin, nil, "build", "saxpy", "--target", "cuda")
		if !strings.Contains(out, "-gencode arch=compute_80,code=sm_80 -gencode 'arch=compute_90,code=[sm_90,compute_90]'") ||
			!strings.Contains(out, "built saxpy/build/cuda") {
			t.Fatalf("build --target cuda said %q", out)
		}
		if fi, err := os.Stat(filepath.Join(fn, "build", "cuda", "saxpy.so")); err != nil || fi.Size() == 0 {
			t.Fatalf("no CUDA library: %v", err)
		}
		// The CUDA bundle is not for plover run, which says so.
		cmd := exec.Command(bin, "run", "build/cuda", "--in", "input.bin", "--out", os.DevNull)
		cmd.Dir = fn
		if msg, err := cmd.CombinedOutput(); err == nil || !strings.Contains(string(msg), "is a cuda bundle") {
			t.Fatalf("run of the cuda bundle: %v %s", err, msg)
		}
	})
}
