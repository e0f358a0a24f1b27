package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// server is one `plover serve` process on a loopback port the kernel
// picked, with its JSON log read as it is written.
type server struct {
	cmd     *exec.Cmd
	url     string
	grpc    string        // grpc://host:port with --grpc-listen
	startup time.Duration // exec to the "plover serving" log line
	exited  chan struct{}
	waitErr error

	mu    sync.Mutex
	colds []coldStart
	tail  []string // the last log lines, for error messages
}

// coldStart is the engine's "cold start" log line: how long the bundle
// took to come from the node cache or the store (fetch, verify, unpack),
// and the program's load (dlopen, symbol resolution, constants, hooks).
type coldStart struct {
	Function  string  `json:"function"`
	Fetched   bool    `json:"fetched"`
	FetchMs   float64 `json:"fetch_ms"`
	ProgramMs float64 `json:"program_ms"`
}

const serverStartTimeout = 30 * time.Second

// serverLogs is the directory each server's log is also written to, a
// file a server (--server-logs; "": none), so that a run on a machine this
// program will not be on again says why its requests failed; serverLogCap
// bounds each file (a server failing every request may log each).
var (
	serverLogs   string
	serverLogSeq atomic.Int64
)

const serverLogCap = 4 << 20

// keepLog opens the file args's server logs into under serverLogs, its
// first line the command; nil where there is none or it cannot be made
// (said once on stderr: the run goes on without it).
func keepLog(args []string) io.WriteCloser {
	if serverLogs == "" {
		return nil
	}
	if err := os.MkdirAll(serverLogs, 0o755); err != nil {
		logf("--server-logs: %v", err)
		return nil
	}
	f, err := os.Create(filepath.Join(serverLogs, fmt.Sprintf("server-%03d.log", serverLogSeq.Add(1))))
	if err != nil {
		logf("--server-logs: %v", err)
		return nil
	}
	fmt.Fprintf(f, "# %s\n", strings.Join(args, " "))
	return &cappedFile{f: f, left: serverLogCap}
}

// cappedFile writes up to left bytes to f and drops the rest, saying so
// at the first byte dropped; a write never fails, so that the log's reader
// never stops on it.
type cappedFile struct {
	f     *os.File
	left  int64
	noted bool
}

func (c *cappedFile) Write(p []byte) (int, error) {
	k := min(int64(len(p)), c.left)
	c.f.Write(p[:k])
	c.left -= k
	if k < int64(len(p)) && !c.noted {
		fmt.Fprintf(c.f, "\n# --server-logs: the rest left out past %d bytes\n", int64(serverLogCap))
		c.noted = true
	}
	return len(p), nil
}

func (c *cappedFile) Close() error { return c.f.Close() }

// startServer runs plover serve on 127.0.0.1:0 with dataDir (and extra
// flags) and waits for it to log its address.
func startServer(plover, dataDir, device, isolation string, extra ...string) (*server, error) {
	return startServerEnv(plover, dataDir, device, isolation, nil, extra...)
}

// startServerEnv is startServer with extra environment (KEY=VALUE).
func startServerEnv(plover, dataDir, device, isolation string, env []string, extra ...string) (*server, error) {
	return startServerIn(pod{}, plover, dataDir, device, isolation, env, extra...)
}

// startServerIn is startServerEnv with the server in a pod's CPU cgroup
// (pod.go; the zero pod: where this program runs).
func startServerIn(p pod, plover, dataDir, device, isolation string, env []string, extra ...string) (*server, error) {
	args := append([]string{plover, "serve", "--listen", "127.0.0.1:0", "--data", dataDir, "--device", device, "--isolation", isolation,
		"--log-format", "json", "--poll", "0", "--grace", "2s"}, extra...)
	args = p.wrap(args)
	cmd := exec.Command(args[0], args[1:]...)
	if env != nil {
		cmd.Env = append(os.Environ(), env...)
	}
	cmd.Stdout = io.Discard
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return nil, err
	}
	s := &server{cmd: cmd, exited: make(chan struct{})}
	t0 := time.Now()
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s serve: %w", plover, err)
	}
	ready := make(chan string, 1)
	var log io.Reader = stderr
	kept := keepLog(args)
	if kept != nil {
		log = io.TeeReader(stderr, kept)
	}
	go func() {
		s.readLog(log, ready)
		if kept != nil {
			kept.Close()
		}
		s.waitErr = cmd.Wait()
		close(s.exited)
	}()
	select {
	case addr := <-ready:
		s.startup = time.Since(t0)
		s.url = addr
		return s, nil
	case <-s.exited:
		return nil, fmt.Errorf("plover serve exited before listening (%v):\n%s", s.waitErr, s.logTail())
	case <-time.After(serverStartTimeout):
		s.stop()
		return nil, fmt.Errorf("plover serve did not listen within %v:\n%s", serverStartTimeout, s.logTail())
	}
}

// grpcAddr is the grpc:// (or grpcs://) address a server started with
// --grpc-listen logged, or an error with its log's tail.
func (s *server) grpcAddr() (string, error) {
	s.mu.Lock()
	addr := s.grpc
	s.mu.Unlock()
	if addr == "" {
		return "", fmt.Errorf("the server logged no gRPC address:\n%s", s.logTail())
	}
	return addr, nil
}

func (s *server) readLog(r io.Reader, ready chan<- string) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		var rec struct {
			Msg  string `json:"msg"`
			Addr string `json:"addr"`
			coldStart
		}
		s.mu.Lock()
		if s.tail = append(s.tail, line); len(s.tail) > 40 {
			s.tail = s.tail[1:]
		}
		s.mu.Unlock()
		if json.Unmarshal([]byte(line), &rec) != nil {
			continue
		}
		switch rec.Msg {
		case "serving the Open Inference Protocol over gRPC":
			s.mu.Lock()
			s.grpc = rec.Addr
			s.mu.Unlock()
		case "plover serving":
			select {
			case ready <- rec.Addr:
			default:
			}
		case "cold start":
			s.mu.Lock()
			s.colds = append(s.colds, rec.coldStart)
			s.mu.Unlock()
		}
	}
	io.Copy(io.Discard, r)
}

// coldStart returns the n-th cold-start log line for fn, waiting briefly:
// the server logs it before answering, but the pipe is read concurrently.
func (s *server) coldStart(fn string, n int) (coldStart, bool) {
	deadline := time.Now().Add(2 * time.Second)
	for {
		s.mu.Lock()
		k := 0
		for _, c := range s.colds {
			if c.Function == fn {
				if k == n {
					s.mu.Unlock()
					return c, true
				}
				k++
			}
		}
		s.mu.Unlock()
		if time.Now().After(deadline) {
			return coldStart{}, false
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func (s *server) logTail() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return strings.Join(s.tail, "\n")
}

// stop ends the process this suite started: SIGTERM, then SIGKILL if it
// has not exited within 10s.
func (s *server) stop() error {
	if s.cmd.Process == nil {
		return nil
	}
	select {
	case <-s.exited:
		return nil
	default:
	}
	s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.exited:
	case <-time.After(10 * time.Second):
		s.cmd.Process.Kill()
		<-s.exited
		return errors.New("plover serve did not stop on SIGTERM; killed")
	}
	return nil
}

// deployDir deploys a bundle directory through a running server.
func deployDir(ctx context.Context, plover, dir, url string) error {
	if out, err := exec.CommandContext(ctx, plover, "deploy", dir, "--server", url).CombinedOutput(); err != nil {
		return fmt.Errorf("%s deploy %s: %v\n%s", plover, dir, err, out)
	}
	return nil
}

// deployToStore publishes a bundle directory straight into the store of
// dataDir, as `plover deploy --store` does: no server runs, so nothing is
// left in the node cache.
func deployToStore(ctx context.Context, plover, dir, dataDir string) error {
	cmd := exec.CommandContext(ctx, plover, "deploy", dir, "--store", "file://"+dataDir+"/store")
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s deploy %s --store: %v\n%s", plover, dir, err, out)
	}
	return nil
}

func ploverVersion(plover string) string {
	out, err := exec.Command(plover, "version").Output()
	if err != nil {
		return "unknown"
	}
	return strings.TrimSpace(string(out))
}

func removeAll(dir string) {
	if err := os.RemoveAll(dir); err != nil {
		fmt.Fprintf(os.Stderr, "warning: %v\n", err)
	}
}
