package engine_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/plover-run/plover/bundle"
	"github.com/plover-run/plover/call"
	"github.com/plover-run/plover/device"
	"github.com/plover-run/plover/engine"
	"github.com/plover-run/plover/errdefs"
	"github.com/plover-run/plover/funclog"
	"github.com/plover-run/plover/internal/testkit"
	"github.com/plover-run/plover/objectstore"
)

// hookedStore runs its hook, once, right after the next read of key: what
// happens between a read and what its reader does next. Once paused is
// set, the next read of key closes it and waits for release first.
type hookedStore struct {
	objectstore.Store
	key     string
	hook    atomic.Pointer[func()]
	paused  atomic.Pointer[chan struct{}]
	release chan struct{}
}

func (s *hookedStore) GetTagged(ctx context.Context, key string) (io.ReadCloser, objectstore.Info, error) {
	if p := s.paused.Swap(nil); p != nil && key == s.key {
		close(*p)
		<-s.release
		return s.Store.GetTagged(ctx, key)
	} else if p != nil {
		s.paused.Store(p)
	}
	rc, info, err := s.Store.GetTagged(ctx, key)
	if err != nil || key != s.key {
		return rc, info, err
	}
	hook := s.hook.Swap(nil)
	if hook == nil {
		return rc, info, err
	}
	b, err := io.ReadAll(rc) // read before the hook changes the store
	rc.Close()
	if err != nil {
		return nil, info, err
	}
	(*hook)()
	return io.NopCloser(bytes.NewReader(b)), info, nil
}

// hookedNode is an engine, whose device keeps its workers' output, on a
// file store whose echo record's next read runs the store's hook; echo is
// deployed.
func hookedNode(t *testing.T) (*hookedStore, *engine.Engine) {
	t.Helper()
	fs, err := objectstore.NewFS(filepath.Join(t.TempDir(), "store"))
	if err != nil {
		t.Fatal(err)
	}
	store := &hookedStore{Store: fs, key: "functions/echo.json"}
	e := testkit.Engine(t, engine.Config{Store: store, Devices: []device.Device{keepsOutput{device.NewHost(0)}}})
	testkit.Deploy(t, e, testkit.BundleDir(t, testkit.Manifest("echo"), nil))
	return store, e
}

// A function deleted between Logs' read of its record and its follower's
// start: Logs ends that follower and says the function is gone. Before,
// the follower was made after the delete had forgotten the name's output,
// on a fresh ring no Forget would close: the stream waited for ever (or
// carried the output of whatever was deployed next under the name).
func TestFollowOfAFunctionDeletedMeanwhile(t *testing.T) {
	store, e := hookedNode(t)
	deleted := make(chan error, 1)
	hook := func() { deleted <- e.Control().Delete(context.Background(), "echo", true) }
	store.hook.Store(&hook)

	_, f, err := e.Control().Logs(context.Background(), "echo", time.Time{}, true)
	select {
	case err := <-deleted:
		if err != nil {
			t.Fatalf("the delete between the read and the follow: %v", err)
		}
	default:
		t.Fatal("the hook did not run: Logs read no record")
	}
	if err == nil {
		defer f.Close()
		select {
		case _, open := <-f.C:
			if !open {
				return // ended: as good as refused
			}
		default:
		}
		t.Fatal("Logs of a function deleted while it started a follower: a follower that nothing will end")
	}
	if errdefs.KindOf(err) != errdefs.KindNotFound {
		t.Fatalf("Logs of a function deleted while it started a follower: %v, want not found", err)
	}
}

// A node follows the output of a function it never ran; another node
// deletes it, or deletes it and deploys the name anew. The follower ends
// when this node learns of it (a poll, or loading the name's next life for
// a request), and gets none of the next life's output; a new version of
// the same function keeps it. Before, nothing ended it: the node polled
// only the functions it had loaded, and the stream carried the next
// life's output.
func TestFollowerOfAFunctionDeletedOnAnotherNode(t *testing.T) {
	dir := testkit.BundleDir(t, testkit.Manifest("echo"), nil)
	m := testkit.Manifest("echo")
	m.OutBytes = 128 // another bundle than dir's: a new version
	newVersion := testkit.BundleDir(t, m, nil)
	del := func(t *testing.T, a *engine.Engine) {
		if err := a.Control().Delete(context.Background(), "echo", true); err != nil {
			t.Fatal(err)
		}
	}
	anew := func(t *testing.T, a *engine.Engine) {
		if _, err := a.Control().DeployAs(context.Background(), "echo", "globex", packed(t, dir), true); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		name    string
		steps   []func(t *testing.T, a *engine.Engine)
		poll    []bool // whether b polls after each step
		runHere bool   // b then runs echo, whose worker prints
		ended   bool
	}{
		{"deleted", []func(*testing.T, *engine.Engine){del}, []bool{true}, false, true},
		{"deployed anew after a poll", []func(*testing.T, *engine.Engine){del, anew}, []bool{true, false}, true, true},
		{"deployed anew between polls, run here", []func(*testing.T, *engine.Engine){del, anew}, []bool{false, false}, true, true},
		{"deployed anew between polls", []func(*testing.T, *engine.Engine){del, anew}, []bool{false, true}, false, true},
		{"a new version", []func(*testing.T, *engine.Engine){func(t *testing.T, a *engine.Engine) { testkit.Deploy(t, a, newVersion) }}, []bool{true}, true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, b := twoNodes(t, dir)
			_, f, err := b.Control().Logs(context.Background(), "echo", time.Time{}, true)
			if err != nil {
				t.Fatalf("follow on b: %v", err)
			}
			defer f.Close()
			for i, step := range tc.steps {
				step(t, a)
				if tc.poll[i] {
					if err := b.Refresh(context.Background()); err != nil {
						t.Fatalf("b's poll: %v", err)
					}
				}
			}
			if tc.runHere {
				runAndPrint(t, b, "the next life's output")
			}
			select {
			case l, open := <-f.C:
				switch {
				case open && tc.ended:
					t.Fatalf("the follower got %q, want it ended", l.Line)
				case !open && !tc.ended:
					t.Fatal("the follower ended")
				}
			default: // Refresh and Add have returned: an end or a line is there
				if tc.ended || tc.runHere {
					t.Fatal("the follower neither ended nor got a line")
				}
			}
		})
	}
}

// runAndPrint runs echo on e (loading it) and prints line as its worker.
func runAndPrint(t *testing.T, e *engine.Engine, line string) {
	t.Helper()
	if err := e.Invoke(context.Background(), "echo", &call.Request{Input: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	if !e.Print("echo", line) {
		t.Fatal("echo is not loaded")
	}
}

// twoNodes is two engines on one file store, whose devices keep their
// workers' output, with dir deployed by the first.
func twoNodes(t *testing.T, dir string) (*engine.Engine, *engine.Engine) {
	t.Helper()
	store, err := objectstore.NewFS(filepath.Join(t.TempDir(), "store"))
	if err != nil {
		t.Fatal(err)
	}
	cfg := engine.Config{Store: store, Devices: []device.Device{keepsOutput{device.NewHost(0)}}}
	a, b := testkit.Engine(t, cfg), testkit.Engine(t, cfg)
	testkit.Deploy(t, a, dir)
	return a, b
}

// recreate deletes echo on a and deploys it anew from dir, as another
// tenant: a later life of the name.
func recreate(t *testing.T, a *engine.Engine, dir string) {
	t.Helper()
	if err := a.Control().Delete(context.Background(), "echo", true); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Control().DeployAs(context.Background(), "echo", "globex", packed(t, dir), true); err != nil {
		t.Fatal(err)
	}
}

func packed(t *testing.T, dir string) *bytes.Reader {
	b, _, _, err := bundle.PackBytes(dir)
	if err != nil {
		t.Fatal(err)
	}
	return bytes.NewReader(b)
}

// recordReads counts the reads of key (a's background, if any, included:
// none is expected while b polls).
type recordReads struct {
	objectstore.Store
	key string
	n   atomic.Int64
}

func (s *recordReads) GetTagged(ctx context.Context, key string) (io.ReadCloser, objectstore.Info, error) {
	if key == s.key {
		s.n.Add(1)
	}
	return s.Store.GetTagged(ctx, key)
}

func (s *recordReads) Get(ctx context.Context, key string) (io.ReadCloser, error) {
	if key == s.key {
		s.n.Add(1)
	}
	return s.Store.Get(ctx, key)
}

// A node that follows a function it has not loaded reads its record once
// per poll that finds it changed, whatever the number of followers, and
// not at all while it is unchanged. A follower made after the function
// was deleted and deployed anew elsewhere, before this node polled, ends
// the earlier life's followers and gets the next life's output.
func TestFollowersOfAFunctionNotLoadedHereCostOneReadPerChange(t *testing.T) {
	fs, err := objectstore.NewFS(filepath.Join(t.TempDir(), "store"))
	if err != nil {
		t.Fatal(err)
	}
	store := &recordReads{Store: fs, key: "functions/echo.json"}
	cfg := engine.Config{Store: store, Devices: []device.Device{keepsOutput{device.NewHost(0)}}}
	a, b := testkit.Engine(t, cfg), testkit.Engine(t, cfg)
	dir := testkit.BundleDir(t, testkit.Manifest("echo"), nil)
	testkit.Deploy(t, a, dir)
	var old []*funclog.Follower
	for range 20 {
		_, f, err := b.Control().Logs(context.Background(), "echo", time.Time{}, true)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		old = append(old, f)
	}
	poll := func(want int64) {
		t.Helper()
		store.n.Store(0)
		if err := b.Refresh(context.Background()); err != nil {
			t.Fatal(err)
		}
		if n := store.n.Load(); n != want {
			t.Errorf("b's poll read echo's record %d times, want %d", n, want)
		}
	}
	poll(1) // its tag not known from Logs' read
	poll(0)
	m := testkit.Manifest("echo")
	m.OutBytes = 128
	testkit.Deploy(t, a, testkit.BundleDir(t, m, nil))
	poll(1)
	poll(0)

	recreate(t, a, dir)
	_, f, err := b.Control().Logs(context.Background(), "echo", time.Time{}, true)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for i, o := range old {
		select {
		case _, open := <-o.C:
			if open {
				t.Fatalf("follower %d of the deleted life got a line, want it ended", i)
			}
		default: // Logs has returned: the end is there
			t.Fatalf("follower %d of the deleted life still open", i)
		}
	}
	runAndPrint(t, b, "the next life's output")
	select {
	case l, open := <-f.C:
		if !open || l.Line != "the next life's output" {
			t.Fatalf("the next life's follower: %q %v, want its line", l.Line, open)
		}
	default:
		t.Fatal("the next life's follower got nothing")
	}
}

// listHooked runs its hook, once, after the next List has read the store
// and before it returns: a listing taken just before what the hook does.
type listHooked struct {
	objectstore.Store
	hook atomic.Pointer[func()]
}

func (s *listHooked) List(ctx context.Context, prefix string) ([]objectstore.Info, error) {
	l, err := s.Store.List(ctx, prefix)
	if h := s.hook.Swap(nil); h != nil {
		(*h)()
	}
	return l, err
}

// A poll whose listing was taken just before a function was deployed
// elsewhere, and a follower made here right after the deploy, before the
// poll reached the names followed here: the name is missing from the
// listing, and the poll reads its record before it ends the follower.
// Before, it ended it as if the function had been deleted.
func TestFollowerNotEndedByAListingOlderThanIt(t *testing.T) {
	fs, err := objectstore.NewFS(filepath.Join(t.TempDir(), "store"))
	if err != nil {
		t.Fatal(err)
	}
	store := &listHooked{Store: fs}
	cfg := engine.Config{Store: store, Devices: []device.Device{keepsOutput{device.NewHost(0)}}}
	a, b := testkit.Engine(t, cfg), testkit.Engine(t, cfg)
	dir := testkit.BundleDir(t, testkit.Manifest("echo"), nil)
	var f *funclog.Follower
	hook := func() {
		testkit.Deploy(t, a, dir)
		var err error
		if _, f, err = b.Control().Logs(context.Background(), "echo", time.Time{}, true); err != nil {
			t.Errorf("follow on b: %v", err)
		}
	}
	store.hook.Store(&hook)
	if err := b.Refresh(context.Background()); err != nil {
		t.Fatal(err)
	}
	if f == nil {
		t.Fatal("the hook made no follower")
	}
	defer f.Close()
	select {
	case _, open := <-f.C:
		if !open {
			t.Fatal("the follower of a function that exists was ended by a listing older than it")
		}
	default:
	}
}

// Logs reads the record of the name's first life; before it makes its
// follower, the name is deleted and made anew elsewhere, this node polls
// and another Logs follows the second life. The first Logs reads the
// record again and follows the second life too; the second life's
// follower is not ended. Before, the first Logs' stale record ended it.
func TestStaleLogsRecordLeavesTheNextLifesFollower(t *testing.T) {
	fs, err := objectstore.NewFS(filepath.Join(t.TempDir(), "store"))
	if err != nil {
		t.Fatal(err)
	}
	store := &hookedStore{Store: fs, key: "functions/echo.json"}
	cfg := engine.Config{Store: store, Devices: []device.Device{keepsOutput{device.NewHost(0)}}}
	a, b := testkit.Engine(t, cfg), testkit.Engine(t, cfg)
	dir := testkit.BundleDir(t, testkit.Manifest("echo"), nil)
	testkit.Deploy(t, a, dir)
	var next *funclog.Follower
	hook := func() { // between the first Logs' record read and its follower
		if err := a.Control().Delete(context.Background(), "echo", true); err != nil {
			t.Error(err)
		}
		if _, err := a.Control().DeployAs(context.Background(), "echo", "globex", packed(t, dir), true); err != nil {
			t.Error(err)
		}
		if err := b.Refresh(context.Background()); err != nil {
			t.Error(err)
		}
		var err error
		if _, next, err = b.Control().Logs(context.Background(), "echo", time.Time{}, true); err != nil {
			t.Error(err)
		}
	}
	store.hook.Store(&hook)
	_, f, err := b.Control().Logs(context.Background(), "echo", time.Time{}, true)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if next == nil {
		t.Fatal("the hook made no follower")
	}
	defer next.Close()
	runAndPrint(t, b, "the next life's output")
	for i, g := range []*funclog.Follower{f, next} {
		select {
		case l, open := <-g.C:
			if !open || l.Line != "the next life's output" {
				t.Fatalf("follower %d: %q %v, want the next life's line", i, l.Line, open)
			}
		default:
			t.Fatalf("follower %d got nothing", i)
		}
	}
}

// A follower made while a poll, its followed names listed, waits to
// compare them with what the node remembers of their lives: the poll does
// not drop what the node remembers of the follower's life as no longer
// followed, so that a delete and a redeploy elsewhere, loaded here, ends
// the follower. Before, the poll listed the followed names before it
// waited, dropped the follower's life, and the follower got the next
// life's output.
func TestFollowerMadeDuringAPollKeepsItsLife(t *testing.T) {
	store, err := objectstore.NewFS(filepath.Join(t.TempDir(), "store"))
	if err != nil {
		t.Fatal(err)
	}
	cfg := engine.Config{Store: store, Devices: []device.Device{keepsOutput{device.NewHost(0)}}}
	a, b := testkit.Engine(t, cfg), testkit.Engine(t, cfg)
	dir := testkit.BundleDir(t, testkit.Manifest("echo"), nil)
	v := testkit.Deploy(t, a, dir)
	f, err := b.FollowWhileRefreshWaits("echo", v.Version)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	recreate(t, a, dir)
	runAndPrint(t, b, "the next life's output")
	select {
	case l, open := <-f.C:
		if open {
			t.Fatalf("the follower of the deleted life got %q, want it ended", l.Line)
		}
	default:
		t.Fatal("the follower of the deleted life still open")
	}
}

// With no polls (--poll 0), what a node remembers of followed names is
// dropped when the function is deleted here, and does not grow with every
// name ever followed. Before, it kept an entry per name followed.
func TestFollowedNamesRememberedBounded(t *testing.T) {
	store, err := objectstore.NewFS(filepath.Join(t.TempDir(), "store"))
	if err != nil {
		t.Fatal(err)
	}
	cfg := engine.Config{Store: store, Devices: []device.Device{keepsOutput{device.NewHost(0)}}}
	a, b := testkit.Engine(t, cfg), testkit.Engine(t, cfg)
	testkit.Deploy(t, b, testkit.BundleDir(t, testkit.Manifest("echo"), nil))
	_, f, err := b.Control().Logs(context.Background(), "echo", time.Time{}, true)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := b.Control().Delete(context.Background(), "echo", true); err != nil {
		t.Fatal(err)
	}
	if n := b.FollowedRemembered(); n != 0 {
		t.Fatalf("after a delete here, %d names remembered, want 0", n)
	}
	const names = 200
	dir := testkit.BundleDir(t, testkit.Manifest("echo"), nil) // its library built once
	for i := range names {
		name := fmt.Sprintf("fn%d", i)
		testkit.WriteManifest(t, dir, testkit.Manifest(name))
		testkit.Deploy(t, a, dir)
		_, f, err := b.Control().Logs(context.Background(), name, time.Time{}, true)
		if err != nil {
			t.Fatal(err)
		}
		f.Close()
	}
	if n := b.FollowedRemembered(); n > names/2 {
		t.Fatalf("%d names followed, each closed: %d remembered", names, n)
	}
}

// A function not loaded here, followed here, is deleted elsewhere while a
// poll reads its record, and a Logs that read the record before the
// delete makes its follower meanwhile (and ends it, finding the record
// gone): the poll that finds the record gone still ends the first
// follower. Before, the Logs had changed the remembered tag (not the
// life), the poll took that for a new life and ended nothing until the
// next poll (a reviewer's test).
func TestPollThatFindsAFollowedFunctionGoneEndsItsFollower(t *testing.T) {
	ctx := context.Background()
	fs, err := objectstore.NewFS(filepath.Join(t.TempDir(), "store"))
	if err != nil {
		t.Fatal(err)
	}
	ps := &hookedStore{Store: fs, key: "functions/echo.json", release: make(chan struct{})}
	a := testkit.Engine(t, engine.Config{Store: fs, Devices: []device.Device{keepsOutput{device.NewHost(0)}}})
	b := testkit.Engine(t, engine.Config{Store: ps, Devices: []device.Device{keepsOutput{device.NewHost(0)}}})
	testkit.Deploy(t, a, testkit.BundleDir(t, testkit.Manifest("echo"), nil))
	_, f0, err := b.Control().Logs(ctx, "echo", time.Time{}, true)
	if err != nil {
		t.Fatal(err)
	}
	defer f0.Close()
	if err := b.Refresh(ctx); err != nil { // remembers the record's tag
		t.Fatal(err)
	}
	refreshed := make(chan error, 1)
	hook := func() { // in the second Logs' record read
		if err := a.Control().Delete(ctx, "echo", true); err != nil {
			t.Error(err)
		}
		reading := make(chan struct{})
		ps.paused.Store(&reading)
		go func() { refreshed <- b.Refresh(ctx) }()
		<-reading // the poll reads echo's record, held
	}
	ps.hook.Store(&hook)
	if _, _, err := b.Control().Logs(ctx, "echo", time.Time{}, true); err == nil {
		t.Fatal("the second Logs followed a deleted function")
	}
	close(ps.release)
	if err := <-refreshed; err != nil {
		t.Fatal(err)
	}
	select {
	case <-f0.C:
	default:
		t.Fatal("the follower of the deleted function left open by the poll that found it deleted")
	}
}

// A node that ran a function keeps its output; another node deletes it and
// deploys the name anew (another tenant, perhaps) before this node's next
// poll. A read of the name's output here, with or without follow, gets
// none of the earlier life's lines: the read finds the record of a later
// life and drops the function here, as a request would. Before, both
// returned the earlier life's lines until the next poll (never, with no
// polls).
func TestLogsOfALaterLifeReadBeforeAPoll(t *testing.T) {
	dir := testkit.BundleDir(t, testkit.Manifest("echo"), nil)
	for _, follow := range []bool{false, true} {
		t.Run(map[bool]string{false: "read", true: "follow"}[follow], func(t *testing.T) {
			a, b := twoNodes(t, dir)
			runAndPrint(t, b, "the earlier life's output")
			if lines, _, err := b.Control().Logs(context.Background(), "echo", time.Time{}, false); err != nil || len(lines) != 1 {
				t.Fatalf("b's output before the delete: %v, %v; want its one line", lines, err)
			}
			recreate(t, a, dir)
			lines, f, err := b.Control().Logs(context.Background(), "echo", time.Time{}, follow)
			if err != nil {
				t.Fatal(err)
			}
			if f != nil {
				defer f.Close()
			}
			if len(lines) != 0 {
				t.Fatalf("b read %v of the earlier life", lines)
			}
			if follow {
				runAndPrint(t, b, "the next life's output")
				select {
				case l, open := <-f.C:
					if !open || l.Line != "the next life's output" {
						t.Fatalf("the follower got %q (open %v), want the next life's line", l.Line, open)
					}
				default: // Add has returned: the line is there
					t.Fatal("the follower got nothing of the next life")
				}
			}
		})
	}
}

// A read of a function's output whose record read a new version overtakes
// (a deploy, here or applied from another node's, between the read and
// what the read does next) drops nothing: that record lists not the new
// version, which is no earlier life's. Before the table's epoch was asked,
// such a read dropped the function just deployed, its warm instances and
// its output.
func TestALogsReadOvertakenByADeployDropsNothing(t *testing.T) {
	store, e := hookedNode(t)
	runAndPrint(t, e, "v1 line")
	m := testkit.Manifest("echo")
	m.OutBytes = 128 // another bundle: a new version
	v2 := testkit.BundleDir(t, m, nil)
	hook := func() {
		testkit.Deploy(t, e, v2)
		runAndPrint(t, e, "v2 line")
	}
	store.hook.Store(&hook)
	lines, _, err := e.Control().Logs(context.Background(), "echo", time.Time{}, false)
	if store.hook.Load() != nil {
		t.Fatal("the hook did not run: Logs read no record")
	}
	if err != nil || len(lines) != 2 {
		t.Fatalf("Logs: %v, %v; want both versions' lines", lines, err)
	}
	if !e.Print("echo", "still here") {
		t.Fatal("echo was dropped by a read of its output")
	}
}
