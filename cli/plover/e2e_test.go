package main_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/plover-run/plover/internal/testkit"
)

// server is a real `plover serve` process on a free loopback port.
type server struct {
	url string
	// grpc and metrics are --grpc-listen's and --metrics-listen's
	// addresses (host:port) as the server logged them, before its API's:
	// a test passes port 0 and reads them here, where a port it found free
	// could be taken by another test's before the server bound it.
	grpc, metrics string
	cmd           *exec.Cmd
	log           *bytes.Buffer
	// logRead is closed once its stderr was read to the end: cmd.Wait
	// closes the pipe, and lines not read by then (its last ones, as it
	// stops) are lost.
	logRead chan struct{}
}

// wait is s.cmd.Wait once s's stderr was read to the end (or bound
// passed): Wait closes the pipe, and the lines a server writes as it
// stops were lost when read after it (a test looking for "stopped" in
// its log failed under load). The bound keeps a test from hanging, were
// a process to hold the server's stderr past its exit (none does: workers
// have pipes of their own, a namespace's init /dev/null); it does not
// make such a test pass.
func (s *server) wait(bound time.Duration) error {
	select {
	case <-s.logRead:
	case <-time.After(bound):
	}
	return s.cmd.Wait()
}

// buildPlover builds plover and, beside it, plover-worker (which its
// servers then start for their workers), once per test binary.
func buildPlover(t *testing.T) string {
	t.Helper()
	built.once.Do(func() {
		dir, err := os.MkdirTemp("", "plover-e2e-bin-")
		if err != nil {
			built.err = err
			return
		}
		built.dir = dir
		for _, b := range [][2]string{{"plover", "."}, {"plover-worker", "../../cmd/plover-worker"}} {
			if out, err := exec.Command("go", "build", "-o", filepath.Join(dir, b[0]), b[1]).CombinedOutput(); err != nil {
				built.err = fmt.Errorf("go build %s: %v\n%s", b[1], err, out)
				return
			}
		}
	})
	if built.err != nil {
		t.Fatal(built.err)
	}
	return filepath.Join(built.dir, "plover")
}

var built struct {
	once sync.Once
	dir  string
	err  error
}

func TestMain(m *testing.M) {
	code := m.Run()
	if built.dir != "" {
		os.RemoveAll(built.dir)
	}
	os.Exit(code)
}

func startServer(t *testing.T, bin string, args ...string) *server {
	t.Helper()
	cmd := exec.Command(bin, append([]string{"serve", "--listen", "127.0.0.1:0", "--data", t.TempDir(), "--device", "host"}, args...)...)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	s := &server{cmd: cmd, log: &bytes.Buffer{}, logRead: make(chan struct{})}
	t.Cleanup(func() {
		cmd.Process.Signal(os.Interrupt)
		done := make(chan struct{})
		go func() { s.wait(10 * time.Second); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
		}
		if t.Failed() {
			t.Logf("server log:\n%s", s.log)
		}
	})
	addrRE := regexp.MustCompile(`msg="plover serving" addr=(http://127\.0\.0\.1:\d+)`)
	found := make(chan string, 1)
	go func() {
		defer close(s.logRead)
		sc := bufio.NewScanner(stderr)
		sent := false
		for sc.Scan() {
			s.log.WriteString(sc.Text() + "\n")
			if sent {
				continue
			}
			// Written before the send, read after the receive.
			if m := grpcAddrRE.FindStringSubmatch(sc.Text()); m != nil {
				s.grpc = m[1]
			}
			if m := metricsAddrRE.FindStringSubmatch(sc.Text()); m != nil {
				s.metrics = m[1]
			}
			if m := addrRE.FindStringSubmatch(sc.Text()); m != nil {
				found <- m[1]
				sent = true
			}
		}
	}()
	select {
	case s.url = <-found:
	case <-time.After(20 * time.Second):
		t.Fatalf("plover serve did not report its address:\n%s", s.log)
	}
	return s
}

func run(t *testing.T, bin string, env []string, args ...string) string {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("plover %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

func floats(b []byte) []float32 {
	v := make([]float32, len(b)/4)
	for i := range v {
		v[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
	}
	return v
}

func TestEndToEnd(t *testing.T) {
	if testing.Short() {
		t.Skip("builds binaries and starts a server")
	}
	bin := buildPlover(t)
	root := testkit.Root()
	work := t.TempDir()
	// The vecadd host bundle and its data, built as `make samples` does.
	bundle := filepath.Join(work, "vecadd")
	os.MkdirAll(bundle, 0o755)
	testkit.BuildLib(t, filepath.Join(root, "samples", "vecadd", "vecadd.cu"), bundle, "vecadd.so")
	manifest, _ := os.ReadFile(filepath.Join(root, "samples", "vecadd", "plover.json"))
	os.WriteFile(filepath.Join(bundle, "plover.json"), manifest, 0o644)
	input, expect := filepath.Join(work, "a.bin"), filepath.Join(work, "c.bin")
	gen := exec.Command("go", "run", "./samples/vecadd/gen", "-consts", filepath.Join(bundle, "b.bin"), "-input", input, "-expect", expect)
	gen.Dir = root
	if out, err := gen.CombinedOutput(); err != nil {
		t.Fatalf("gen: %v\n%s", err, out)
	}

	srv := startServer(t, bin)
	env := []string{"PLOVER_SERVER=" + srv.url}
	if out := run(t, bin, env, "deploy", bundle); !strings.Contains(out, "deployed vecadd version") {
		t.Fatalf("deploy said %q", out)
	}
	// The same bytes again: no new version, and the CLI says so (the
	// server answers 200 with "unchanged", not 201); --force makes one.
	if out := run(t, bin, env, "deploy", bundle); !strings.Contains(out, "vecadd is unchanged") {
		t.Fatalf("second deploy of the same bytes said %q", out)
	}
	if out := run(t, bin, env, "deploy", bundle, "--force"); !strings.Contains(out, "deployed vecadd version") {
		t.Fatalf("deploy --force said %q", out)
	}
	if out := run(t, bin, env, "versions", "vecadd"); strings.Count(out, "\n") != 3 {
		t.Fatalf("versions after deploy, unchanged deploy, --force (want 2 and a header):\n%s", out)
	}
	if out := run(t, bin, env, "ls"); !strings.Contains(out, "vecadd") {
		t.Fatalf("ls said %q", out)
	}
	want, _ := os.ReadFile(expect)
	a, _ := os.ReadFile(input)
	// Sanity-check the expectation itself: out = a + b elementwise.
	if got := floats(want)[123457]; got != floats(a)[123457]+float32(123457%1000)*0.25 {
		t.Fatalf("expected file is wrong at 123457: %v", got)
	}

	out := filepath.Join(work, "out.bin")
	run(t, bin, env, "invoke", "vecadd", "--in", input, "--out", out)
	if got, _ := os.ReadFile(out); !bytes.Equal(got, want) {
		t.Fatal("plover invoke output differs from a+b")
	}

	resp, err := http.Post(srv.url+"/v1/functions/vecadd/invoke", "application/octet-stream", bytes.NewReader(a))
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !bytes.Equal(got, want) || resp.Header.Get("X-Plover-Start") != "hot" {
		t.Fatalf("raw HTTP: %d start=%s equal=%v", resp.StatusCode, resp.Header.Get("X-Plover-Start"), bytes.Equal(got, want))
	}

	// A short input is fine (n is taken from the request's length)...
	jsonOut := run(t, bin, env, "invoke", "vecadd", "--in", input, "--json")
	if !strings.Contains(jsonOut, `"start":"hot"`) || !strings.Contains(jsonOut, `"timing_us"`) {
		t.Fatalf("invoke --json: %.200s", jsonOut)
	}
	// ...and a bad one is refused by the kernel with a clear message, as
	// the client's fault (plover_reject: 422), not the function's.
	bad := exec.Command(bin, "invoke", "vecadd", "--out", filepath.Join(work, "x"))
	bad.Env = append(os.Environ(), env...)
	bad.Stdin = strings.NewReader("abc")
	msg, err := bad.CombinedOutput()
	if err == nil || !strings.Contains(string(msg), "422") || !strings.Contains(string(msg), "not a multiple of 4") {
		t.Fatalf("3-byte input: err=%v %s", err, msg)
	}

	run(t, bin, env, "rm", "vecadd")
	miss := exec.Command(bin, "invoke", "vecadd", "--in", input, "--out", out)
	miss.Env = append(os.Environ(), env...)
	if msg, err := miss.CombinedOutput(); err == nil || !strings.Contains(string(msg), "404") {
		t.Fatalf("invoke after rm: %v %s", err, msg)
	}

	// SIGINT stops the server cleanly.
	srv.cmd.Process.Signal(os.Interrupt)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- srv.wait(10 * time.Second) }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("server exit: %v", err)
		}
	case <-ctx.Done():
		t.Fatal("server did not stop on SIGINT")
	}
}
