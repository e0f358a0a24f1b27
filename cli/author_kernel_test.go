package cli

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// kernelFixture replaces an initialised function's kernel with body (the
// scaffold's entry and constants stay) and returns the 1-based line of the
// source line holding mark.
func kernelFixture(t *testing.T, dir, name, body, mark string) int {
	t.Helper()
	src := filepath.Join(dir, name+".cu")
	old, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	start := strings.Index(string(old), "__global__ void")
	end := strings.Index(string(old), "// The entry point")
	if start < 0 || end < start {
		t.Fatalf("%s: no kernel to replace", src)
	}
	text := string(old[:start]) + body + "\n" + string(old[end:])
	if err := os.WriteFile(src, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	for i, line := range strings.Split(text, "\n") {
		if strings.Contains(line, mark) {
			return i + 1
		}
	}
	t.Fatalf("fixture has no line marked %q", mark)
	return 0
}

// TestRunReportsBarrierDivergence: kernels whose threads do not all reach
// the same __syncthreads() (issue 37, item 2) fail `plover run` with the
// kernel, the barrier's file:line and what the odd thread did; a kernel
// that keeps every barrier outside its conditions passes.
func TestRunReportsBarrierDivergence(t *testing.T) {
	if _, err := exec.LookPath("g++"); err != nil {
		t.Skip("no g++")
	}
	const head = `__global__ void loop_kernel(const float *x, const float *ab, float *y, size_t n) {
  __shared__ float sh[256];
  unsigned t = threadIdx.x;
  size_t i = (size_t)blockIdx.x * blockDim.x + t;
  sh[t] = i < n ? x[i] : 0.f;
`
	const tail = `  if (i < n) y[i] = ab[0] * sh[t] + ab[1];
}`
	for _, tt := range []struct {
		name, body, want string // want: %d is the marked line
	}{
		{"conditional barrier", "  if (t < 128) __syncthreads(); // MARK\n",
			"barrier divergence in kernel loop_kernel, block (0,0,0): thread (128,0,0) returned while other threads wait at __syncthreads() at loop.cu:%d"},
		{"return before a barrier", "  if (t >= 128) return;\n  __syncthreads(); // MARK\n",
			"thread (128,0,0) returned while other threads wait at __syncthreads() at loop.cu:%d"},
		{"thread 0 returns", "  if (t == 0) return;\n  __syncthreads(); // MARK\n",
			"thread (1,0,0) reached __syncthreads() at loop.cu:%d, which thread 0 returned without reaching"},
		{"barriers outside conditions", "  __syncthreads(); // MARK\n", ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			dir := initDir(t, "loop")
			line := kernelFixture(t, dir, "loop", head+tt.body+tail, "// MARK")
			if _, stderr, err := runCommand(buildCmd(), dir); err != nil {
				t.Fatalf("build: %v\n%s", err, stderr)
			}
			in := filepath.Join(t.TempDir(), "in.bin")
			os.WriteFile(in, make([]byte, 4*1000), 0o644)
			_, stderr, err := runCommand(runCmd(), dir, "--in", in, "--out", filepath.Join(t.TempDir(), "out.bin"))
			if tt.want == "" {
				if err != nil {
					t.Fatalf("run: %v\n%s", err, stderr)
				}
				return
			}
			if want := fmt.Sprintf(tt.want, line); err == nil || !strings.Contains(err.Error(), want) {
				t.Fatalf("run: %v\nwant an error containing %q", err, want)
			}
		})
	}
}

// TestRunCatchesOverruns: plover run is checked by default (issue 37, item
// 1): a kernel writing a few floats past out fails with the entry, the
// buffer and the bytes, and one writing 64 floats past a full page of out
// is stopped at the faulting write, its worker's death naming the same.
// --checked=false runs in place, as plover serve does by default, and the
// small overrun goes unseen there.
func TestRunCatchesOverruns(t *testing.T) {
	if _, err := exec.LookPath("g++"); err != nil {
		t.Skip("no g++")
	}
	const kernel = `__global__ void loop_kernel(const float *x, const float *ab, float *y, size_t n) {
  size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = ab[0] * x[i] + ab[1];
  if (i == n - 1)
    for (size_t k = 1; k <= EXTRA; k++) y[i + k] = 0; // MARK
}`
	for _, tt := range []struct {
		name   string
		floats int // input floats: out holds as many
		extra  int
		args   []string
		want   string
	}{
		{"a few floats past out", 1000, 8, nil,
			"entry loop_entry wrote past the end of out (4000 bytes this request): bytes 4000 to 4031 changed"},
		{"64 floats past a full page", 1024, 64, nil,
			"was killed by signal SIGSEGV (segmentation fault): entry loop_entry wrote past the end of out, at byte 4096 (4096 bytes this request) while running the chain"},
		{"unchecked", 1000, 8, []string{"--checked=false"}, ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			dir := initDir(t, "loop")
			kernelFixture(t, dir, "loop", strings.Replace(kernel, "EXTRA", fmt.Sprint(tt.extra), 1), "// MARK")
			setManifestField(t, dir, "out_bytes", 4*tt.floats) // a full out: the overrun is past out_bytes
			if _, stderr, err := runCommand(buildCmd(), dir); err != nil {
				t.Fatalf("build: %v\n%s", err, stderr)
			}
			in := filepath.Join(t.TempDir(), "in.bin")
			os.WriteFile(in, make([]byte, 4*tt.floats), 0o644)
			args := append([]string{dir, "--in", in, "--out", filepath.Join(t.TempDir(), "out.bin")}, tt.args...)
			_, stderr, err := runCommand(runCmd(), args...)
			if tt.want == "" {
				if err != nil {
					t.Fatalf("run: %v\n%s", err, stderr)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("run: %v\nwant an error containing %q\n%s", err, tt.want, stderr)
			}
		})
	}
}

// setManifestField sets one top-level field of dir's plover.json.
func setManifestField(t *testing.T, dir, field string, v any) {
	t.Helper()
	path := filepath.Join(dir, "plover.json")
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	m[field] = v
	if b, err = json.MarshalIndent(m, "", "  "); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// plover run wrote --out with os.WriteFile once the run was done: a FILE
// it could not write failed after the run, behind the run's own error,
// and one cut short by a full disk kept part of the output (the 58th
// session's LOW). It opens FILE first now, as invoke's --out does
// (outfile.go): a bundle that would fail its run is never run.
func TestRunOpensItsOutFirst(t *testing.T) {
	if _, err := exec.LookPath("g++"); err != nil {
		t.Skip("no g++")
	}
	dir := initDir(t, "loop")
	kernelFixture(t, dir, "loop", `__global__ void loop_kernel(const float *x, const float *ab, float *y, size_t n) {
  size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i == n - 1) y[i + 8] = 0; // MARK
}`, "// MARK")
	setManifestField(t, dir, "out_bytes", 4000) // the kernel writes past it
	if _, stderr, err := runCommand(buildCmd(), dir); err != nil {
		t.Fatalf("build: %v\n%s", err, stderr)
	}
	in := filepath.Join(t.TempDir(), "in.bin")
	os.WriteFile(in, make([]byte, 4000), 0o644)
	if _, _, err := runCommand(runCmd(), dir, "--in", in, "--out", filepath.Join(t.TempDir(), "out.bin")); err == nil || !strings.Contains(err.Error(), "wrote past") {
		t.Fatalf("the run with a writable --out: %v, want its overrun caught", err)
	}
	outDir := t.TempDir() // a directory: no --out can be written there
	_, stderr, err := runCommand(runCmd(), dir, "--in", in, "--out", outDir)
	if err == nil || !strings.Contains(err.Error(), "is a directory") || strings.Contains(err.Error(), "wrote past") {
		t.Fatalf("run with --out a directory: %v, want the --out refused before the run (whose kernel writes past out)\n%s", err, stderr)
	}
}
