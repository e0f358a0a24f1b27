package cli

import (
	"context"
	"encoding/binary"
	"errors"
	"math"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// spinBundle builds a host bundle whose kernel spins for as long as its
// input's first float is not 0, and otherwise answers as many floats as
// it was given. It returns the bundle's directory and two inputs: one it
// spins on, one it answers.
func spinBundle(t *testing.T) (dir, spin, answer string) {
	t.Helper()
	if _, err := exec.LookPath("g++"); err != nil {
		t.Skip("no g++")
	}
	dir = initDir(t, "loop")
	kernelFixture(t, dir, "loop", `__global__ void loop_kernel(const float *x, const float *ab, float *y, size_t n) {
  size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  while (*(const volatile float *)x != 0.f) {} // MARK
  if (i < n) y[i] = ab[0] * x[i] + ab[1];
}`, "// MARK")
	if _, stderr, err := runCommand(buildCmd(), dir); err != nil {
		t.Fatalf("build: %v\n%s", err, stderr)
	}
	in := t.TempDir()
	spin, answer = filepath.Join(in, "spin.bin"), filepath.Join(in, "answer.bin")
	b := make([]byte, 16)
	os.WriteFile(answer, b, 0o644)
	binary.LittleEndian.PutUint32(b, math.Float32bits(1))
	os.WriteFile(spin, b, 0o644)
	return dir, spin, answer
}

// signalRunOnceItsTempIsThere runs plover run with args, sends s to this
// process once --out's temporary file is in dir (and the run has had a
// moment to start), and returns the run's error.
func signalRunOnceItsTempIsThere(t *testing.T, dir, base string, s syscall.Signal, args ...string) error {
	t.Helper()
	done := make(chan error, 1)
	go func() {
		_, _, err := runCommand(runCmd(), args...)
		done <- err
	}()
	for end := time.Now().Add(10 * time.Second); len(tempsIn(dir, base)) == 0; time.Sleep(10 * time.Millisecond) {
		select {
		case err := <-done:
			t.Fatalf("the run ended before its temporary file was seen: %v", err)
		default:
		}
		if time.Now().After(end) {
			t.Fatal("no temporary file within 10 s")
		}
	}
	time.Sleep(300 * time.Millisecond)
	syscall.Kill(os.Getpid(), s)
	return <-done
}

// plover run --out catches ^C, SIGTERM and SIGHUP as invoke does, from
// before FILE is opened until it is committed: it caught ^C and SIGTERM
// only during the run, so a SIGHUP (or a signal before or after the run)
// left the temporary file, and a FILE made for the output, empty. And it
// leaves a ^C it was started ignoring ignored: it caught it.
func TestRunOutSignals(t *testing.T) {
	bundle, spin, answer := spinBundle(t)
	// Caught here too, so that a run that does not catch SIGHUP fails the
	// test (by its --timeout) instead of ending the test binary.
	caught := make(chan os.Signal, 4)
	signal.Notify(caught, syscall.SIGHUP)
	defer signal.Stop(caught)

	t.Run("SIGHUP, FILE there", func(t *testing.T) {
		dir := t.TempDir()
		out := filepath.Join(dir, "y.bin")
		writeOwned(t, out, "old", 0o600, 0)
		err := signalRunOnceItsTempIsThere(t, dir, "y.bin", syscall.SIGHUP, bundle, "--in", spin, "--out", out, "--timeout", "3s")
		var xe *exitError
		if err == nil || err.Error() != "interrupted (--out "+out+" left as it was)" || !errors.As(err, &xe) || xe.code != 129 {
			t.Fatalf("the run: %v; want interrupted, --out left as it was, exit 129 (SIGHUP's)", err)
		}
		fileHolds(t, out, "old")
		if ents, _ := os.ReadDir(dir); len(ents) != 1 {
			t.Errorf("%s holds %v; want y.bin alone", dir, ents)
		}
	})
	t.Run("SIGHUP, FILE new", func(t *testing.T) {
		dir := t.TempDir()
		err := signalRunOnceItsTempIsThere(t, dir, "new.bin", syscall.SIGHUP, bundle, "--in", spin, "--out", filepath.Join(dir, "new.bin"), "--timeout", "3s")
		if err == nil || !strings.HasPrefix(err.Error(), "interrupted") {
			t.Fatalf("the run: %v; want interrupted", err)
		}
		if ents, _ := os.ReadDir(dir); len(ents) != 0 {
			t.Errorf("%s holds %v; want nothing", dir, ents)
		}
	})
	t.Run("^C ignored at the start", func(t *testing.T) {
		signal.Ignore(syscall.SIGINT) // as trap '' INT, or a background job, starts it
		defer signal.Reset(syscall.SIGINT)
		dir := t.TempDir()
		err := signalRunOnceItsTempIsThere(t, dir, "z.bin", syscall.SIGINT, bundle, "--in", spin, "--out", filepath.Join(dir, "z.bin"), "--timeout", "2s")
		var xe *exitError
		if err == nil || !strings.Contains(err.Error(), "was still running at the --timeout of 2s") || errors.As(err, &xe) {
			t.Fatalf("the run: %v; want it to outlive the ^C it ignored, to its --timeout, and exit 1", err)
		}
	})
	t.Run("a signal once the output is whole", func(t *testing.T) {
		defer func(f func(context.Context)) { beforeCommit = f }(beforeCommit)
		beforeCommit = func(sig context.Context) {
			syscall.Kill(os.Getpid(), syscall.SIGHUP)
			<-sig.Done()
		}
		out := filepath.Join(t.TempDir(), "w.bin")
		_, _, err := runCommand(runCmd(), bundle, "--in", answer, "--out", out)
		if err == nil || err.Error() != "interrupted once the output was whole: --out "+out+" holds all of it" {
			t.Fatalf("the run: %v; want interrupted once the output was whole", err)
		}
		if b, err := os.ReadFile(out); err != nil || len(b) != 16 {
			t.Errorf("%s: %d bytes (%v); want the 16 of the output", out, len(b), err)
		}
	})
}
