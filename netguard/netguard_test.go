package netguard

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// waitFor polls cond until it holds, failing the test after timeout.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(time.Millisecond)
	}
}

func listenLoopback(t *testing.T) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return ln
}

const greeting = "hello\n"

// serveEcho accepts on ln until it fails, greeting each connection and then
// echoing it until the client closes. The returned channel yields Accept's
// final error.
func serveEcho(ln net.Listener) <-chan error {
	done := make(chan error, 1)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				done <- err
				return
			}
			go func() {
				defer c.Close()
				if _, err := c.Write([]byte(greeting)); err != nil {
					return
				}
				io.Copy(c, c)
			}()
		}
	}()
	return done
}

// dialServed dials addr and reports whether the server served the
// connection (greeted it and echoes) or closed it, in which case what it
// read before EOF must be reject.
func dialServed(t *testing.T, addr string, reject []byte) (net.Conn, bool) {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	return c, readServed(t, c, reject)
}

func readServed(t *testing.T, c net.Conn, reject []byte) bool {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, len(greeting))
	n, err := io.ReadFull(c, buf)
	if err == nil && string(buf) == greeting {
		if _, err := c.Write([]byte("ping")); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(c, buf[:4]); err != nil || string(buf[:4]) != "ping" {
			t.Fatalf("served connection does not echo: %q, %v", buf[:4], err)
		}
		return true
	}
	if err != nil && err != io.EOF && err != io.ErrUnexpectedEOF {
		t.Fatalf("read: %v", err)
	}
	rest, err := io.ReadAll(c)
	if err != nil {
		t.Fatalf("read rejected connection: %v", err)
	}
	if got := append(buf[:n], rest...); !bytes.Equal(got, reject) {
		t.Fatalf("rejected connection read %q, want %q", got, reject)
	}
	c.Close()
	return false
}

func TestListenerCap(t *testing.T) {
	canned := []byte("HTTP/1.1 503 Service Unavailable\r\nConnection: close\r\nContent-Length: 0\r\n\r\n")
	for _, tc := range []struct {
		name    string
		max     int
		clients int
		reject  []byte
		served  int
	}{
		{"cap 10 of 30 with reject", 10, 30, canned, 10},
		{"cap 10 of 30 plain close", 10, 30, nil, 10},
		{"cap 1 of 5", 1, 5, canned, 1},
		{"no cap", 0, 30, canned, 30},
		{"negative is no cap", -1, 12, nil, 12},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ln := NewListener(listenLoopback(t), tc.max)
			ln.Reject = tc.reject
			var onReject atomic.Int64
			ln.OnReject = func() { onReject.Add(1) }
			done := serveEcho(ln)
			addr := ln.Addr().String()

			// Dial them all before reading any, so that the accept loop
			// sees 30 connections at once.
			conns := make([]net.Conn, tc.clients)
			for i := range conns {
				c, err := net.DialTimeout("tcp", addr, 5*time.Second)
				if err != nil {
					t.Fatal(err)
				}
				conns[i] = c
			}
			var served []net.Conn
			for _, c := range conns {
				if readServed(t, c, tc.reject) {
					served = append(served, c)
				}
			}
			if len(served) != tc.served {
				t.Fatalf("served %d connections, want %d", len(served), tc.served)
			}
			wantRejected := tc.clients - tc.served
			waitFor(t, 5*time.Second, "counters", func() bool {
				return ln.Open() == tc.served && ln.Rejected() == uint64(wantRejected) &&
					onReject.Load() == int64(wantRejected)
			})

			if tc.max > 0 {
				// A new client is turned away while the cap is full ...
				if c, ok := dialServed(t, addr, tc.reject); ok {
					c.Close()
					t.Fatal("connection past the full cap was served")
				}
				// ... and served once a served one closes.
				served[0].Close()
				served = served[1:]
				waitFor(t, 5*time.Second, "slot freed", func() bool { return ln.Open() == tc.served-1 })
				c, ok := dialServed(t, addr, tc.reject)
				if !ok {
					t.Fatal("connection not served after a slot was freed")
				}
				served = append(served, c)
				waitFor(t, 5*time.Second, "open back at cap", func() bool { return ln.Open() == tc.served })
			}

			for _, c := range served {
				c.Close()
			}
			waitFor(t, 5*time.Second, "all slots freed", func() bool { return ln.Open() == 0 })
			ln.Close()
			select {
			case err := <-done:
				if !errors.Is(err, net.ErrClosed) {
					t.Fatalf("Accept after Close: %v, want net.ErrClosed", err)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("Accept did not return after Close")
			}
		})
	}
}

// fakeListener returns errs in turn from Accept, then conns, then blocks
// until closed. With sticky, it returns the last error for ever, even after
// Close.
type fakeListener struct {
	mu     sync.Mutex
	errs   []error
	sticky bool
	conns  []net.Conn
	calls  []time.Time
	closed chan struct{}
	once   sync.Once
}

func newFake(errs ...error) *fakeListener {
	return &fakeListener{errs: errs, closed: make(chan struct{})}
}

func (f *fakeListener) Accept() (net.Conn, error) {
	f.mu.Lock()
	f.calls = append(f.calls, time.Now())
	if len(f.errs) > 0 {
		err := f.errs[0]
		if !f.sticky || len(f.errs) > 1 {
			f.errs = f.errs[1:]
		}
		f.mu.Unlock()
		return nil, err
	}
	if len(f.conns) > 0 {
		c := f.conns[0]
		f.conns = f.conns[1:]
		f.mu.Unlock()
		return c, nil
	}
	f.mu.Unlock()
	<-f.closed
	return nil, &net.OpError{Op: "accept", Net: "tcp", Err: net.ErrClosed}
}

func (f *fakeListener) push(errs []error, c net.Conn) {
	f.mu.Lock()
	f.errs = append(f.errs, errs...)
	if c != nil {
		f.conns = append(f.conns, c)
	}
	f.mu.Unlock()
}

func (f *fakeListener) Close() error {
	f.once.Do(func() { close(f.closed) })
	return nil
}

func (f *fakeListener) Addr() net.Addr { return &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)} }

func acceptErr(errno syscall.Errno) error {
	return &net.OpError{Op: "accept", Net: "tcp", Err: os.NewSyscallError("accept4", errno)}
}

type timeoutErr struct{}

func (timeoutErr) Error() string   { return "i/o timeout" }
func (timeoutErr) Timeout() bool   { return true }
func (timeoutErr) Temporary() bool { return true }

func TestAcceptErrors(t *testing.T) {
	for _, tc := range []struct {
		err   error
		retry bool
	}{
		{acceptErr(syscall.EMFILE), true},
		{acceptErr(syscall.ENFILE), true},
		{acceptErr(syscall.ENOBUFS), true},
		{acceptErr(syscall.ENOMEM), true},
		{acceptErr(syscall.ECONNABORTED), true},
		{acceptErr(syscall.EPERM), true},
		{acceptErr(syscall.EPROTO), true},
		{syscall.EMFILE, true},
		{acceptErr(syscall.EINVAL), false},
		{acceptErr(syscall.EBADF), false},
		{&net.OpError{Op: "accept", Net: "tcp", Err: net.ErrClosed}, false},
		{&net.OpError{Op: "accept", Net: "tcp", Err: timeoutErr{}}, false},
		{errors.New("boom"), false},
	} {
		t.Run(tc.err.Error(), func(t *testing.T) {
			a, b := net.Pipe()
			defer a.Close()
			defer b.Close()
			fake := newFake(tc.err)
			fake.push(nil, a)
			ln := NewListener(fake, 0)
			var seen []error
			ln.OnError = func(err error) { seen = append(seen, err) }

			c, err := ln.Accept()
			if tc.retry {
				if err != nil {
					t.Fatalf("Accept returned %v, want it retried", err)
				}
				if c.(interface{ Unwrap() net.Conn }).Unwrap() != a {
					t.Fatal("Accept returned another connection")
				}
				if ln.Retried() != 1 || len(seen) != 1 || seen[0] != tc.err {
					t.Fatalf("Retried %d, OnError saw %v; want the one error", ln.Retried(), seen)
				}
				if ln.Open() != 1 {
					t.Fatalf("Open %d, want 1", ln.Open())
				}
				c.Close()
			} else {
				if err != tc.err {
					t.Fatalf("Accept returned %v, %v; want the error %v", c, err, tc.err)
				}
				if ln.Retried() != 0 || len(seen) != 0 {
					t.Fatalf("Retried %d, OnError saw %v; want none", ln.Retried(), seen)
				}
			}
		})
	}
}

func TestAcceptBackoff(t *testing.T) {
	emfile := acceptErr(syscall.EMFILE)
	errs := make([]error, 7)
	for i := range errs {
		errs[i] = emfile
	}
	a, b := net.Pipe()
	defer b.Close()
	fake := newFake(errs...)
	fake.push(nil, a)
	ln := NewListener(fake, 0)

	c, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	fake.mu.Lock()
	calls := fake.calls
	fake.calls = nil
	fake.mu.Unlock()
	if len(calls) != 8 {
		t.Fatalf("%d inner accepts, want 8", len(calls))
	}
	want := minBackoff
	for i := 1; i < len(calls); i++ {
		if gap := calls[i].Sub(calls[i-1]); gap < want {
			t.Errorf("retry %d after %v, want at least %v", i, gap, want)
		}
		want *= 2
	}

	// After a success the back-off starts over at 5 ms rather than 640 ms.
	a2, b2 := net.Pipe()
	defer b2.Close()
	fake.push([]error{emfile}, a2)
	if c, err = ln.Accept(); err != nil {
		t.Fatal(err)
	}
	c.Close()
	if gap := fake.calls[1].Sub(fake.calls[0]); gap < minBackoff || gap > 300*time.Millisecond {
		t.Errorf("first retry after a success waited %v, want about %v", gap, minBackoff)
	}
	if ln.Retried() != 8 {
		t.Errorf("Retried %d, want 8", ln.Retried())
	}

	// The back-off is capped at 1 s.
	d := time.Duration(0)
	for range 20 {
		d = min(max(2*d, minBackoff), maxBackoff)
	}
	if d != maxBackoff {
		t.Errorf("back-off grows to %v, want %v", d, maxBackoff)
	}
}

func TestCloseEndsBackoff(t *testing.T) {
	fake := newFake(acceptErr(syscall.EMFILE))
	fake.sticky = true // an inner listener that fails for ever, even closed
	ln := NewListener(fake, 0)
	closeEndsAccept(t, ln, "retries", func() bool { return ln.Retried() >= 3 })
}

// closeEndsAccept closes ln once retrying holds, while an Accept waits,
// and fails unless that Accept and the next return net.ErrClosed.
func closeEndsAccept(t *testing.T, ln net.Listener, what string, retrying func() bool) {
	t.Helper()
	res := make(chan error, 1)
	go func() {
		_, err := ln.Accept()
		res <- err
	}()
	waitFor(t, 5*time.Second, what, retrying)
	ln.Close()
	select {
	case err := <-res:
		if !errors.Is(err, net.ErrClosed) {
			t.Fatalf("Accept returned %v, want net.ErrClosed", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Accept did not return after Close")
	}
	// A closed listener does not retry again.
	if _, err := ln.Accept(); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Accept on a closed listener: %v", err)
	}
}

const childEnv = "NETGUARD_TEST_CHILD"

// inChild runs the test named test in a child process with childEnv set to
// mode, since what it does to the descriptor limit must not reach the other
// tests, and fails unless the child passes and prints done.
func inChild(t *testing.T, test, mode, done string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^"+test+"$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), childEnv+"="+mode)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("child: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), done) {
		t.Fatalf("child did not reach the end:\n%s", out)
	}
	t.Logf("child:\n%s", out)
}

// setSoftNoFile sets the soft descriptor limit, keeping the hard one.
func setSoftNoFile(t *testing.T, soft uint64) syscall.Rlimit {
	t.Helper()
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	if lim.Max < soft+2 {
		t.Skipf("hard descriptor limit %d too low", lim.Max)
	}
	lim.Cur = soft
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	return lim
}

// TestAcceptEMFILE runs a child process with a small descriptor limit that
// fills its descriptor table while a client waits in the backlog.
func TestAcceptEMFILE(t *testing.T) {
	if os.Getenv(childEnv) == "emfile" {
		emfileChild(t)
		return
	}
	inChild(t, "TestAcceptEMFILE", "emfile", "EMFILE recovered")
}

func emfileChild(t *testing.T) {
	setSoftNoFile(t, 64)

	ln := NewListener(listenLoopback(t), 0)
	errs := make(chan error, 64)
	ln.OnError = func(err error) {
		select {
		case errs <- err:
		default:
		}
	}
	returned := make(chan error, 1)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				returned <- err
				return
			}
			c.Write([]byte("ok"))
			c.Close()
		}
	}()

	held, served := shortOfDescriptors(t, ln, errs, returned)
	defer func() {
		for _, f := range held {
			f.Close()
		}
	}()
	waitFor(t, 5*time.Second, "retries", func() bool { return ln.Retried() >= 3 })
	select {
	case err := <-returned:
		t.Fatalf("Accept returned %v while out of descriptors", err)
	default:
	}
	t.Logf("retried %d times out of descriptors", ln.Retried())

	// Free the descriptors: the client waiting in the backlog is served.
	for _, f := range held {
		f.Close()
	}
	held = nil
	if err := <-served; err != nil {
		t.Fatalf("client not served after descriptors freed: %v", err)
	}
	ln.Close()
	select {
	case err := <-returned:
		if !errors.Is(err, net.ErrClosed) {
			t.Fatalf("Accept after Close: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Accept did not return after Close")
	}
	fmt.Println("EMFILE recovered")
}

// shortOfDescriptors holds every free descriptor but one, dials ln with
// that one, and returns once Accept met EMFILE with the client waiting in
// the backlog: the descriptors held (the caller closes them), and what the
// client's read of its greeting ends in.
func shortOfDescriptors(t *testing.T, ln *Listener, errs, returned <-chan error) (held []*os.File, served chan error) {
	// Hold every free descriptor, then give one back for the client. The
	// runtime may hold a descriptor of its own for a moment meanwhile (seen
	// about once in 100 runs): the one given back is then taken before the
	// dial, or one more comes free and Accept never runs short. The setup
	// is tried again then, a few times at most.
	for try := 1; ; try++ {
		for {
			f, err := os.Open(os.DevNull)
			if err != nil {
				if !errors.Is(err, syscall.EMFILE) {
					t.Fatalf("filling descriptors: %v", err)
				}
				break
			}
			held = append(held, f)
			if len(held) > 1000 {
				t.Fatal("descriptor limit not in force")
			}
		}
		t.Logf("held %d descriptors", len(held))
		held[len(held)-1].Close()
		held = held[:len(held)-1]
		client, err := net.DialTimeout("tcp", ln.Addr().String(), 5*time.Second)
		if err == nil {
			t.Cleanup(func() { client.Close() })
			served = make(chan error, 1)
			go func() {
				client.SetReadDeadline(time.Now().Add(30 * time.Second))
				buf := make([]byte, 2)
				if _, err := io.ReadFull(client, buf); err != nil || string(buf) != "ok" {
					served <- fmt.Errorf("read %q, %v", buf, err)
					return
				}
				served <- nil
			}()
			select {
			case err := <-errs:
				if !errors.Is(err, syscall.EMFILE) {
					t.Fatalf("OnError saw %v, want EMFILE", err)
				}
			case err := <-returned:
				t.Fatalf("Accept returned %v", err)
			case err := <-served:
				if err != nil {
					t.Fatalf("the client, served with a descriptor free: %v", err)
				}
				served = nil // a descriptor was free after all
			case <-time.After(5 * time.Second):
				t.Fatal("Accept never hit EMFILE")
			}
		} else if !errors.Is(err, syscall.EMFILE) {
			t.Fatalf("dial: %v", err)
		}
		if served != nil {
			break
		}
		if try == 5 {
			t.Fatalf("no try of 5 had Accept short of descriptors with the client waiting (the last dial: %v)", err)
		}
	}
	return held, served
}

func TestConnInterfaces(t *testing.T) {
	t.Run("tcp", func(t *testing.T) {
		ln := NewListener(listenLoopback(t), 4)
		defer ln.Close()
		client, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer client.Close()
		c, err := ln.Accept()
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := c.(interface{ Unwrap() net.Conn }).Unwrap().(*net.TCPConn); !ok {
			t.Fatal("Unwrap does not give the *net.TCPConn")
		}
		sc, ok := c.(syscall.Conn)
		if !ok {
			t.Fatal("wrapped TCP conn is not a syscall.Conn")
		}
		rc, err := sc.SyscallConn()
		if err != nil {
			t.Fatal(err)
		}
		var fd uintptr
		if err := rc.Control(func(f uintptr) { fd = f }); err != nil || fd == 0 {
			t.Fatalf("Control: fd %d, %v", fd, err)
		}
		rf, ok := c.(io.ReaderFrom)
		if !ok {
			t.Fatal("wrapped TCP conn is not an io.ReaderFrom")
		}
		if n, err := rf.ReadFrom(strings.NewReader("via ReadFrom")); err != nil || n != 12 {
			t.Fatalf("ReadFrom: %d, %v", n, err)
		}
		buf := make([]byte, 12)
		client.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := io.ReadFull(client, buf); err != nil || string(buf) != "via ReadFrom" {
			t.Fatalf("client read %q, %v", buf, err)
		}

		if ln.Open() != 1 {
			t.Fatalf("Open %d, want 1", ln.Open())
		}
		if err := c.Close(); err != nil {
			t.Fatal(err)
		}
		for range 3 {
			if err := c.Close(); !errors.Is(err, net.ErrClosed) {
				t.Fatalf("second Close: %v", err)
			}
		}
		if ln.Open() != 0 {
			t.Fatalf("Open %d after closing twice, want 0", ln.Open())
		}
	})

	t.Run("pipe", func(t *testing.T) {
		a, b := net.Pipe()
		defer b.Close()
		fake := newFake()
		fake.push(nil, a)
		ln := NewListener(fake, 0)
		c, err := ln.Accept()
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := c.(syscall.Conn); ok {
			t.Fatal("wrapped pipe claims syscall.Conn")
		}
		if c.(interface{ Unwrap() net.Conn }).Unwrap() != a {
			t.Fatal("Unwrap does not give the inner conn")
		}
		got := make(chan string, 1)
		go func() {
			buf, _ := io.ReadAll(b)
			got <- string(buf)
		}()
		if n, err := c.(io.ReaderFrom).ReadFrom(strings.NewReader("copied")); err != nil || n != 6 {
			t.Fatalf("ReadFrom: %d, %v", n, err)
		}
		c.Close()
		c.Close()
		if s := <-got; s != "copied" {
			t.Fatalf("peer read %q", s)
		}
		if ln.Open() != 0 {
			t.Fatalf("Open %d, want 0", ln.Open())
		}
	})
}

func TestDefaultMaxConns(t *testing.T) {
	for _, tc := range []struct {
		nofile uint64
		want   int
	}{
		{0, 64},
		{64, 64},
		{1024, 64},
		{1088, 64},
		{1089, 65},
		{4096, 3072},
		{8192, 6144},
		{65536, 49152},
		{1 << 20, 786432},
		{math.MaxUint64, math.MaxInt},
	} {
		if got := DefaultMaxConns(tc.nofile); got != tc.want {
			t.Errorf("DefaultMaxConns(%d) = %d, want %d", tc.nofile, got, tc.want)
		}
	}
}

func TestRaiseNoFileLimit(t *testing.T) {
	switch os.Getenv(childEnv) {
	case "":
		t.Run("as started", func(t *testing.T) {
			got, err := RaiseNoFileLimit()
			if err != nil {
				t.Fatal(err)
			}
			var lim syscall.Rlimit
			if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
				t.Fatal(err)
			}
			if got != uint64(lim.Cur) || got+1 < uint64(lim.Max) {
				t.Fatalf("RaiseNoFileLimit = %d; rlimit now %d of %d", got, lim.Cur, lim.Max)
			}
		})
		t.Run("from 64", func(t *testing.T) {
			inChild(t, "TestRaiseNoFileLimit", "raise", "raised to hard limit")
		})
	case "raise":
		lim := setSoftNoFile(t, 64)
		got, err := RaiseNoFileLimit()
		if err != nil {
			t.Fatal(err)
		}
		var now syscall.Rlimit
		if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &now); err != nil {
			t.Fatal(err)
		}
		if got != uint64(lim.Max) || now.Cur != lim.Max {
			t.Fatalf("RaiseNoFileLimit = %d, soft limit now %d; want the hard limit %d", got, now.Cur, lim.Max)
		}
		fmt.Println("raised to hard limit")
	}
}

func (b *Budget) waiting() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.waiters.Len()
}

// acquireAsync runs Acquire in a goroutine and returns its result channel.
func acquireAsync(ctx context.Context, b *Budget, n int64) <-chan error {
	res := make(chan error, 1)
	go func() { res <- b.Acquire(ctx, n) }()
	return res
}

func recv(t *testing.T, res <-chan error) error {
	t.Helper()
	select {
	case err := <-res:
		return err
	case <-time.After(5 * time.Second):
		t.Fatal("Acquire did not return")
		return nil
	}
}

func notYet(t *testing.T, res <-chan error) {
	t.Helper()
	select {
	case err := <-res:
		t.Fatalf("Acquire returned %v, want it waiting", err)
	default:
	}
}

func TestBudgetHighWater(t *testing.T) {
	const max = 100
	b := NewBudget(max)
	var held, high atomic.Int64
	var wg sync.WaitGroup
	for g := range 32 {
		wg.Go(func() {
			for i := range 200 {
				n := int64((g*7+i*13)%150 + 1) // some above max: clamped
				if err := b.Acquire(context.Background(), n); err != nil {
					t.Error(err)
					return
				}
				cur := held.Add(min(n, max))
				for h := high.Load(); cur > h && !high.CompareAndSwap(h, cur); h = high.Load() {
				}
				if in := b.InUse(); in > max {
					t.Errorf("InUse %d over max", in)
				}
				if i%4 == 0 {
					time.Sleep(10 * time.Microsecond)
				}
				held.Add(-min(n, max))
				b.Release(n)
			}
		})
	}
	wg.Wait()
	if h := high.Load(); h > max || h == 0 {
		t.Fatalf("high-water mark %d, want in (0, %d]", h, max)
	}
	if b.InUse() != 0 || b.waiting() != 0 {
		t.Fatalf("InUse %d, %d waiting after all released", b.InUse(), b.waiting())
	}
}

func TestBudgetCancel(t *testing.T) {
	for _, tc := range []struct {
		name string
		// ctx is the waiter's context and what ends it, called once it
		// waits: a deadline timed by the test, not by the clock, which a
		// loaded machine could let pass before the waiter began to wait.
		ctx  func() (context.Context, func())
		want error
	}{
		{"cancel", func() (context.Context, func()) {
			return context.WithCancel(context.Background())
		}, context.Canceled},
		{"deadline", func() (context.Context, func()) {
			ctx := &deadlineCtx{Context: context.Background(), done: make(chan struct{})}
			return ctx, func() { close(ctx.done) }
		}, context.DeadlineExceeded},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := NewBudget(10)
			if err := b.Acquire(context.Background(), 8); err != nil {
				t.Fatal(err)
			}
			ctx, end := tc.ctx()
			res := acquireAsync(ctx, b, 5)
			waitFor(t, 5*time.Second, "waiter", func() bool { return b.waiting() == 1 })
			end()
			if err := recv(t, res); !errors.Is(err, tc.want) {
				t.Fatalf("Acquire: %v, want %v", err, tc.want)
			}
			if b.InUse() != 8 || b.waiting() != 0 {
				t.Fatalf("InUse %d, %d waiting after cancel; want 8, 0", b.InUse(), b.waiting())
			}
			b.Release(8)
			if b.InUse() != 0 {
				t.Fatalf("InUse %d, want 0", b.InUse())
			}
			// What the canceled waiter held back is all available.
			if err := b.Acquire(context.Background(), 10); err != nil {
				t.Fatal(err)
			}
			b.Release(10)
		})
	}
}

// TestBudgetCancelRace cancels waiters while releases grant them.
func TestBudgetCancelRace(t *testing.T) {
	b := NewBudget(10)
	for range 300 {
		if err := b.Acquire(context.Background(), 10); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		res := acquireAsync(ctx, b, 5)
		waitFor(t, 5*time.Second, "waiter", func() bool { return b.waiting() == 1 })
		go cancel()
		b.Release(10)
		switch err := recv(t, res); {
		case err == nil:
			b.Release(5)
		case !errors.Is(err, context.Canceled):
			t.Fatalf("Acquire: %v", err)
		}
		cancel()
		if b.InUse() != 0 || b.waiting() != 0 {
			t.Fatalf("InUse %d, %d waiting; want 0, 0", b.InUse(), b.waiting())
		}
	}
}

func TestBudgetClamp(t *testing.T) {
	b := NewBudget(100)
	if err := b.Acquire(context.Background(), 500); err != nil {
		t.Fatal(err)
	}
	if b.InUse() != 100 {
		t.Fatalf("InUse %d after oversize acquire, want 100", b.InUse())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	if err := b.Acquire(ctx, 1); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Acquire with budget spent: %v", err)
	}
	b.Release(500)
	if b.InUse() != 0 {
		t.Fatalf("InUse %d after releasing the oversize request, want 0", b.InUse())
	}

	// An oversize request waits until nothing else is held, then runs.
	if err := b.Acquire(context.Background(), 1); err != nil {
		t.Fatal(err)
	}
	res := acquireAsync(context.Background(), b, 1<<40)
	waitFor(t, 5*time.Second, "oversize waiter", func() bool { return b.waiting() == 1 })
	notYet(t, res)
	b.Release(1)
	if err := recv(t, res); err != nil {
		t.Fatal(err)
	}
	if b.InUse() != 100 {
		t.Fatalf("InUse %d, want 100", b.InUse())
	}
	b.Release(1 << 40)
	if b.InUse() != 0 {
		t.Fatalf("InUse %d, want 0", b.InUse())
	}
}

func TestBudgetSmallPassesLarge(t *testing.T) {
	b := NewBudget(100)
	bg := context.Background()
	if err := b.Acquire(bg, 60); err != nil {
		t.Fatal(err)
	}
	large := acquireAsync(bg, b, 80)
	waitFor(t, 5*time.Second, "large waiter", func() bool { return b.waiting() == 1 })

	// A small request that fits does not queue behind the large one.
	if err := recv(t, acquireAsync(bg, b, 30)); err != nil {
		t.Fatal(err)
	}
	// One that does not fit waits, and a release that frees enough for it
	// but not for the large one wakes it.
	small := acquireAsync(bg, b, 20)
	waitFor(t, 5*time.Second, "small waiter", func() bool { return b.waiting() == 2 })
	b.Release(30)
	if err := recv(t, small); err != nil {
		t.Fatal(err)
	}
	notYet(t, large)
	if b.InUse() != 80 || b.waiting() != 1 {
		t.Fatalf("InUse %d, %d waiting; want 80, 1", b.InUse(), b.waiting())
	}
	b.Release(60)
	b.Release(20)
	if err := recv(t, large); err != nil {
		t.Fatal(err)
	}
	b.Release(80)
	if b.InUse() != 0 || b.waiting() != 0 {
		t.Fatalf("InUse %d, %d waiting; want 0, 0", b.InUse(), b.waiting())
	}
}

// An ordered budget serves its waiters in order: a small request that
// fits waits behind a large one (which a steady stream of small ones would
// otherwise keep out for good), the large one is served once the bytes
// before it come back, and a waiter that gives up lets those behind it in.
func TestOrderedBudgetServesInOrder(t *testing.T) {
	b := NewOrderedBudget(100)
	bg := context.Background()
	if err := b.Acquire(bg, 60); err != nil {
		t.Fatal(err)
	}
	large := acquireAsync(bg, b, 80)
	waitFor(t, 5*time.Second, "large waiter", func() bool { return b.waiting() == 1 })
	if b.TryAcquire(30) {
		t.Fatal("TryAcquire passed a waiter")
	}
	small := acquireAsync(bg, b, 30)
	waitFor(t, 5*time.Second, "small waiter", func() bool { return b.waiting() == 2 })
	notYet(t, small)
	b.Release(60)
	if err := recv(t, large); err != nil {
		t.Fatal(err)
	}
	notYet(t, small) // 20 free: not its 30
	b.Release(80)
	if err := recv(t, small); err != nil {
		t.Fatal(err)
	}

	// A waiter at the head that gives up lets a smaller one behind it in.
	gives, cancel := context.WithCancel(bg)
	big := acquireAsync(gives, b, 90)
	waitFor(t, 5*time.Second, "big waiter", func() bool { return b.waiting() == 1 })
	behind := acquireAsync(bg, b, 40)
	waitFor(t, 5*time.Second, "waiter behind", func() bool { return b.waiting() == 2 })
	notYet(t, behind)
	cancel()
	if err := recv(t, big); err == nil {
		t.Fatal("a cancelled waiter was granted")
	}
	if err := recv(t, behind); err != nil {
		t.Fatal(err)
	}
	b.Release(30)
	b.Release(40)
	if b.InUse() != 0 || b.waiting() != 0 {
		t.Fatalf("InUse %d, %d waiting; want 0, 0", b.InUse(), b.waiting())
	}
}

func TestBudgetReleaseGrantsSeveral(t *testing.T) {
	b := NewBudget(100)
	bg := context.Background()
	if err := b.Acquire(bg, 100); err != nil {
		t.Fatal(err)
	}
	var res []<-chan error
	for range 4 {
		res = append(res, acquireAsync(bg, b, 25))
	}
	waitFor(t, 5*time.Second, "waiters", func() bool { return b.waiting() == 4 })
	b.Release(100)
	for _, r := range res {
		if err := recv(t, r); err != nil {
			t.Fatal(err)
		}
	}
	if b.InUse() != 100 {
		t.Fatalf("InUse %d, want 100", b.InUse())
	}
}

func TestBudgetUnlimited(t *testing.T) {
	canceled, cancel := context.WithCancel(context.Background())
	cancel()
	for _, tc := range []struct {
		name string
		b    *Budget
	}{
		{"zero", NewBudget(0)},
		{"negative", NewBudget(-1)},
		{"nil", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := tc.b
			if b.Max() != 0 {
				t.Fatalf("Max %d, want 0", b.Max())
			}
			for range 3 {
				if err := b.Acquire(canceled, 1<<40); err != nil {
					t.Fatal(err)
				}
			}
			if want := int64(3 << 40); b != nil && b.InUse() != want {
				t.Fatalf("InUse %d, want %d", b.InUse(), want)
			}
			for range 3 {
				b.Release(1 << 40)
			}
			if b.InUse() != 0 {
				t.Fatalf("InUse %d, want 0", b.InUse())
			}
		})
	}
}

func TestBudgetAcquireFitsDespiteDoneCtx(t *testing.T) {
	canceled, cancel := context.WithCancel(context.Background())
	cancel()
	b := NewBudget(10)
	if err := b.Acquire(canceled, 10); err != nil {
		t.Fatalf("Acquire that fits: %v", err)
	}
	if err := b.Acquire(canceled, 1); !errors.Is(err, context.Canceled) {
		t.Fatalf("Acquire that must wait: %v", err)
	}
	if b.Acquire(canceled, 0) != nil || b.Acquire(canceled, -5) != nil {
		t.Fatal("Acquire of nothing failed")
	}
	b.Release(0)
	b.Release(-5)
	b.Release(10)
	if b.InUse() != 0 || b.waiting() != 0 {
		t.Fatalf("InUse %d, %d waiting", b.InUse(), b.waiting())
	}
}

func TestBudgetOverRelease(t *testing.T) {
	for _, max := range []int64{0, 10} {
		t.Run(fmt.Sprint(max), func(t *testing.T) {
			b := NewBudget(max)
			if err := b.Acquire(context.Background(), 3); err != nil {
				t.Fatal(err)
			}
			defer func() {
				if recover() == nil {
					t.Fatal("releasing more than held did not panic")
				}
			}()
			b.Release(4)
		})
	}
}

func TestBudgetTryAcquire(t *testing.T) {
	b := NewBudget(100)
	steps := []struct {
		try   int64 // > 0: TryAcquire; < 0: Release(-try)
		ok    bool
		inUse int64
	}{
		{60, true, 60},
		{50, false, 60}, // does not fit: nothing taken
		{40, true, 100},
		{-60, true, 40},
		{500, false, 40}, // clamped to the whole budget, which 40 bytes already hold
		{-40, true, 0},
		{500, true, 100}, // alone it runs, clamped
		{-500, true, 0},
	}
	for i, s := range steps {
		ok := true
		if s.try > 0 {
			ok = b.TryAcquire(s.try)
		} else {
			b.Release(-s.try)
		}
		if ok != s.ok || b.InUse() != s.inUse {
			t.Fatalf("step %d (%d): ok %v in use %d, want %v %d", i, s.try, ok, b.InUse(), s.ok, s.inUse)
		}
	}
	if !(*Budget)(nil).TryAcquire(1<<40) || !NewBudget(0).TryAcquire(1<<40) {
		t.Fatal("an unlimited budget refused")
	}
}

// One client address holds at most PerClient connections: the next is
// turned away with Reject while another address is still served, and a
// slot comes back when one of its connections closes.
func TestListenerPerClientCap(t *testing.T) {
	canned := []byte("HTTP/1.1 429 Too Many Requests\r\nConnection: close\r\nContent-Length: 0\r\n\r\n")
	ln := NewListener(listenLoopback(t), 100)
	ln.PerClient = 3
	ln.Reject = canned
	done := serveEcho(ln)
	addr := ln.Addr().String()
	var served []net.Conn
	for i := 0; i < 3; i++ {
		c, ok := dialServed(t, addr, canned)
		if !ok {
			t.Fatalf("connection %d of 3 was not served", i+1)
		}
		served = append(served, c)
	}
	if c, ok := dialServed(t, addr, canned); ok {
		c.Close()
		t.Fatal("a 4th connection from one client was served")
	}
	// Another address (127.0.0.2 is loopback too) is not this client.
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 2)}, Timeout: 5 * time.Second}
	if c, err := d.Dial("tcp", addr); err == nil {
		if !readServed(t, c, canned) {
			t.Fatal("another client's connection was turned away")
		}
		c.Close()
	} else {
		t.Logf("no second loopback address here (%v); that part skipped", err)
	}
	served[0].Close()
	waitFor(t, 5*time.Second, "the client's slot freed", func() bool { return ln.Open() == 2 })
	c, ok := dialServed(t, addr, canned)
	if !ok {
		t.Fatal("not served after one of the client's connections closed")
	}
	served = append(served[1:], c)
	for _, c := range served {
		c.Close()
	}
	waitFor(t, 5*time.Second, "all closed", func() bool { return ln.Open() == 0 })
	ln.Close()
	<-done
}

func TestClientKey(t *testing.T) {
	for _, tt := range []struct {
		addr net.Addr
		want string
	}{
		{&net.TCPAddr{IP: net.IPv4(10, 1, 2, 3), Port: 5}, "10.1.2.3"},
		{&net.TCPAddr{IP: net.ParseIP("::ffff:10.1.2.3"), Port: 5}, "10.1.2.3"},
		{&net.TCPAddr{IP: net.ParseIP("2001:db8:1:2:aaaa::1"), Port: 5}, "2001:db8:1:2::/64"},
		{&net.TCPAddr{IP: net.ParseIP("2001:db8:1:2:bbbb::9"), Port: 7}, "2001:db8:1:2::/64"},
		{&net.UnixAddr{Name: "", Net: "unix"}, "?"},
		{&net.TCPAddr{Port: 4}, "?"}, // was ":4", a key per connection
		{(*net.TCPAddr)(nil), "?"},   // panicked
	} {
		if got := ClientKey(tt.addr); got != tt.want {
			t.Errorf("ClientKey(%v) = %q, want %q", tt.addr, got, tt.want)
		}
	}
}

// TestListenerShare: two listeners of one server under one cap. The first
// listener's connections fill the cap for the second (and back), each
// closed connection frees a slot for either, and the per-client cap counts
// across both.
func TestListenerShare(t *testing.T) {
	reject := []byte("full\n")
	for _, tc := range []struct {
		name           string
		max, perClient int
		first, second  int // connections dialled to each, in that order
		served         int // of the second's
	}{
		{"cap 4: 3 on the first leave 1", 4, 0, 3, 3, 1},
		{"cap 4: 4 on the first leave none", 4, 0, 4, 2, 0},
		{"per client 2: 1 on the first leaves 1", 0, 2, 1, 3, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := &Listener{Listener: listenLoopback(t), Max: tc.max, PerClient: tc.perClient, Reject: reject}
			b := &Listener{Listener: listenLoopback(t), Share: a, Max: 1000, PerClient: 1000, Reject: reject}
			serveEcho(a)
			serveEcho(b)
			defer a.Close()
			defer b.Close()
			var open []net.Conn
			for range tc.first {
				c, ok := dialServed(t, a.Addr().String(), reject)
				if !ok {
					t.Fatal("the first listener refused a connection under the cap")
				}
				open = append(open, c)
			}
			served := 0
			for range tc.second {
				if c, ok := dialServed(t, b.Addr().String(), reject); ok {
					open = append(open, c)
					served++
				}
			}
			if served != tc.served {
				t.Fatalf("the second listener served %d, want %d", served, tc.served)
			}
			if a.Open() != b.Open() || a.Open() != tc.first+served {
				t.Fatalf("open: first %d, second %d, want both %d", a.Open(), b.Open(), tc.first+served)
			}
			// A connection of the first closed: the second serves one more.
			open[0].Close()
			waitFor(t, 5*time.Second, "the slot to free", func() bool { return b.Open() == tc.first+served-1 })
			c, ok := dialServed(t, b.Addr().String(), reject)
			if !ok {
				t.Fatal("a freed slot was not given to the second listener")
			}
			c.Close()
			for _, c := range open[1:] {
				c.Close()
			}
		})
	}
}

// A connection marked by Linger and closed with the client's bytes unread
// shuts its write side first and drops what still arrives: the client
// finishes writing and reads the whole answer, and the slot is freed once
// the client closes (or the linger bounds run out).
func TestLingerDeliversAnswerToSendingClient(t *testing.T) {
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln := NewListener(inner, 0)
	defer ln.Close()
	for _, mark := range []func(net.Conn) net.Conn{
		func(c net.Conn) net.Conn { return c },
		func(c net.Conn) net.Conn { return tlsLike{c} }, // reached through NetConn
	} {
		go func() {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			io.ReadFull(c, make([]byte, 16)) // a request's head, the body unread
			c.Write([]byte("answer"))
			if !Linger(mark(c)) {
				t.Error("Linger did not mark a Listener connection")
			}
			c.Close()
		}()
		cl, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		if _, err := cl.Write(bytes.Repeat([]byte{1}, 16<<20)); err != nil {
			t.Fatalf("client write: %v", err)
		}
		cl.(*net.TCPConn).CloseWrite()
		got, err := io.ReadAll(cl)
		if err != nil || string(got) != "answer" {
			t.Fatalf("client read %q, %v; want the answer", got, err)
		}
		cl.Close()
		waitFor(t, 5*time.Second, "the lingering connection's slot freed", func() bool { return ln.Open() == 0 })
	}
	if Linger(nil) || Linger(tlsLike{nil}) {
		t.Fatal("Linger marked a connection that is not a Listener's")
	}
}

// tlsLike wraps a connection the way *tls.Conn does, for Linger's unwrap.
type tlsLike struct{ net.Conn }

func (c tlsLike) NetConn() net.Conn { return c.Conn }

// addrPanicConn is a connection whose RemoteAddr panics (a bug under
// ClientKey) and that records its close.
type addrPanicConn struct {
	net.Conn
	closed atomic.Bool
}

func (*addrPanicConn) RemoteAddr() net.Addr { panic("a bug in RemoteAddr") }
func (c *addrPanicConn) Close() error       { c.closed.Store(true); return c.Conn.Close() }

// A panic in Accept after the connection was accepted and counted (a bug
// in ClientKey or OnReject), which a server may recover, closes that
// connection and gives back its slot: each one took a slot for good,
// until every client was refused.
func TestAcceptPanicGivesBackTheSlot(t *testing.T) {
	for _, tc := range []struct {
		name     string
		onReject func()
		conn     func(net.Conn) net.Conn
	}{
		{"client key", nil, func(c net.Conn) net.Conn { return &addrPanicConn{Conn: c} }},
		{"on reject", func() { panic("a bug in OnReject") }, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFake()
			defer f.Close()
			l := &Listener{Listener: f, Max: 1, PerClient: 1, OnReject: tc.onReject}
			var held net.Conn
			if tc.onReject != nil { // the one slot held: the next is rejected
				a, b := net.Pipe()
				defer b.Close()
				f.push(nil, a)
				c, err := l.Accept()
				if err != nil {
					t.Fatal(err)
				}
				held = c
			}
			a, b := net.Pipe()
			defer b.Close()
			var first net.Conn = a
			if tc.conn != nil {
				first = tc.conn(a)
			}
			f.push(nil, first)
			func() {
				defer func() {
					if v := recover(); v == nil {
						t.Fatal("Accept did not panic")
					}
				}()
				l.Accept()
			}()
			if held != nil {
				held.Close()
			}
			if n := l.Open(); n != 0 {
				t.Fatalf("Open() = %d after the panic: want 0, its slot given back", n)
			}
			b.SetReadDeadline(time.Now().Add(5 * time.Second))
			if _, err := b.Read(make([]byte, 1)); err != io.EOF {
				t.Errorf("the panicked connection's client reads %v: want EOF, its socket closed", err)
			}
			c, d := net.Pipe()
			defer d.Close()
			f.push(nil, c)
			next, err := l.Accept()
			if err != nil || l.Open() != 1 || l.Rejected() > 1 {
				t.Fatalf("the next connection: %v, open %d, rejected %d: want it admitted", err, l.Open(), l.Rejected())
			}
			next.Close()
		})
	}
}

// panicOnce's Accept panics at its first call.
type panicOnce struct {
	net.Listener
	done atomic.Bool
}

func (l *panicOnce) Accept() (net.Conn, error) {
	if l.done.CompareAndSwap(false, true) {
		panic("a bug in Accept")
	}
	return l.Listener.Accept()
}

// Recovered gives a panic in Accept to its callback and accepts again
// after a short pause: a server's accept loop (gRPC-Go's) recovered
// nothing, the process ended.
func TestRecoveredAccept(t *testing.T) {
	f := newFake()
	defer f.Close()
	a, b := net.Pipe()
	defer b.Close()
	f.push(nil, a)
	var got []any
	ln := Recovered(&panicOnce{Listener: f}, func(v any) { got = append(got, v) })
	c, err := ln.Accept()
	if err != nil || c != a || len(got) != 1 || got[0] != "a bug in Accept" {
		t.Fatalf("Accept: %v %v, panics %v: want the connection, one panic", c, err, got)
	}
	f.Close()
	if _, err := ln.Accept(); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Accept once closed: %v: want net.ErrClosed", err)
	}
}

// closePanicConn's Close panics once, before it closes the socket.
type closePanicConn struct {
	net.Conn
	once atomic.Bool
}

func (c *closePanicConn) Close() error {
	if c.once.CompareAndSwap(false, true) {
		panic("a bug in Close")
	}
	return c.Conn.Close()
}

// A panic in closing an admitted connection's socket, which a server may
// recover, still gives back its slots: Close had marked it closed, so a
// second Close closed the socket alone, the slot lost for good and, with a
// cap of 1, every later client refused.
func TestClosePanicGivesBackTheSlot(t *testing.T) {
	f := newFake()
	defer f.Close()
	l := &Listener{Listener: f, Max: 1, PerClient: 1}
	a, b := net.Pipe()
	defer b.Close()
	f.push(nil, &closePanicConn{Conn: a})
	c, err := l.Accept()
	if err != nil {
		t.Fatal(err)
	}
	func() {
		defer func() {
			if recover() == nil {
				t.Fatal("Close did not panic")
			}
		}()
		c.Close()
	}()
	c.Close() // as a server's recovery tries again; frees nothing twice
	if n := l.Open(); n != 0 {
		t.Fatalf("Open() = %d after the panicked close: want 0, its slot given back", n)
	}
	d, e := net.Pipe()
	defer e.Close()
	f.push(nil, d)
	next, err := l.Accept()
	if err != nil || l.Open() != 1 || l.Rejected() != 0 {
		t.Fatalf("the next connection: %v, open %d, rejected %d: want it admitted", err, l.Open(), l.Rejected())
	}
	next.Close()
	if n := l.Open(); n != 0 {
		t.Fatalf("Open() = %d once all closed: want 0", n)
	}
}

// panicAlways's Accept panics at every call, before the inner accept.
type panicAlways struct{ net.Listener }

func (panicAlways) Accept() (net.Conn, error) { panic("a bug in Accept") }

// Closing a Recovered listener whose every Accept panics before the inner
// accept ends its Accept with net.ErrClosed: it retried for ever, and a
// gRPC server's Stop, which waits for Serve to return, with it.
func TestRecoveredCloseEndsPanickingAccept(t *testing.T) {
	f := newFake()
	var panics atomic.Int32
	ln := Recovered(panicAlways{f}, func(any) { panics.Add(1) })
	closeEndsAccept(t, ln, "panics", func() bool { return panics.Load() >= 2 })
	ln.Close() // a second Close (a server's, after its Serve's) must not panic
}

// A panic in OnError, recovered by Recovered, keeps the accept back-off:
// each recovered panic started it over, so a descriptor shortage was
// retried every 10 ms (the recovery's pause), not 5 ms doubling to 1 s.
func TestOnErrorPanicKeepsTheBackoff(t *testing.T) {
	emfile := acceptErr(syscall.EMFILE)
	fake := newFake(emfile, emfile, emfile, emfile, emfile, emfile)
	a, b := net.Pipe()
	defer b.Close()
	fake.push(nil, a)
	var panics atomic.Int32
	l := &Listener{Listener: fake, OnError: func(error) { panic("a bug in OnError") }}
	c, err := Recovered(l, func(any) { panics.Add(1) }).Accept()
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	fake.mu.Lock()
	calls := fake.calls
	fake.mu.Unlock()
	if len(calls) != 7 || panics.Load() != 6 {
		t.Fatalf("%d inner accepts, %d panics: want 7, 6", len(calls), panics.Load())
	}
	want := minBackoff
	for i := 1; i < len(calls); i++ {
		if gap := calls[i].Sub(calls[i-1]); gap < want {
			t.Errorf("retry %d after %v, want at least %v", i, gap, want)
		}
		want *= 2
	}
	if d := l.backoff.Load(); d != 0 {
		t.Errorf("back-off %v left after a success: want it started over", time.Duration(d))
	}
}

// addrClosePanicConn's RemoteAddr panics, and so does its first Close.
type addrClosePanicConn struct{ closePanicConn }

func (*addrClosePanicConn) RemoteAddr() net.Addr { panic("a bug in RemoteAddr") }

// A panic in Accept after the connection's slot was taken gives the slot
// back even when closing that connection panics too: it was closed first,
// the slot lost with that second panic.
func TestAcceptPanicWhoseCloseFailsGivesBackTheSlot(t *testing.T) {
	f := newFake()
	defer f.Close()
	l := &Listener{Listener: f, Max: 1, PerClient: 1}
	a, b := net.Pipe()
	defer b.Close()
	f.push(nil, &addrClosePanicConn{closePanicConn{Conn: a}})
	func() {
		defer func() {
			if recover() == nil {
				t.Fatal("Accept did not panic")
			}
		}()
		l.Accept()
	}()
	if n := l.Open(); n != 0 {
		t.Fatalf("Open() = %d after the panics: want 0, the slot given back", n)
	}
}

// deadlineCtx is a context that ends as one past its deadline does
// (DeadlineExceeded) when done is closed.
type deadlineCtx struct {
	context.Context
	done chan struct{}
}

func (c *deadlineCtx) Done() <-chan struct{} { return c.done }
func (c *deadlineCtx) Err() error {
	select {
	case <-c.done:
		return context.DeadlineExceeded
	default:
		return nil
	}
}

// TakePast takes bytes past the budget (a body that must go on for others
// to have room): InUse passes Max, nobody else has room until it is back
// under, and Release gives them back in pieces of at most Max.
func TestTakePastHoldsOthersBack(t *testing.T) {
	b := NewBudget(100)
	if !b.TryAcquire(60) {
		t.Fatal("60 of 100 did not fit")
	}
	b.TakePast(90)
	if got := b.InUse(); got != 150 {
		t.Fatalf("InUse %d after 60 and 90 past, want 150", got)
	}
	if b.TryAcquire(1) {
		t.Fatal("a byte fit past the budget")
	}
	got := make(chan error, 1)
	go func() { got <- b.Acquire(context.Background(), 40) }()
	b.Release(90) // 60 left: the waiter's 40 fit
	if err := <-got; err != nil {
		t.Fatal(err)
	}
	b.Release(60)
	b.Release(40)
	if got := b.InUse(); got != 0 {
		t.Errorf("InUse %d after all given back, want 0", got)
	}
}

// ReleasePast gives back what TakePast took past the whole budget (an
// answer larger than it) in one call, in pieces of at most Max as Release
// takes them; a nil budget ignores it.
func TestReleasePastGivesBackMoreThanMax(t *testing.T) {
	for _, tc := range []struct{ max, n int64 }{{100, 250}, {100, 100}, {100, 7}, {0, 250}} {
		b := NewBudget(tc.max)
		b.TakePast(tc.n)
		b.ReleasePast(tc.n)
		if got := b.InUse(); got != 0 {
			t.Errorf("budget %d: InUse %d after %d taken past and given back, want 0", tc.max, got, tc.n)
		}
	}
	var nilBudget *Budget
	nilBudget.ReleasePast(10)
}

// TestRefuseRunsBesideAccept: a Refuse that takes its time holds neither
// Accept nor the served clients; at most MaxRefusing run at once, one a
// client: a connection past them, or a client's second while its first is
// refused, is closed at once; a Refuse that panics closes its connection
// and gives its place back.
func TestRefuseRunsBesideAccept(t *testing.T) {
	ln := NewListener(listenLoopback(t), 1)
	release := make(chan struct{})
	var inRefuse atomic.Int64
	ln.Refuse = func(c net.Conn) {
		defer c.Close()
		var b [1]byte
		if _, err := io.ReadFull(c, b[:]); err == nil && b[0] == '!' {
			panic("a refusal's bug")
		}
		inRefuse.Add(1)
		<-release
		c.Write([]byte("why"))
	}
	done := serveEcho(ln)
	addr := ln.Addr().String()
	held, ok := dialServed(t, addr, nil)
	if !ok {
		t.Fatal("the first connection was not served")
	}
	// Each client its own loopback address (127.0.0.0/8 is loopback).
	dialSent := func(client int, b string) net.Conn {
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, byte(2+client))}, Timeout: 5 * time.Second}
		c, err := d.Dial("tcp", addr)
		if err != nil {
			t.Skipf("no loopback address 127.0.0.%d here: %v", 2+client, err)
		}
		c.Write([]byte(b))
		return c
	}
	closedAtOnce := func(c net.Conn, what string) {
		t.Helper()
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if b, err := io.ReadAll(c); len(b) != 0 || err != nil {
			t.Fatalf("%s read %q, %v; want it closed at once", what, b, err)
		}
	}
	var waiting []net.Conn
	for i := range MaxRefusing {
		waiting = append(waiting, dialSent(i, "?"))
	}
	waitFor(t, 10*time.Second, "every Refuse under way", func() bool { return inRefuse.Load() == MaxRefusing })
	closedAtOnce(dialSent(MaxRefusing, ""), fmt.Sprintf("a connection past %d refusals under way", MaxRefusing)) // nothing unread: closed, not reset
	held.Close()
	waitFor(t, 5*time.Second, "the held slot freed", func() bool { return ln.Open() == 0 })
	if c, ok := dialServed(t, addr, nil); !ok {
		t.Fatal("not served while refusals were under way")
	} else {
		held = c
	}
	close(release)
	for _, c := range waiting {
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if b, err := io.ReadAll(c); string(b) != "why" || err != nil {
			t.Fatalf("a refused connection read %q, %v; want Refuse's answer", b, err)
		}
		c.Close()
	}
	waitFor(t, 5*time.Second, "the refusals' places given back", func() bool { return ln.Refusing() == 0 })
	release = make(chan struct{})
	first := dialSent(0, "?")
	waitFor(t, 10*time.Second, "a client's refusal under way", func() bool { return inRefuse.Load() == MaxRefusing+1 })
	closedAtOnce(dialSent(0, ""), "a client's second connection while its first was refused")
	close(release)
	first.Close()
	closedAtOnce(dialSent(1, "!"), "the connection of a Refuse that panicked")
	waitFor(t, 5*time.Second, "the refusals' places given back", func() bool { return ln.Refusing() == 0 })
	if got, want := ln.Rejected(), uint64(MaxRefusing+4); got != want {
		t.Errorf("Rejected() = %d, want %d", got, want)
	}
	held.Close()
	ln.Close()
	<-done
}
