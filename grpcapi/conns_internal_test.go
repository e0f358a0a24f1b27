package grpcapi

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/plover-run/plover/ioshare"
)

// connPair is a connection accepted through a turnListener following c,
// and its client's end.
func connPair(t *testing.T, c *conns) (*turnConn, net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	client, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	client.SetDeadline(time.Now().Add(time.Minute)) // a bug that loses bytes fails, not hangs
	sc, err := (&turnListener{ln, c}).Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sc.Close() })
	return sc.(*turnConn), client
}

// holdSlot takes fl's turn on a goroutine of its own (a turn locks its
// thread) and holds it until the returned func is called.
func holdSlot(t *testing.T, fl *ioshare.Flow) (release func()) {
	t.Helper()
	held, done := make(chan struct{}), make(chan struct{})
	go func() {
		tn, err := fl.Turn(context.Background(), time.Now().Add(time.Minute), nil, false)
		if err != nil {
			t.Error(err)
		}
		close(held)
		<-done
		tn.Done()
	}()
	<-held
	return func() { close(done) }
}

// waitWaiting waits until fl has n pieces waiting for a turn: observed,
// not slept for.
func waitWaiting(t *testing.T, fl *ioshare.Flow, n int) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; {
		if _, _, w := fl.Pieces(); w == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: never %d pieces waiting", fl.Name(), n)
		}
		time.Sleep(time.Millisecond)
	}
}

// A connection in a function's turns reads and writes only in them: while
// another flow holds the one slot, its read and its write wait (counted
// waiting), and go on once the slot is free; a connection in no turns,
// and one whose function was deleted, move as they come.
func TestConnectionsMoveInTheirFunctionsTurns(t *testing.T) {
	sh := ioshare.New(ioshare.Config{Slots: 1, NoReserve: true, Piece: 16 << 10, Hold: time.Hour}) // a held slot never expires to the waiting piece
	fl, other := sh.Flow("flood"), sh.Flow("other")
	c := &conns{wait: time.Minute}
	inTurns, client := connPair(t, c)
	free, freeClient := connPair(t, c)
	c.called(inTurns.LocalAddr(), client.LocalAddr(), fl, true)
	if got := inTurns.flow(); got != fl {
		t.Fatalf("the connection's flow: %v, want flood's", got)
	}

	release := holdSlot(t, other)
	msg := bytes.Repeat([]byte("0123456789abcdef"), 4<<10) // 64 KiB
	if _, err := client.Write(msg); err != nil {
		t.Fatal(err)
	}
	if _, err := freeClient.Write(msg[:100]); err != nil {
		t.Fatal(err)
	}
	// The free connection reads while the slot is held.
	buf := make([]byte, 100)
	if _, err := io.ReadFull(free, buf); err != nil || !bytes.Equal(buf, msg[:100]) {
		t.Fatalf("a connection in no turns: %v", err)
	}
	got := make(chan []byte)
	go func() {
		b := make([]byte, len(msg))
		n, err := io.ReadFull(inTurns, b)
		if err != nil {
			t.Error(err)
		}
		got <- b[:n]
	}()
	waitWaiting(t, fl, 1) // its read waits for the turn
	select {
	case <-got:
		t.Fatal("the connection read while another flow held the only slot")
	default:
	}
	release()
	if b := <-got; !bytes.Equal(b, msg) {
		t.Fatalf("read %d bytes in turns, not the %d sent", len(b), len(msg))
	}

	// A write past smallWrite waits as well.
	release = holdSlot(t, other)
	wrote := make(chan error)
	go func() {
		_, err := inTurns.Write(msg)
		wrote <- err
	}()
	waitWaiting(t, fl, 1)
	release()
	back := make([]byte, len(msg))
	if _, err := io.ReadFull(client, back); err != nil || !bytes.Equal(back, msg) {
		t.Fatalf("written in turns: %v", err)
	}
	if err := <-wrote; err != nil {
		t.Fatal(err)
	}

	// Deleted, its function's turns are no longer the connection's.
	sh.Forget("flood")
	release = holdSlot(t, other)
	defer release()
	if _, err := client.Write(msg[:100]); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(inTurns, buf); err != nil || !bytes.Equal(buf, msg[:100]) {
		t.Fatalf("a connection of a deleted function: %v", err)
	}
}

// Alone on the server's I/O, a read takes a whole piece in its turn and
// gives the rest to the next reads, which take no turn; every byte comes
// through in order. A closed connection leaves the listener's map.
func TestAReadAloneTakesAWholePiece(t *testing.T) {
	sh := ioshare.New(ioshare.Config{Slots: 2, Piece: 16 << 10})
	fl := sh.Flow("flood")
	c := &conns{wait: time.Minute}
	tc, client := connPair(t, c)
	c.called(tc.LocalAddr(), client.LocalAddr(), fl, true)
	msg := make([]byte, 48<<10) // in the socket whole before the first read: within its buffer
	for i := range msg {
		msg[i] = byte(i * 13)
	}
	if _, err := client.Write(msg); err != nil {
		t.Fatal(err)
	}
	var got []byte
	small := make([]byte, 1000)
	for len(got) < len(msg) {
		n, err := tc.Read(small)
		if err != nil {
			t.Fatal(err)
		}
		if len(got) == 0 && len(tc.ahead) == 0 {
			t.Fatal("a read alone of 1000 bytes kept nothing ahead")
		}
		got = append(got, small[:n]...)
	}
	if !bytes.Equal(got, msg) {
		t.Fatal("the bytes read ahead came out otherwise than sent")
	}
	tc.Close()
	if _, ok := c.m.Load(tc.key); ok {
		t.Error("a closed connection is still followed")
	}
}

// A connection moves in the turns of its last call's function where that
// call was large: a small call to another function takes it out of them
// (a client's small calls do not wait in, nor are charged to, a function
// it called once), a small call to the same one keeps it, and a large
// call to another moves it there. Closed, it counts in none, even moved
// by a call that found it open.
func TestACallMovesItsConnection(t *testing.T) {
	sh := ioshare.New(ioshare.Config{})
	batch, own := sh.Flow("batch"), sh.Flow("own")
	c := &conns{wait: time.Minute}
	tc, client := connPair(t, c)
	other, otherClient := connPair(t, c)
	local, remote := tc.LocalAddr(), client.LocalAddr()
	for _, step := range []struct {
		what  string
		fl    *ioshare.Flow
		large bool
		want  *ioshare.Flow
	}{
		{"a small call", own, false, nil},
		{"a large call", batch, true, batch},
		{"a small call to the same function", batch, false, batch},
		{"a small call to another", own, false, nil},
		{"a large call again", batch, true, batch},
		{"a large call to another", own, true, own},
	} {
		c.called(local, remote, step.fl, step.large)
		if got := tc.flow(); got != step.want {
			t.Fatalf("after %s: in %v, want %v", step.what, got, step.want)
		}
		if n := c.inTurns.Load(); n != int64(btoi(step.want != nil)) {
			t.Fatalf("after %s: %d connections counted in turns", step.what, n)
		}
	}
	if other.flow() != nil {
		t.Fatal("another connection of the same client host moved too")
	}
	otherClient.Close()
	tc.Close()
	if n := c.inTurns.Load(); n != 0 {
		t.Fatalf("closed: %d connections counted in turns", n)
	}
	// A call found the connection just before it closed, and moves it
	// after: it counts in no turns still (the count is the fast path's,
	// for a server with none).
	tc.setFlow(nil, batch)
	if n := c.inTurns.Load(); n != 0 {
		t.Fatalf("moved after it closed: %d connections counted in turns", n)
	}
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// stallRaw is a socket that always says it has room and takes nothing
// (the kernel's TCP memory short), counting the calls made on it, until
// limit.
type stallRaw struct{ calls, limit atomic.Int64 }

func (r *stallRaw) Control(func(uintptr)) error   { return nil }
func (r *stallRaw) Read(func(uintptr) bool) error { return nil }
func (r *stallRaw) Write(func(uintptr) bool) error {
	if r.calls.Add(1) > r.limit.Load() {
		return errors.New("enough")
	}
	return nil
}

type stallConn struct {
	net.Conn
	raw *stallRaw
}

func (c stallConn) SyscallConn() (syscall.RawConn, error) { return c.raw, nil }

// A write in turns whose socket takes nothing pauses between passes
// (holding no turn), as an HTTP answer's does: it took a turn, and was
// charged for it, about every 2 µs until the socket took bytes again
// (23,149 socket calls in 50 ms; about 100 now).
func TestAStalledWriteDoesNotSpinTurns(t *testing.T) {
	fl := ioshare.New(ioshare.Config{Slots: 2, NoReserve: true}).Flow("f")
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	raw := &stallRaw{}
	raw.limit.Store(1 << 40)
	tc := &turnConn{Conn: stallConn{a, raw}, c: &conns{wait: time.Minute}}
	tc.fl.Store(fl)
	done := make(chan error, 1)
	go func() { _, err := tc.Write(make([]byte, 64<<10)); done <- err }()
	time.Sleep(50 * time.Millisecond) // the window counted: a slower machine counts fewer
	raw.limit.Store(0)
	if err := <-done; err == nil {
		t.Fatal("the stalled write ended without the socket's error")
	}
	if n := raw.calls.Load(); n > 1000 {
		t.Errorf("a stalled write made %d socket calls in 50 ms, each pass a turn: it spins", n)
	}
}
