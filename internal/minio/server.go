package minio

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	miniogo "github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"

	"github.com/plover-run/plover/internal/forkthread"
)

// ReadyTimeout bounds how long a start waits for the server to answer.
const ReadyTimeout = 60 * time.Second

// stopGrace is how long a SIGTERM gets before SIGKILL.
const stopGrace = 10 * time.Second

// Server is one MinIO process on 127.0.0.1 with its own data directory. It
// can be stopped and started again on the same address and data, which is
// how tests simulate an object-store outage.
type Server struct {
	Addr      string // 127.0.0.1:port
	Endpoint  string // http://127.0.0.1:port
	AccessKey string // root user
	SecretKey string // root password
	DataDir   string

	bin     string
	workDir string // certs and log live beside the data, not in $HOME

	mu      sync.Mutex
	cmd     *exec.Cmd
	exited  chan struct{} // closed when cmd has been waited for
	waitErr error
	log     *ringBuffer
}

// Launch starts bin (see Install) on a free loopback port with fresh root
// credentials, keeping its objects in dataDir/data, and returns once it
// serves requests. The caller must Stop it.
func Launch(ctx context.Context, bin, dir string) (*Server, error) {
	s := &Server{
		AccessKey: "plover-" + randHex(6),
		SecretKey: randHex(20),
		DataDir:   filepath.Join(dir, "data"),
		bin:       bin,
		workDir:   dir,
		log:       newRingBuffer(64 << 10),
	}
	if err := os.MkdirAll(s.DataDir, 0o755); err != nil {
		return nil, err
	}
	// The free port is found by binding and releasing it, so another process
	// can grab it before MinIO does; a few fresh tries make that harmless.
	var err error
	for range 3 {
		var port int
		port, err = freePort()
		if err != nil {
			return nil, err
		}
		s.Addr = fmt.Sprintf("127.0.0.1:%d", port)
		s.Endpoint = "http://" + s.Addr
		if err = s.start(ctx); err == nil {
			return s, nil
		}
		if !strings.Contains(s.log.String(), "address already in use") {
			break
		}
	}
	return nil, err
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("minio: find free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func randHex(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return hex.EncodeToString(b)
}

// Restart starts the server again on the same address and data directory,
// stopping it first if it runs.
func (s *Server) Restart(ctx context.Context) error {
	if err := s.Stop(); err != nil {
		return err
	}
	return s.start(ctx)
}

func (s *Server) start(ctx context.Context) error {
	s.mu.Lock()
	if s.cmd != nil {
		s.mu.Unlock()
		return errors.New("minio: already running")
	}
	fmt.Fprintf(s.log, "--- plover: starting minio on %s\n", s.Addr)
	// Not CommandContext: the server outlives ctx, which only bounds the
	// wait for readiness.
	cmd := exec.Command(s.bin, "server", s.DataDir,
		"--address", s.Addr,
		// The console is disabled below; naming a loopback address anyway
		// keeps it off other interfaces should a release ignore that.
		"--console-address", "127.0.0.1:0",
		"--certs-dir", filepath.Join(s.workDir, "certs"))
	cmd.Env = append(cleanEnv(),
		"MINIO_ROOT_USER="+s.AccessKey,
		"MINIO_ROOT_PASSWORD="+s.SecretKey,
		"MINIO_BROWSER=off",
		"MINIO_UPDATE=off",
		"MINIO_CALLHOME_ENABLE=off",
	)
	cmd.Stdout, cmd.Stderr = s.log, s.log
	cmd.SysProcAttr = sysProcAttr()
	// From a thread that never ends: the death signal follows the thread
	// that forked MinIO, not this process.
	if err := forkthread.Start(cmd); err != nil {
		s.mu.Unlock()
		return fmt.Errorf("minio: start %s: %w", s.bin, err)
	}
	exited := make(chan struct{})
	s.cmd, s.exited = cmd, exited
	go func() {
		err := cmd.Wait()
		s.mu.Lock()
		s.waitErr = err
		s.mu.Unlock()
		close(exited)
	}()
	s.mu.Unlock()
	if err := s.waitReady(ctx, exited); err != nil {
		s.Stop()
		return fmt.Errorf("minio on %s: %w\n%s", s.Addr, err, tail(s.log.String(), 3000))
	}
	return nil
}

// cleanEnv drops MINIO_* settings of whoever runs the tests, which could
// change how the server behaves.
func cleanEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "MINIO_") {
			env = append(env, kv)
		}
	}
	return env
}

// waitReady polls the liveness and then the readiness endpoint: a live
// server may still refuse S3 requests while its storage initialises.
func (s *Server) waitReady(ctx context.Context, exited <-chan struct{}) error {
	ctx, cancel := context.WithTimeout(ctx, ReadyTimeout)
	defer cancel()
	client := &http.Client{Timeout: 2 * time.Second}
	// Ready still answers before the IAM subsystem is up, when S3 requests
	// get 503 "IAM sub-system not initialized yet": an anonymous list of
	// buckets must get its 403 first.
	for _, path := range []string{"/minio/health/live", "/minio/health/ready", "/"} {
		for {
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, s.Endpoint+path, nil)
			resp, err := client.Do(req)
			if err == nil {
				resp.Body.Close()
				if resp.StatusCode == http.StatusOK || (path == "/" && resp.StatusCode != http.StatusServiceUnavailable) {
					break
				}
			}
			select {
			case <-exited:
				return fmt.Errorf("exited before it was ready: %v", s.exitErr())
			case <-ctx.Done():
				return fmt.Errorf("not ready after %v (GET %s: %v)", ReadyTimeout, path, err)
			case <-time.After(50 * time.Millisecond):
			}
		}
	}
	// Root credentials work before the IAM users are loaded; a request
	// signed with an unknown key gets 503 "IAM sub-system not initialized"
	// until then, and its access-denied answer after. Tests expect that
	// answer, so wait for it.
	probe, err := miniogo.New(s.Addr, &miniogo.Options{Creds: credentials.NewStaticV4("plover-ready-probe", "plover-ready-probe", "")})
	if err != nil {
		return err
	}
	for {
		_, err := probe.BucketExists(ctx, "plover-ready-probe")
		if err == nil || !strings.Contains(strings.ToLower(err.Error()), "not initialized") {
			return nil
		}
		select {
		case <-exited:
			return fmt.Errorf("exited before it was ready: %v", s.exitErr())
		case <-ctx.Done():
			return fmt.Errorf("IAM not ready after %v: %v", ReadyTimeout, err)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func (s *Server) exitErr() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.waitErr
}

// Running says whether the process is up (not whether it is ready).
func (s *Server) Running() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cmd != nil
}

// Stop ends the server (SIGTERM, then SIGKILL after a grace period) and waits
// for it. Stopping a stopped server does nothing.
func (s *Server) Stop() error {
	s.mu.Lock()
	cmd, exited := s.cmd, s.exited
	s.mu.Unlock()
	if cmd == nil {
		return nil
	}
	cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-exited:
	case <-time.After(stopGrace):
		cmd.Process.Kill()
		<-exited
	}
	s.mu.Lock()
	s.cmd, s.exited = nil, nil
	s.mu.Unlock()
	fmt.Fprintf(s.log, "--- plover: minio stopped\n")
	return nil
}

// Log returns the server's recent output, for failure messages.
func (s *Server) Log() string { return s.log.String() }

// CreateBucket makes a bucket; one that exists already is not an error.
func (s *Server) CreateBucket(ctx context.Context, name string) error {
	c, err := s.Client()
	if err != nil {
		return err
	}
	if err := c.MakeBucket(ctx, name, miniogo.MakeBucketOptions{}); err != nil {
		if code := miniogo.ToErrorResponse(err).Code; code == "BucketAlreadyOwnedByYou" || code == "BucketAlreadyExists" {
			return nil
		}
		return fmt.Errorf("minio: create bucket %q: %w", name, err)
	}
	return nil
}

// Client returns a minio-go client with root credentials, for tests that
// inspect the server behind the store's back.
func (s *Server) Client() (*miniogo.Client, error) {
	return miniogo.New(s.Addr, &miniogo.Options{
		Creds:        credentials.NewStaticV4(s.AccessKey, s.SecretKey, ""),
		BucketLookup: miniogo.BucketLookupPath,
		Region:       "us-east-1",
	})
}

// ringBuffer keeps the last max bytes written to it.
type ringBuffer struct {
	mu  sync.Mutex
	max int
	b   []byte
}

func newRingBuffer(max int) *ringBuffer { return &ringBuffer{max: max} }

func (r *ringBuffer) Write(p []byte) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.b = append(r.b, p...)
	if over := len(r.b) - r.max; over > 0 {
		r.b = append(r.b[:0], r.b[over:]...)
	}
	return len(p), nil
}

func (r *ringBuffer) String() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return string(r.b)
}
