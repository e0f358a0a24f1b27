package registry

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/bundle"
	"github.com/plover-run/plover/internal/minio"
	"github.com/plover-run/plover/objectstore"
)

// onDelete runs hook once, before the first Delete of key.
type onDelete struct {
	objectstore.Store
	key  string
	once sync.Once
	hook func()
}

func (s *onDelete) Delete(ctx context.Context, key string) error {
	if key == s.key {
		s.once.Do(s.hook)
	}
	return s.Store.Delete(ctx, key)
}

// A deploy that reuses an unreferenced bundle while gc is deleting others
// keeps it: gc decides on each bundle's age as it is just before it goes,
// not as its listing of all of them, made before the deploy touched it,
// showed it. (It deleted the bundle after the deploy's record named it,
// and every node's cold start of that version failed.)
func TestGCKeepsABundleADeployReusedMeanwhile(t *testing.T) {
	ctx := context.Background()
	srv := minio.Start(t)
	srv.MustCreateBucket(t, "gc-race")
	s3, err := objectstore.Open(ctx, "s3://gc-race", objectstore.S3Options{Endpoint: srv.Endpoint, AccessKey: srv.AccessKey, SecretKey: srv.SecretKey})
	if err != nil {
		t.Fatal(err)
	}
	// Two bundles no record names (a deleted function's, kept by their
	// grace then), in the order gc deletes them.
	bodies := [][]byte{[]byte("bundle one"), []byte("bundle two")}
	shas := []string{bundle.Digest(bodies[0]), bundle.Digest(bodies[1])}
	if shas[0] > shas[1] {
		bodies[0], bodies[1] = bodies[1], bodies[0]
		shas[0], shas[1] = shas[1], shas[0]
	}
	for i, b := range bodies {
		if err := s3.Put(ctx, bundle.ObjectKey(shas[i]), bytes.NewReader(b), int64(len(b))); err != nil {
			t.Fatal(err)
		}
	}
	const grace = 2 * time.Second
	for { // until both are past the grace, as gc's listing dates them
		infos, err := s3.List(ctx, "bundles/")
		if err != nil {
			t.Fatal(err)
		}
		if len(infos) == 2 && time.Since(infos[0].ModTime) > grace && time.Since(infos[1].ModTime) > grace {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}

	st := &onDelete{Store: s3, key: bundle.ObjectKey(shas[0])}
	g := Registry{Store: st}
	published := make(chan error, 1)
	st.hook = func() {
		// While gc deletes the first, a deploy (another node's) reuses
		// the second: its object is there, so it is touched, not written.
		// It then waits on the second's mark (gc marks its bundles all
		// at once), so the hook waits for its record only.
		m := &abi.Manifest{Name: "reuser", Priority: "default"}
		go func() {
			_, created, err := g.Publish(ctx, m, bytes.NewReader(bodies[1]), shas[1], int64(len(bodies[1])), false)
			if err == nil && !created {
				err = errors.New("not created")
			}
			published <- err
		}()
		for {
			select {
			case err := <-published: // done or failed without waiting
				published <- err
				return
			default:
			}
			if _, err := s3.Stat(ctx, recordPrefix+"reuser.json"); err == nil {
				return
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	removed, err := g.GC(ctx, grace)
	if err != nil {
		t.Fatal(err)
	}
	if err := <-published; err != nil {
		t.Fatalf("publish: %v", err)
	}
	sort.Strings(removed)
	rec, err := g.Get(ctx, "reuser")
	if err != nil {
		t.Fatal(err)
	}
	cv, _ := rec.CurrentVersion()
	if _, err := s3.Stat(ctx, bundle.ObjectKey(cv.SHA256)); err != nil {
		t.Fatalf("gc removed %q; the current version of reuser names a bundle that is gone: %v", removed, err)
	}
	if len(removed) != 1 || removed[0] != bundle.ObjectKey(shas[0]) {
		t.Errorf("gc removed %q, want only %s", removed, bundle.ObjectKey(shas[0]))
	}
}

// raceStore runs hook once, before the first Delete of key (the bundle a
// delete takes), and closes waiting when a deploy first finds a delete of
// key under way (a mark).
type raceStore struct {
	onDelete
	waiting chan struct{}
	seen    sync.Once
}

func (s *raceStore) List(ctx context.Context, prefix string) ([]objectstore.Info, error) {
	infos, err := s.Store.List(ctx, prefix)
	if prefix == deletingPrefix(s.key) && len(infos) > 0 {
		s.seen.Do(func() { close(s.waiting) })
	}
	return infos, err
}

// A deploy that reuses a bundle between a delete's last read of its age
// and its delete (gc's, and a deleted function's, whose bundle the deploy
// reuses) is acknowledged with the bundle there: it sees the delete's
// mark, waits for the delete to end, and stores the bundle again. Before,
// it touched the bundle, wrote its record, found the bundle there and
// returned; the delete then removed it under the record (a read-only
// review's probe), and every node's cold start of that version failed.
func TestADeployReusingABundleADeleteTakesKeepsIt(t *testing.T) {
	ctx := context.Background()
	srv := minio.Start(t)
	srv.MustCreateBucket(t, "mark-race")
	for _, tc := range []struct {
		name   string
		store  func(t *testing.T) (objectstore.Store, func(key string))
		delete func(g Registry) error // takes the bundle, an old one no other record names
		owner  string                 // the function whose record names the bundle at first ("": none)
	}{
		{"gc, file store", fileStore, func(g Registry) error { _, err := g.GC(ctx, time.Minute); return err }, ""},
		{"gc, S3", func(t *testing.T) (objectstore.Store, func(string)) {
			s3, err := objectstore.Open(ctx, "s3://mark-race", objectstore.S3Options{Endpoint: srv.Endpoint, AccessKey: srv.AccessKey, SecretKey: srv.SecretKey})
			if err != nil {
				t.Fatal(err)
			}
			return s3, func(key string) { // S3 dates its objects itself: wait out gc's grace, as its listing dates them
				for {
					infos, err := s3.List(ctx, key)
					if err != nil || len(infos) != 1 {
						t.Fatal(infos, err)
					}
					if time.Since(infos[0].ModTime) > 2*time.Second {
						return
					}
					time.Sleep(100 * time.Millisecond)
				}
			}
		}, func(g Registry) error { _, err := g.GC(ctx, 2*time.Second); return err }, ""},
		{"a function's delete, file store", fileStore, func(g Registry) error { _, err := g.Delete(ctx, "gone"); return err }, "gone"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			store, age := tc.store(t)
			body := []byte("a bundle, soon no record's: " + tc.name)
			sha := bundle.Digest(body)
			key := bundle.ObjectKey(sha)
			if tc.owner != "" {
				if _, _, err := (Registry{Store: store}).Publish(ctx, &abi.Manifest{Name: tc.owner, Priority: "default"}, bytes.NewReader(body), sha, int64(len(body)), false); err != nil {
					t.Fatal(err)
				}
			} else if err := store.Put(ctx, key, bytes.NewReader(body), int64(len(body))); err != nil {
				t.Fatal(err)
			}
			age(key)
			st := &raceStore{onDelete: onDelete{Store: store, key: key}, waiting: make(chan struct{})}
			g := Registry{Store: st}
			deployed := make(chan error, 1)
			hooked := false
			st.hook = func() {
				hooked = true
				// Another node's deploy of the same bytes, after the
				// delete read the bundle's age: the delete goes on once
				// the deploy waits on its mark, or once it is done.
				go func() {
					_, _, err := g.Publish(ctx, &abi.Manifest{Name: "reuser", Priority: "default"}, bytes.NewReader(body), sha, int64(len(body)), false)
					deployed <- err
				}()
				select {
				case <-st.waiting:
				case err := <-deployed:
					deployed <- err
				}
			}
			if err := tc.delete(g); err != nil {
				t.Fatal(err)
			}
			if !hooked {
				t.Fatal("the delete kept the bundle: no race to run")
			}
			if err := <-deployed; err != nil {
				t.Fatalf("the deploy: %v", err)
			}
			if _, err := store.Stat(ctx, key); err != nil {
				t.Fatalf("the deploy was acknowledged, its record naming bundle %s, which is gone: %v", sha[:12], err)
			}
			if marks, err := store.List(ctx, deletingDir); err != nil || len(marks) != 0 {
				t.Errorf("the delete's mark: %v %v, want it removed", marks, err)
			}
		})
	}
}

// fileStore is a file store, and a way to age an object of it past any
// grace (its modification time set back ten minutes).
func fileStore(t *testing.T) (objectstore.Store, func(key string)) {
	dir := t.TempDir()
	fs, err := objectstore.NewFS(dir)
	if err != nil {
		t.Fatal(err)
	}
	return fs, func(key string) {
		old := time.Now().Add(-10 * time.Minute)
		if err := os.Chtimes(filepath.Join(dir, filepath.FromSlash(key)), old, old); err != nil {
			t.Fatal(err)
		}
	}
}

// A mark left by a delete that died (the process killed between its mark
// and its removal) holds no deploy up once stale, and gc removes it.
func TestGCRemovesAStaleDeleteMark(t *testing.T) {
	ctx := context.Background()
	store, age := fileStore(t)
	g := Registry{Store: store}
	body := []byte("a bundle whose delete died")
	sha := bundle.Digest(body)
	stale, fresh := deletingPrefix(bundle.ObjectKey(sha))+"dead", deletingPrefix(bundle.ObjectKey(bundle.Digest([]byte("another"))))+"live"
	for _, k := range []string{stale, fresh} {
		if err := store.Put(ctx, k, bytes.NewReader(nil), 0); err != nil {
			t.Fatal(err)
		}
	}
	age(stale)
	cs := &countLists{Store: store, prefix: deletingPrefix(bundle.ObjectKey(sha))}
	if _, _, err := (Registry{Store: cs}).Publish(ctx, &abi.Manifest{Name: "fn", Priority: "default"}, bytes.NewReader(body), sha, int64(len(body)), false); err != nil {
		t.Fatal(err)
	}
	if n := cs.n.Load(); n != 1 {
		t.Errorf("the deploy read the stale mark %d times, want once (it waits on a fresh one, reading it again)", n)
	}
	if _, err := g.GC(ctx, time.Minute); err != nil {
		t.Fatal(err)
	}
	if _, err := store.Stat(ctx, stale); !errors.Is(err, objectstore.ErrNotFound) {
		t.Errorf("the stale mark after gc: %v, want it removed", err)
	}
	if _, err := store.Stat(ctx, fresh); err != nil {
		t.Errorf("a fresh mark (a delete under way) after gc: %v, want it kept", err)
	}
}

// countLists counts the listings of prefix.
type countLists struct {
	objectstore.Store
	prefix string
	n      atomic.Int64
}

func (s *countLists) List(ctx context.Context, prefix string) ([]objectstore.Info, error) {
	if prefix == s.prefix {
		s.n.Add(1)
	}
	return s.Store.List(ctx, prefix)
}

// holdDelete holds the first Delete of key until release is closed, and
// closes held as it begins to.
type holdDelete struct {
	objectstore.Store
	key           string
	once          sync.Once
	held, release chan struct{}
}

func (s *holdDelete) Delete(ctx context.Context, key string) error {
	if key == s.key {
		s.once.Do(func() {
			close(s.held)
			<-s.release
		})
	}
	return s.Store.Delete(ctx, key)
}

// Two deletes of one bundle each have a mark of their own: the first to
// end removes only its own, and a deploy that reuses the bundle meanwhile
// waits for the second, which deletes the bundle, then stores it again.
// And a delete held past deleteBound (a store's retries) keeps the bundle
// rather than delete it after a deploy stopped waiting. Before (one mark
// per bundle, a deploy's wait of 10 s), both left an acknowledged deploy
// without its bundle (a read-only review's probes).
func TestABundleDeleteHeldBackStillMeetsTheDeploy(t *testing.T) {
	ctx := context.Background()
	bound, stale := deleteBound, markStale
	deleteBound, markStale = 300*time.Millisecond, 600*time.Millisecond
	t.Cleanup(func() { deleteBound, markStale = bound, stale })
	for _, tc := range []struct {
		name      string
		second    bool // another gc deletes the bundle while the first is held
		pastBound bool // the held delete is let go only once the deploy is done, past deleteBound
	}{
		{"two deletes", true, false},
		{"a delete held past its bound", false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			store, age := fileStore(t)
			body := []byte("a bundle no record names: " + tc.name)
			sha := bundle.Digest(body)
			key := bundle.ObjectKey(sha)
			if err := store.Put(ctx, key, bytes.NewReader(body), int64(len(body))); err != nil {
				t.Fatal(err)
			}
			age(key)
			h := &holdDelete{Store: store, key: key, held: make(chan struct{}), release: make(chan struct{})}
			held := make(chan error, 1)
			go func() { _, err := (Registry{Store: h}).GC(ctx, time.Minute); held <- err }()
			<-h.held // marked, the age read: about to delete
			if tc.second {
				if rm, err := (Registry{Store: store}).GC(ctx, time.Minute); err != nil || len(rm) != 1 {
					t.Fatalf("the second gc: removed %v, %v", rm, err)
				}
			}
			waiting := &raceStore{onDelete: onDelete{Store: store, key: key}, waiting: make(chan struct{})}
			deployed := make(chan error, 1)
			go func() {
				_, _, err := (Registry{Store: waiting}).Publish(ctx, &abi.Manifest{Name: "reuser", Priority: "default"}, bytes.NewReader(body), sha, int64(len(body)), false)
				deployed <- err
			}()
			select {
			case <-waiting.waiting: // the deploy found the held delete's mark
			case err := <-deployed:
				t.Fatalf("the deploy returned (%v) while a delete of its bundle was under way", err)
			}
			var derr error
			if tc.pastBound {
				// The deploy waits on the mark until it is stale, past the
				// held delete's bound; the delete is let go only then.
				derr = <-deployed
				close(h.release)
			} else {
				close(h.release)
				derr = <-deployed
			}
			// A delete past its bound keeps the bundle and says so (gc
			// answered nil, as if nothing had been left).
			if err := <-held; tc.pastBound && (!errors.Is(err, ErrBundlesKept) || !strings.Contains(err.Error(), "past their bound")) {
				t.Fatalf("the held gc: %v, want its bundle kept past the delete's bound", err)
			} else if !tc.pastBound && err != nil {
				t.Fatal(err)
			}
			if derr != nil {
				t.Fatalf("the deploy: %v", derr)
			}
			if _, err := store.Stat(ctx, key); err != nil {
				t.Fatalf("the deploy was acknowledged with its bundle gone: %v", err)
			}
		})
	}
}

// onMark runs hook once, before the first delete mark is written.
type onMark struct {
	objectstore.Store
	once sync.Once
	hook func()
}

func (s *onMark) Put(ctx context.Context, key string, r io.Reader, size int64) error {
	if strings.HasPrefix(key, deletingDir) {
		s.once.Do(s.hook)
	}
	return s.Store.Put(ctx, key, r, size)
}

// gc with no grace (?grace=0s, or a gc node whose clock runs ahead of
// the store's) keeps a bundle a deploy reused between gc's listing of the
// records and its delete's mark: the delete reads the records again under
// its mark. It went by the bundle's age alone, which no grace makes young,
// and deleted the bundle the deploy's record had just named.
func TestGCWithoutGraceKeepsABundleADeployJustNamed(t *testing.T) {
	ctx := context.Background()
	store, age := fileStore(t)
	body := []byte("a bundle no record names")
	sha := bundle.Digest(body)
	if err := store.Put(ctx, bundle.ObjectKey(sha), bytes.NewReader(body), int64(len(body))); err != nil {
		t.Fatal(err)
	}
	age(bundle.ObjectKey(sha))
	st := &onMark{Store: store}
	g := Registry{Store: st}
	st.hook = func() {
		m := &abi.Manifest{Name: "reuser", Priority: "default"}
		if _, created, err := g.Publish(ctx, m, bytes.NewReader(body), sha, int64(len(body)), false); err != nil || !created {
			t.Errorf("publish: created %v, %v", created, err)
		}
	}
	removed, err := g.GC(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := store.Stat(ctx, bundle.ObjectKey(sha)); err != nil || len(removed) > 0 {
		t.Errorf("gc removed %q under the record of the deploy that reused it: %v", removed, err)
	}
}

// gc reads the records once per deleteBatch bundles under their marks,
// not once a bundle: a store of many unused bundles was listed that many
// times (a listing, and the changed records, each).
func TestGCReadsTheRecordsOncePerBatch(t *testing.T) {
	ctx := context.Background()
	fs, err := objectstore.NewFS(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	const n = 100
	for i := range n {
		b := []byte(fmt.Sprintf("bundle %d", i))
		if err := fs.Put(ctx, bundle.ObjectKey(bundle.Digest(b)), bytes.NewReader(b), int64(len(b))); err != nil {
			t.Fatal(err)
		}
	}
	kept := []byte("named")
	g := Registry{Store: fs}
	if _, _, err := g.Publish(ctx, &abi.Manifest{Name: "kept", Priority: "default"}, bytes.NewReader(kept), bundle.Digest(kept), int64(len(kept)), false); err != nil {
		t.Fatal(err)
	}
	st := &countLists{Store: fs, prefix: recordPrefix}
	removed, err := Registry{Store: st}.GC(ctx, 0)
	if err != nil || len(removed) != n {
		t.Fatalf("gc removed %d bundles, %v; want %d", len(removed), err, n)
	}
	if want := 1 + (n+deleteBatch-1)/deleteBatch; int(st.n.Load()) != want {
		t.Errorf("gc listed the records %d times, want %d", st.n.Load(), want)
	}
	if _, err := fs.Stat(ctx, bundle.ObjectKey(bundle.Digest(kept))); err != nil {
		t.Errorf("the named bundle: %v", err)
	}
	if marks, _ := fs.List(ctx, deletingDir); len(marks) != 0 {
		t.Errorf("%d marks left", len(marks))
	}
}

// lateDelete answers the delete of key with its context's error once that
// ends, and carries it out later, when land is closed: as a store may a
// DELETE sent before its caller gave up.
type lateDelete struct {
	objectstore.Store
	key                string
	held, land, landed chan struct{}
}

func (s *lateDelete) Delete(ctx context.Context, key string) error {
	if key != s.key {
		return s.Store.Delete(ctx, key)
	}
	close(s.held)
	<-ctx.Done()
	go func() {
		<-s.land
		s.Store.Delete(context.Background(), key)
		close(s.landed)
	}()
	return ctx.Err()
}

// onFreshMark runs hook once, at the first listing of key's delete marks
// after armed is closed that still holds a fresh one: a deploy waiting on
// a delete that gc gave up on.
type onFreshMark struct {
	objectstore.Store
	key   string
	armed chan struct{}
	once  sync.Once
	hook  func()
}

func (s *onFreshMark) List(ctx context.Context, prefix string) ([]objectstore.Info, error) {
	infos, err := s.Store.List(ctx, prefix)
	select {
	case <-s.armed:
		if prefix == deletingPrefix(s.key) && slices.ContainsFunc(infos, func(m objectstore.Info) bool { return time.Since(m.ModTime) < markStale }) {
			s.once.Do(s.hook)
		}
	default:
	}
	return infos, err
}

// A bundle delete cut at its bound, which the store carries out a moment
// later, still meets the deploy that reused the bundle: its mark stays
// until stale, the deploy waits on it, finds the bundle gone and stores it
// again. Before, the mark went with the cut, the deploy was acknowledged
// with the bundle there, and the delete landed under its record (a
// read-only review's probe against MinIO behind a proxy that passed each
// DELETE on 31 s late: the next node's cold start answered 500, bundle
// missing).
func TestABundleDeleteLandingAfterItsBoundMeetsTheDeploy(t *testing.T) {
	ctx := context.Background()
	bound, stale := deleteBound, markStale
	deleteBound, markStale = 300*time.Millisecond, 900*time.Millisecond
	t.Cleanup(func() { deleteBound, markStale = bound, stale })
	store, age := fileStore(t)
	body := []byte("a bundle whose delete lands late")
	sha := bundle.Digest(body)
	key := bundle.ObjectKey(sha)
	if err := store.Put(ctx, key, bytes.NewReader(body), int64(len(body))); err != nil {
		t.Fatal(err)
	}
	age(key)
	late := &lateDelete{Store: store, key: key, held: make(chan struct{}), land: make(chan struct{}), landed: make(chan struct{})}
	var landOnce sync.Once
	land := func() {
		landOnce.Do(func() { close(late.land) })
		<-late.landed
	}
	gcDone := make(chan error, 1)
	go func() { _, err := (Registry{Store: late}).GC(ctx, time.Minute); gcDone <- err }()
	<-late.held // marked, the records read: the delete sent
	waiting := &onFreshMark{Store: store, key: key, armed: make(chan struct{}), hook: land}
	deployed := make(chan error, 1)
	go func() {
		_, _, err := (Registry{Store: waiting}).Publish(ctx, &abi.Manifest{Name: "reuser", Priority: "default"}, bytes.NewReader(body), sha, int64(len(body)), false)
		deployed <- err
	}()
	if err := <-gcDone; !errors.Is(err, ErrBundlesKept) || !strings.Contains(err.Error(), "whether the one cut there went is not known") {
		t.Fatalf("gc: %v, want its delete past its bound said as of unknown outcome", err)
	}
	close(waiting.armed) // the delete lands at the deploy's next look at the marks, if it still waits
	if err := <-deployed; err != nil {
		t.Fatalf("the deploy: %v", err)
	}
	land() // if it did not wait: now, after its acknowledgement
	if _, err := store.Stat(ctx, key); err != nil {
		t.Fatalf("the deploy was acknowledged and its bundle then deleted: %v", err)
	}
}

// slowRecords takes delay to list the records: a store slow to answer.
type slowRecords struct {
	objectstore.Store
	delay time.Duration
}

func (s *slowRecords) List(ctx context.Context, prefix string) ([]objectstore.Info, error) {
	if !strings.HasPrefix(prefix, deletingDir) && !strings.HasPrefix(prefix, "bundles/") {
		time.Sleep(s.delay)
	}
	return s.Store.List(ctx, prefix)
}

// A bundle whose delete was never sent, its bound past before (the
// records slow to read under the marks), is kept, its mark removed: no
// deploy reusing it waits on it. The mark was kept as for a delete cut
// in flight, and a deploy waited for it to go stale (a review's probe).
func TestABundleDeleteNeverSentLeavesNoMark(t *testing.T) {
	ctx := context.Background()
	bound := deleteBound
	deleteBound = 100 * time.Millisecond
	t.Cleanup(func() { deleteBound = bound })
	store, age := fileStore(t)
	body := []byte("a bundle whose delete is never sent")
	key := bundle.ObjectKey(bundle.Digest(body))
	if err := store.Put(ctx, key, bytes.NewReader(body), int64(len(body))); err != nil {
		t.Fatal(err)
	}
	age(key)
	_, err := (Registry{Store: &slowRecords{Store: store, delay: 2 * deleteBound}}).GC(ctx, time.Minute)
	if !errors.Is(err, ErrBundlesKept) || strings.Contains(err.Error(), "not known") {
		t.Fatalf("gc: %v, want its bundle kept past its bound, and known to be", err)
	}
	if _, err := store.Stat(ctx, key); err != nil {
		t.Fatalf("the bundle: %v", err)
	}
	if marks, err := store.List(ctx, deletingPrefix(key)); err != nil || len(marks) != 0 {
		t.Fatalf("marks left: %v, %v; want none", marks, err)
	}
}
