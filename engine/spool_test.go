package engine_test

import (
	"bytes"
	"context"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/plover-run/plover/bundle"
	"github.com/plover-run/plover/engine"
	"github.com/plover-run/plover/errdefs"
	"github.com/plover-run/plover/internal/testkit"
	"github.com/plover-run/plover/netguard"
)

// stalledUpload is an upload that sends its first bytes and then stalls
// until go is closed, when it ends (a cut upload).
type stalledUpload struct {
	first []byte
	cont  chan struct{}
}

func (u *stalledUpload) Read(p []byte) (int, error) {
	if len(u.first) > 0 {
		n := copy(p, u.first)
		u.first = u.first[n:]
		return n, nil
	}
	<-u.cont
	return 0, io.ErrUnexpectedEOF
}

// Deploys' uploads hold what they have spooled of the node's spool
// budget (--max-spool) until their deploys end: an upload that finds no
// room waits, up to its deadline (504) or the engine's timeout (503,
// naming the flag), holding what it wrote, and one that fits once the
// others are done is spooled and deployed. Before, nothing bounded the
// uploads spooled at once: a deploy token sending many of --max-body
// filled the node's disk (a review's trace).
func TestUploadsHoldTheSpoolBudget(t *testing.T) {
	budget := netguard.NewBudget(1 << 20)
	e := testkit.Engine(t, engine.Config{SpoolBudget: budget, Timeout: 300 * time.Millisecond})
	b, _, m, err := bundle.PackBytes(testkit.BundleDir(t, testkit.Manifest("echo"), nil))
	if err != nil {
		t.Fatal(err)
	}
	if len(b) > 256<<10 {
		t.Fatalf("the test bundle is %d bytes: the budget's room left is 256 KiB", len(b))
	}
	hog := &stalledUpload{first: make([]byte, 900<<10), cont: make(chan struct{})}
	hogDone := make(chan error, 1)
	go func() {
		_, err := e.Control().Deploy(context.Background(), "hog", hog, false)
		hogDone <- err
	}()
	t.Cleanup(func() {
		select {
		case <-hog.cont:
		default:
			close(hog.cont)
		}
	})
	end := time.Now().Add(10 * time.Second)
	for budget.InUse() < 900<<10 { // the hog's bytes spooled
		if time.Now().After(end) {
			t.Fatalf("the stalled upload's spooled bytes are not counted: %d", budget.InUse())
		}
		time.Sleep(2 * time.Millisecond)
	}
	big := bytes.Repeat([]byte{1}, 200<<10)
	short, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	for _, tc := range []struct {
		name string
		ctx  context.Context
		kind errdefs.Kind
	}{{"its deadline passes", short, errdefs.KindTimeout}, {"the engine's timeout", context.Background(), errdefs.KindUnavailable}} {
		_, err := e.Control().Deploy(tc.ctx, m.Name, bytes.NewReader(append(b[:len(b):len(b)], big...)), false)
		if errdefs.KindOf(err) != tc.kind || !strings.Contains(err.Error(), "--max-spool") {
			t.Errorf("%s: an upload past the room left: %v (%v), want %v naming --max-spool", tc.name, err, errdefs.KindOf(err), tc.kind)
		}
	}
	if n := budget.InUse(); n < 900<<10 || n > 1<<20 {
		t.Errorf("the refused uploads left %d bytes held, want the hog's alone", n)
	}
	close(hog.cont)
	if err := <-hogDone; err == nil {
		t.Error("the hog's cut upload deployed")
	}
	if n := budget.InUse(); n != 0 {
		t.Fatalf("%d bytes held once every deploy ended", n)
	}
	if _, err := e.Control().Deploy(context.Background(), m.Name, bytes.NewReader(b), false); err != nil {
		t.Fatalf("a deploy with room: %v", err)
	}
}
