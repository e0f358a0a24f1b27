package httpapi_test

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/plover-run/plover/engine"
	"github.com/plover-run/plover/httpapi"
	"github.com/plover-run/plover/internal/testkit"
	"github.com/plover-run/plover/netguard"
)

// waitedBudget is a body budget that says when a body begins to wait for
// room in it.
type waitedBudget struct {
	*netguard.Budget
	waits chan struct{}
}

func (b waitedBudget) Acquire(ctx context.Context, n int64) error {
	select {
	case b.waits <- struct{}{}:
	default:
	}
	return b.Budget.Acquire(ctx, n)
}

// Bodies never wait for each other for room in the body budget, and the
// budget counts every byte they hold: two bodies each under the budget,
// together over it, one waiting for room while the other is still
// arriving, are both read; so is a body over the whole budget (under
// --max-body), alone; and sixteen slow bodies of 200 KiB under 256 KiB
// all are, the bytes held never past the budget plus one body. Before, a
// body kept what it held while it waited for its next window: the second
// body took the rest and waited, the first then waited for the second, and
// one got 503 after 5 s (a review's probe); a body over the budget never
// had room. A first mend gave back what a waiting body held, and so
// counted none of its bytes while it waited: the sixteen held 1.6 MB past
// a 256 KiB budget (the next review's probe).
func TestBodiesNeverWaitForEachOther(t *testing.T) {
	e := testkit.Engine(t, engine.Config{})
	m := testkit.Manifest("echo")
	m.MaxInputBytes = 2 << 20
	testkit.Deploy(t, e, testkit.BundleDir(t, m, nil))
	budget := waitedBudget{netguard.NewBudget(256 << 10), make(chan struct{}, 1)}
	url := testkit.Serve(t, e, httpapi.Options{BodyBudget: budget, MaxBodyBytes: 1 << 20})
	addr := strings.TrimPrefix(url, "http://")
	head := "POST /v1/functions/echo/invoke HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/octet-stream\r\nConnection: close\r\nContent-Length: %d\r\n\r\n"
	answer := func(c net.Conn) int {
		c.SetReadDeadline(time.Now().Add(15 * time.Second))
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Errorf("no answer: %v", err)
			return 0
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	dial := func() net.Conn {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}

	t.Run("two bodies, one waiting while the other arrives", func(t *testing.T) {
		const size, first = 250 << 10, 100 << 10
		a := dial()
		fmt.Fprintf(a, head, size)
		a.Write(make([]byte, first))
		end := time.Now().Add(10 * time.Second)
		for budget.InUse() < first { // a's first part read
			if time.Now().After(end) {
				t.Fatalf("a's first part not read: %d bytes held", budget.InUse())
			}
			time.Sleep(2 * time.Millisecond)
		}
		b := dial()
		fmt.Fprintf(b, head, size)
		b.Write(make([]byte, size/2))
		select {
		case <-budget.waits: // b has taken what it could and waits for more
		case <-time.After(10 * time.Second):
			t.Fatal("b never waited for room")
		}
		// b waits holding what it read: the budget, short of a window (a
		// holds its first part and a window, at most 164 KiB).
		if in, least := budget.InUse(), budget.Max()-64<<10; in <= least {
			t.Errorf("while b waits the budget counts %d bytes, want over %d: b's bytes are not counted", in, least)
		}
		go b.Write(make([]byte, size/2))
		a.Write(make([]byte, size-first))
		if sa, sb := answer(a), answer(b); sa != 200 || sb != 200 {
			t.Errorf("a %d, b %d; want 200, 200", sa, sb)
		}
	})

	t.Run("a body over the whole budget", func(t *testing.T) {
		c := dial()
		go func() {
			fmt.Fprintf(c, head, 512<<10)
			c.Write(make([]byte, 512<<10))
		}()
		if s := answer(c); s != 200 {
			t.Errorf("a 512 KiB body under a 256 KiB budget: %d, want 200", s)
		}
	})
	t.Run("sixteen slow bodies", func(t *testing.T) {
		const size, piece = 200 << 10, 32 << 10
		var peak atomic.Int64
		stop := make(chan struct{})
		sampled := make(chan struct{})
		go func() { // the most the budget counts while they arrive
			defer close(sampled)
			for {
				peak.Store(max(peak.Load(), budget.InUse()))
				select {
				case <-stop:
					return
				case <-time.After(time.Millisecond):
				}
			}
		}()
		conns := make([]net.Conn, 16)
		for i := range conns {
			conns[i] = dial()
			go func(c net.Conn) {
				fmt.Fprintf(c, head, size)
				for sent := 0; sent < size; sent += piece {
					c.Write(make([]byte, piece))
					time.Sleep(10 * time.Millisecond) // a slow sender's pace, not a wait for state
				}
			}(conns[i])
		}
		for i, c := range conns {
			if s := answer(c); s != 200 {
				t.Errorf("body %d: %d, want 200", i, s)
			}
		}
		close(stop)
		<-sampled
		if most := budget.Max() + size; peak.Load() > most {
			t.Errorf("the budget counted %d bytes at most, over the budget and one body (%d)", peak.Load(), most)
		}
	})
	end := time.Now().Add(10 * time.Second)
	for budget.InUse() != 0 {
		if time.Now().After(end) {
			t.Fatalf("%d bytes of the budget held after the requests", budget.InUse())
		}
		time.Sleep(2 * time.Millisecond)
	}
}
