package repository

import (
	"context"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/plover-run/plover/api"
	"github.com/plover-run/plover/errdefs"
)

// panicNode panics reading one model's record, as a bug met by that
// model's files would.
type panicNode struct {
	*fakeNode
	bad   string
	calls atomic.Int32
}

func (p *panicNode) Versions(ctx context.Context, name string) (*api.Record, error) {
	if name == p.bad {
		p.calls.Add(1)
		panic("a bug met by " + name + "'s files")
	}
	return p.fakeNode.Versions(ctx, name)
}

// A panic in one model's deploy during a scan makes that model
// UNAVAILABLE, saying so, and leaves the server and the other models
// alone: the scan's deploys run on goroutines no transport recovers, and
// a tampered library once panicked there, ending plover serve at every
// start. It is not deployed again until its folder changes.
func TestAPanickingDeployIsThatModelsAlone(t *testing.T) {
	ctx := context.Background()
	root := filepath.Join(t.TempDir(), "models")
	writeBundle(t, filepath.Join(root, "cnn", "1"), "cnn", false)
	writeBundle(t, filepath.Join(root, "bad", "1"), "bad", false)
	age(t, root)
	node := &panicNode{fakeNode: newFakeNode(), bad: "bad"}
	r, err := New(Config{Dir: root, Poll: time.Hour, Settle: 20 * time.Millisecond}, node)
	if err != nil {
		t.Fatal(err)
	}
	r.Scan(ctx)
	got := index(r)
	if !strings.Contains(got, "cnn/1 READY") || !strings.Contains(got, "bad/ UNAVAILABLE (models/bad: the server failed while deploying it") {
		t.Fatalf("index after a scan whose deploy of bad panicked: %s; want cnn/1 READY and bad UNAVAILABLE, saying why", got)
	}
	r.Scan(ctx)
	if n := node.calls.Load(); n != 1 {
		t.Errorf("bad deployed %d times in two scans of an unchanged folder, want 1", n)
	}
	writeBundle(t, filepath.Join(root, "bad", "2"), "bad", false)
	age(t, root)
	waitFor(t, r, 5, "bad deployed again once its folder changed", func() bool { return node.calls.Load() == 2 })
}

// A load's deploy that panics is that model's alone too: the load answers
// 500 and the model is UNAVAILABLE saying so (the transport recovered the
// panic, and the model stayed LOADING, deploying, for good).
func TestAPanickingLoadLeavesItsModelUnavailable(t *testing.T) {
	root := filepath.Join(t.TempDir(), "models")
	writeBundle(t, filepath.Join(root, "bad", "1"), "bad", false)
	node := &panicNode{fakeNode: newFakeNode(), bad: "bad"}
	r, _ := New(Config{Dir: root, Poll: time.Hour, Settle: 20 * time.Millisecond}, node)
	err := func() (err error) {
		defer func() {
			if p := recover(); p != nil {
				t.Errorf("the load panicked: %v", p)
			}
		}()
		return r.Load(context.Background(), "bad")
	}()
	if errdefs.KindOf(err) != errdefs.KindInternal || !strings.Contains(index(r), "bad/ UNAVAILABLE (models/bad: the server failed while deploying it") {
		t.Errorf("load: %v; index %s; want 500 and bad UNAVAILABLE, saying why", err, index(r))
	}
}
