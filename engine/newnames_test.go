package engine_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/bundle"
	"github.com/plover-run/plover/call"
	"github.com/plover-run/plover/device"
	"github.com/plover-run/plover/engine"
	"github.com/plover-run/plover/errdefs"
	"github.com/plover-run/plover/internal/testkit"
	"github.com/plover-run/plover/objectstore"
	"github.com/plover-run/plover/registry"
)

// newRecordReads is a store that counts the reads of each function record,
// fails the next ones while failReads is above 0, and runs listed (once
// set) after its next listing.
type newRecordReads struct {
	objectstore.Store
	mu        sync.Mutex
	reads     map[string]int
	failReads atomic.Int32
	listed    func()
}

func (s *newRecordReads) GetTagged(ctx context.Context, key string) (io.ReadCloser, objectstore.Info, error) {
	if name, ok := strings.CutPrefix(key, "functions/"); ok {
		s.mu.Lock()
		s.reads[strings.TrimSuffix(name, ".json")]++
		s.mu.Unlock()
		if s.failReads.Add(-1) >= 0 {
			return nil, objectstore.Info{}, errors.New("the store is unreachable a moment")
		}
	}
	return s.Store.GetTagged(ctx, key)
}

func (s *newRecordReads) List(ctx context.Context, prefix string) ([]objectstore.Info, error) {
	infos, err := s.Store.List(ctx, prefix)
	s.mu.Lock()
	listed := s.listed
	s.listed = nil
	s.mu.Unlock()
	if listed != nil {
		listed()
	}
	return infos, err
}

func (s *newRecordReads) readsOf(name string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.reads[name]
}

// nodes is node a, which deploys, and node b, which polls, over one
// store, b's reads counted; lib is a built kernels.so their bundles share.
type nodes struct {
	t     *testing.T
	a, b  *engine.Engine
	store *newRecordReads
	lib   []byte
}

func newHere(t *testing.T) *nodes {
	fs, err := objectstore.NewFS(filepath.Join(t.TempDir(), "store"))
	if err != nil {
		t.Fatal(err)
	}
	lib, err := os.ReadFile(filepath.Join(testkit.BundleDir(t, testkit.Manifest("lib"), nil), "kernels.so"))
	if err != nil {
		t.Fatal(err)
	}
	store := &newRecordReads{Store: fs, reads: map[string]int{}}
	store.failReads.Store(-1 << 20)
	return &nodes{t: t, a: testkit.Engine(t, engine.Config{Store: fs}), b: testkit.Engine(t, engine.Config{Store: store}), store: store, lib: lib}
}

// deploy deploys name through a with min_instances min (out_bytes out:
// another bundle, another version).
func (n *nodes) deploy(name string, min int, out int64) {
	n.t.Helper()
	m := testkit.Manifest(name)
	m.MinInstances, m.OutBytes = min, out
	dir := n.t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, m.Library), n.lib, 0o755); err != nil {
		n.t.Fatal(err)
	}
	testkit.WriteManifest(n.t, dir, m)
	testkit.Deploy(n.t, n.a, dir)
}

// deployWarmed deploys name through a asking for min_instances 1
// (out_bytes out), polls b and waits until b has pre-warmed it (what: for
// the failure).
func (n *nodes) deployWarmed(name string, out int64, what string) {
	n.t.Helper()
	n.deploy(name, 1, out)
	if err := refreshed(n.t, n.b); err != nil {
		n.t.Fatal(err)
	}
	testkit.WaitFor(n.t, n.b, name, what, idle(1))
}

// refreshed polls e and waits for the pre-warms it started.
func refreshed(t *testing.T, e *engine.Engine) error {
	t.Helper()
	err := e.Refresh(context.Background())
	waitUntil(t, "the poll's pre-warms", func() bool { return e.AsideWarms() == 0 })
	return err
}

// A function deployed through another node that asks for min_instances
// is pre-warmed here by the poll that finds it, as README says; one whose
// record the poll could not read is read again at the next. Before, the
// poll read only the records of names known or followed here.
func TestPollPrewarmsAFunctionNewHere(t *testing.T) {
	for _, failing := range []int32{0, 1} {
		t.Run(fmt.Sprintf("%d reads failing", failing), func(t *testing.T) {
			n := newHere(t)
			b, store := n.b, n.store
			n.deploy("nw", 1, 256)
			store.failReads.Store(failing)
			if err := refreshed(t, b); (err != nil) != (failing > 0) {
				t.Fatalf("the poll: %v", err)
			}
			if failing > 0 {
				if b.Knows("nw") {
					t.Fatal("a record not read taken on")
				}
				if err := refreshed(t, b); err != nil {
					t.Fatal(err)
				}
			}
			testkit.WaitFor(t, b, "nw", "its pre-warm by the poll", idle(1))
		})
	}
}

// A function new here that asks for no instance kept warm is not taken on
// by the poll: a request still reads its record, and gets a 404 once it
// is deleted, with no poll between. Its record is read once per tag, and
// again once a deploy changes it: then asking for min_instances, it is
// pre-warmed.
func TestPollReadsANewColdFunctionOncePerTag(t *testing.T) {
	n := newHere(t)
	a, b, store := n.a, n.b, n.store
	n.deploy("cold", 0, 256)
	for range 2 {
		if err := refreshed(t, b); err != nil {
			t.Fatal(err)
		}
	}
	if r := store.readsOf("cold"); r != 1 || b.Knows("cold") {
		t.Fatalf("after two polls: %d reads of its record, taken on %v; want 1, false", r, b.Knows("cold"))
	}
	if err := a.Control().Delete(context.Background(), "cold", false); err != nil {
		t.Fatal(err)
	}
	err := b.Invoke(context.Background(), "cold", &call.Request{Input: []byte{1}})
	if errdefs.KindOf(err) != errdefs.KindNotFound {
		t.Fatalf("a request for it once deleted: %v, want a 404", err)
	}
	n.deployWarmed("cold", 128, "its pre-warm once deployed asking for min_instances")
}

// A poll reads at most a few records new here, the rest at the next
// polls, each once: a node starting beside many functions does not read
// them all in one poll.
func TestPollReadsFewNewRecordsAtATime(t *testing.T) {
	n := newHere(t)
	b, store := n.b, n.store
	const cold = 20
	for i := range cold {
		n.deploy(fmt.Sprintf("c%02d", i), 0, 256)
	}
	n.deploy("warm", 1, 256) // listed after the others
	reads := func() (r int) {
		for i := range cold {
			r += store.readsOf(fmt.Sprintf("c%02d", i))
		}
		return r + store.readsOf("warm")
	}
	if err := refreshed(t, b); err != nil {
		t.Fatal(err)
	}
	if r := reads(); r == 0 || r > cold || b.Knows("warm") {
		t.Fatalf("the first poll read %d records (taken warm on: %v); want some, not all %d", r, b.Knows("warm"), cold+1)
	}
	for i := 0; !b.Knows("warm"); i++ {
		if i == cold {
			t.Fatalf("warm not taken on after %d polls", i+1)
		}
		if err := refreshed(t, b); err != nil {
			t.Fatal(err)
		}
	}
	if err := refreshed(t, b); err != nil {
		t.Fatal(err)
	}
	if r := reads(); r != cold+1 {
		t.Errorf("%d reads of %d records new here, want each read once", r, cold+1)
	}
	testkit.WaitFor(t, b, "warm", "its pre-warm", idle(1))
}

// A function deleted between the poll's listing and its read of the
// record is not taken on, and the poll does not fail; deployed again,
// the next poll pre-warms it.
func TestPollPassesOverANewFunctionDeletedSinceTheListing(t *testing.T) {
	n := newHere(t)
	a, b, store := n.a, n.b, n.store
	n.deploy("brief", 1, 256)
	store.mu.Lock()
	store.listed = func() {
		if err := a.Control().Delete(context.Background(), "brief", false); err != nil {
			t.Error(err)
		}
	}
	store.mu.Unlock()
	if err := refreshed(t, b); err != nil {
		t.Fatal(err)
	}
	if store.readsOf("brief") != 1 || b.Knows("brief") {
		t.Fatalf("%d reads, taken on %v; want its record read and found gone", store.readsOf("brief"), b.Knows("brief"))
	}
	n.deployWarmed("brief", 128, "its pre-warm once deployed again")
}

// A node's start pre-warm (Prewarm) lists every record: the poll after it
// reads none of those again as new here, unless it changed since. Before
// the start's tags were kept, a node starting beside many functions read
// each record once more, a few per poll.
func TestPollAfterPrewarmRereadsNoRecord(t *testing.T) {
	n := newHere(t)
	n.deploy("cold", 0, 256)
	n.deploy("changed", 0, 256)
	if err := n.b.Prewarm(context.Background()); err != nil {
		t.Fatal(err)
	}
	before := n.store.readsOf("cold")
	n.deploy("changed", 1, 128)
	if err := refreshed(t, n.b); err != nil {
		t.Fatal(err)
	}
	if r := n.store.readsOf("cold") - before; r != 0 {
		t.Errorf("the poll after Prewarm read an unchanged record %d times", r)
	}
	testkit.WaitFor(t, n.b, "changed", "its pre-warm once changed", idle(1))
}

// A function followed here (plover logs --follow) and not loaded, which a
// deploy elsewhere makes ask for min_instances, is taken on and
// pre-warmed by the poll that reads its changed record, in that one read;
// its follower gets the output of the function now run here.
func TestPollPrewarmsAFollowedFunction(t *testing.T) {
	fs, err := objectstore.NewFS(filepath.Join(t.TempDir(), "store"))
	if err != nil {
		t.Fatal(err)
	}
	store := &newRecordReads{Store: fs, reads: map[string]int{}}
	store.failReads.Store(-1 << 20)
	cfg := engine.Config{Store: store, Devices: []device.Device{keepsOutput{device.NewHost(0)}}}
	a, b := testkit.Engine(t, cfg), testkit.Engine(t, cfg)
	testkit.Deploy(t, a, testkit.BundleDir(t, testkit.Manifest("echo"), nil))
	_, f, err := b.Control().Logs(context.Background(), "echo", time.Time{}, true)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := refreshed(t, b); err != nil { // its tag not known from Logs' read
		t.Fatal(err)
	}
	m := testkit.Manifest("echo")
	m.MinInstances = 1
	testkit.Deploy(t, a, testkit.BundleDir(t, m, nil))
	before := store.readsOf("echo")
	if err := refreshed(t, b); err != nil {
		t.Fatal(err)
	}
	if r := store.readsOf("echo") - before; r != 1 {
		t.Errorf("the poll read the followed record %d times, want 1", r)
	}
	testkit.WaitFor(t, b, "echo", "its pre-warm by the poll", idle(1))
	if !b.Print("echo", "after") {
		t.Fatal("echo not run here")
	}
	select {
	case l := <-f.C:
		if l.Line != "after" {
			t.Errorf("the follower got %q", l.Line)
		}
	case <-time.After(10 * time.Second):
		t.Error("the follower got no line of the function taken on")
	}
}

// A function new here built for a device this node has not (a store
// shared by a GPU node and a host-only one) is not taken on by the poll
// however many instances it asks kept warm: taken on, its pre-warm fetched
// and held its bundle for good, and the reaper's top-ups warned without
// end (a review's probe).
func TestPollPassesOverAFunctionForAnotherDevice(t *testing.T) {
	ctx := context.Background()
	fs, err := objectstore.NewFS(filepath.Join(t.TempDir(), "store"))
	if err != nil {
		t.Fatal(err)
	}
	m := testkit.Manifest("gpu-fn")
	m.MinInstances = 1
	dir := testkit.BundleDir(t, m, nil)
	m.Target = abi.TargetCUDA
	testkit.WriteManifest(t, dir, m) // as a GPU node's deploy stores it
	raw, sha, pm, err := bundle.PackBytes(dir)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := (registry.Registry{Store: fs}).PublishWith(ctx, pm, bytes.NewReader(raw), sha, int64(len(raw)), registry.PublishOptions{}); err != nil {
		t.Fatal(err)
	}
	b := testkit.Engine(t, engine.Config{Store: fs}) // the host device only
	if err := b.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	if b.Knows("gpu-fn") {
		t.Error("a host-only node's poll took on a CUDA function to pre-warm it")
	}
}

// A record new here that cannot be decoded is read once per tag, and is
// no poll's failure: read at every poll and failing it, it hid the
// store's real failures from the poll's log (a review's probe).
func TestPollReadsACorruptNewRecordOncePerTag(t *testing.T) {
	n := newHere(t)
	b, store := n.b, n.store
	junk := []byte("{not json")
	if err := store.Store.Put(context.Background(), "functions/broken.json", bytes.NewReader(junk), int64(len(junk))); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		if err := refreshed(t, b); err != nil {
			t.Fatalf("poll %d: %v", i+1, err)
		}
	}
	if r := store.readsOf("broken"); r != 1 {
		t.Errorf("after three polls, %d reads of the corrupt record, want 1", r)
	}
}
