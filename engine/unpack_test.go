package engine_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"log/slog"
	"math/rand"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/bundle"
	"github.com/plover-run/plover/call"
	"github.com/plover-run/plover/engine"
	"github.com/plover-run/plover/errdefs"
	"github.com/plover-run/plover/internal/testkit"
	"github.com/plover-run/plover/objectstore"
)

// unpackGate holds every deploy's unpack at its first write (the
// manifest's, in the cache's .verify-* scratch directory) until open is
// closed, counting the unpacks it holds and the most it held at once.
type unpackGate struct {
	held, most atomic.Int32
	open       chan struct{}
	once       sync.Once
}

// release opens the gate (once, whoever asks first: the test or its
// cleanup after a failure).
func (g *unpackGate) release() { g.once.Do(func() { close(g.open) }) }

func (g *unpackGate) fault(path string, n int) error {
	if !strings.Contains(path, "/.verify-") || filepath.Base(path) != abi.ManifestFile {
		return nil
	}
	h := g.held.Add(1)
	for m := g.most.Load(); h > m && !g.most.CompareAndSwap(m, h); m = g.most.Load() {
	}
	<-g.open
	g.held.Add(-1)
	return nil
}

// gatedEngine is an engine whose deploys' unpacks stop at the gate.
func gatedEngine(t *testing.T, timeout time.Duration) (*engine.Engine, *unpackGate) {
	t.Helper()
	c, err := bundle.NewCache(t.TempDir(), 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	g := &unpackGate{open: make(chan struct{})}
	c.WriteFault = g.fault
	e := testkit.Engine(t, engine.Config{Cache: c, Timeout: timeout})
	t.Cleanup(g.release) // before the engine closes
	return e, g
}

// packedAs packs the bundle directory dir under name.
func packedAs(t *testing.T, dir, name string) []byte {
	t.Helper()
	b, _, _, err := bundle.PackBytesNamed(dir, name)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// A node unpacks at most two deploys' bundles at once: a bundle of a few
// KB can unpack to gigabytes, and twenty at a time filled the node's disk
// for every tenant. The others wait for a turn, within their request's
// deadline (504 when it passes), until cancelled (503), or, with no
// deadline, for the engine's request timeout (503 saying why); then they
// all land.
func TestDeployUnpacksTakeTurns(t *testing.T) {
	dir := testkit.BundleDir(t, testkit.Manifest("turn-0"), nil)
	e, g := gatedEngine(t, 0)
	ctl := e.Control()
	errs := make(chan error, 5)
	for i := range 5 {
		name := "turn-" + string(rune('0'+i))
		b := packedAs(t, dir, name)
		go func() {
			_, err := ctl.Deploy(context.Background(), name, bytes.NewReader(b), false)
			errs <- err
		}()
	}
	engine.WaitFor(t, "two deploys unpacking and three waiting their turn", func() bool {
		return g.held.Load() == 2 && e.UnpacksWaiting() == 3
	})

	late := packedAs(t, dir, "late")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	_, err := ctl.Deploy(ctx, "late", bytes.NewReader(late), false) // every turn is held until the gate opens
	if errdefs.KindOf(err) != errdefs.KindTimeout || !strings.Contains(err.Error(), "deadline passed while it waited for its turn to unpack") {
		t.Errorf("a deploy whose deadline passed while it waited: %v (kind %v), want 504 saying so", err, errdefs.KindOf(err))
	}
	ctx, cancel = context.WithCancel(context.Background())
	cancelled := make(chan error, 1)
	go func() {
		_, err := ctl.Deploy(ctx, "late", bytes.NewReader(late), false)
		cancelled <- err
	}()
	engine.WaitFor(t, "the cancellable deploy waiting its turn", func() bool { return e.UnpacksWaiting() == 4 })
	cancel()
	if err := <-cancelled; errdefs.KindOf(err) != errdefs.KindUnavailable || !strings.Contains(err.Error(), "cancelled while it waited for its turn") {
		t.Errorf("a deploy cancelled while it waited: %v (kind %v), want 503 saying so", err, errdefs.KindOf(err))
	}

	g.release()
	for range 5 {
		if err := <-errs; err != nil {
			t.Errorf("a deploy that waited its turn: %v", err)
		}
	}
	if most := g.most.Load(); most > 2 {
		t.Errorf("%d deploys unpacked at once, want at most 2", most)
	}
	if n := e.UnpacksWaiting(); n != 0 {
		t.Errorf("%d deploys still counted waiting", n)
	}
	// Those that gave up took no turn with them.
	if _, err := ctl.Deploy(context.Background(), "late", bytes.NewReader(late), false); err != nil {
		t.Errorf("a deploy after the others: %v", err)
	}

	// A deploy over HTTP has no deadline: it waits as long as a request
	// would (the engine's timeout), then answers 503 naming the wait.
	e2, g2 := gatedEngine(t, 50*time.Millisecond)
	ctl2 := e2.Control()
	var wg sync.WaitGroup
	for i := range 2 {
		b := packedAs(t, dir, "held-"+string(rune('0'+i)))
		wg.Go(func() { ctl2.Deploy(context.Background(), "held-"+string(rune('0'+i)), bytes.NewReader(b), false) })
	}
	defer wg.Wait()
	defer g2.release()
	engine.WaitFor(t, "two deploys unpacking", func() bool { return g2.held.Load() == 2 })
	_, err = ctl2.Deploy(context.Background(), "late", bytes.NewReader(late), false)
	if errdefs.KindOf(err) != errdefs.KindUnavailable || !strings.Contains(err.Error(), "waited 50ms for a turn to unpack the bundle") {
		t.Errorf("a deploy without a deadline that waited out the engine's timeout: %v (kind %v), want 503 naming the wait", err, errdefs.KindOf(err))
	}
}

// A bundle deployed under another name than its manifest's, or for a
// target the node lacks, is refused (422) as soon as its manifest is
// read: none of its files is written to the node's disk (the refusal
// came after its library and constants, gigabytes for some, were
// unpacked, synced and read back).
func TestDeployRefusedByItsManifestWritesNothing(t *testing.T) {
	c, err := bundle.NewCache(t.TempDir(), 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var wrote []string
	c.WriteFault = func(path string, n int) error {
		mu.Lock()
		defer mu.Unlock()
		wrote = append(wrote, filepath.Base(path))
		return nil
	}
	e := testkit.Engine(t, engine.Config{Cache: c})
	m := testkit.Manifest("mine")
	m.Constants = "w.bin"
	dir := testkit.BundleDir(t, m, make([]byte, 1<<20))
	cuda := *m
	cuda.Target = abi.TargetCUDA
	cudaDir := t.TempDir()
	for _, f := range []string{m.Library, m.Constants} {
		raw, err := os.ReadFile(filepath.Join(dir, f))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(cudaDir, f), raw, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	testkit.WriteManifest(t, cudaDir, &cuda)
	for _, tc := range []struct {
		name, as, dir, want string
	}{
		{"another name", "theirs", dir, `the manifest names "mine" but the bundle is deployed as "theirs"`},
		{"a target the node lacks", "mine", cudaDir, `"cuda"`},
	} {
		b, _, _, err := bundle.PackBytes(tc.dir)
		if err != nil {
			t.Fatal(err)
		}
		_, err = e.Control().Deploy(context.Background(), tc.as, bytes.NewReader(b), false)
		mu.Lock()
		w := wrote
		wrote = nil
		mu.Unlock()
		if errdefs.KindOf(err) != errdefs.KindInvalid || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v (kind %v), want 422 containing %s", tc.name, err, errdefs.KindOf(err), tc.want)
		}
		if len(w) > 0 {
			t.Errorf("%s: refused after writing %v", tc.name, slices.Compact(w))
		}
	}
	testkit.Deploy(t, e, dir)
	if len(wrote) == 0 {
		t.Fatal("a deploy taken wrote nothing the fault saw: the check above could not fail")
	}
}

// A deploy whose unpack fails on this node's own disk or files (an I/O
// error, a read-only or full disk, out of descriptors) is the node's
// fault: 503, or 507 for a full disk, naming the errno, never 422
// "invalid bundle" for a bundle that is fine; and no answer names where
// the node keeps its files. A damaged bundle is still the bundle's 422.
func TestDeployUnpackFailuresOfTheNode(t *testing.T) {
	dir := testkit.BundleDir(t, testkit.Manifest("disk"), nil)
	b := packedAs(t, dir, "disk")
	c, err := bundle.NewCache(t.TempDir(), 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	spool := t.TempDir()
	var stage string
	var errno syscall.Errno
	fail := func(path string, n int) error {
		if strings.Contains(path, stage) {
			return errno
		}
		return nil
	}
	c.WriteFault = fail
	e := testkit.Engine(t, engine.Config{Cache: c, SpoolDir: spool, WriteFault: fail})
	for _, tc := range []struct {
		stage string
		errno syscall.Errno
		want  errdefs.Kind
	}{
		{"/.verify-", syscall.EIO, errdefs.KindUnavailable},
		{"/.verify-", syscall.EROFS, errdefs.KindUnavailable},
		{"/.verify-", syscall.EMFILE, errdefs.KindUnavailable},
		{"/.verify-", syscall.ENOSPC, errdefs.KindNoSpace},
		{"/.verify-", syscall.EDQUOT, errdefs.KindNoSpace},
		{"/plover-deploy-", syscall.EIO, errdefs.KindUnavailable},
		{"/plover-deploy-", syscall.ENOSPC, errdefs.KindNoSpace},
	} {
		stage, errno = tc.stage, tc.errno
		_, err := e.Control().Deploy(context.Background(), "disk", bytes.NewReader(b), false)
		var de *errdefs.Error
		if !errors.As(err, &de) {
			t.Errorf("%s at %s: %v, not a classified error", tc.errno, tc.stage, err)
			continue
		}
		msg := de.Msg // what the client reads; the cause is the log's
		switch {
		case de.Kind != tc.want:
			t.Errorf("%s at %s: %v (kind %v), want kind %v", tc.errno, tc.stage, err, errdefs.KindOf(err), tc.want)
		case strings.Contains(msg, c.Dir()) || strings.Contains(msg, spool) || strings.Contains(msg, tc.stage):
			t.Errorf("%s at %s: the answer names the node's files: %s", tc.errno, tc.stage, msg)
		case !strings.Contains(msg, "deploy disk: ") || !strings.Contains(msg, tc.errno.Error()):
			t.Errorf("%s at %s: %q does not name the function and the errno", tc.errno, tc.stage, msg)
		}
	}
	// Damaged within its constants (random bytes, which zstd keeps as
	// they are: the byte flipped is theirs, far past the stream's first
	// blocks), the stream fails as the entry is read, not as a refusal of
	// the archive's (a *bundle.Error).
	stage = "nothing fails"
	mc := testkit.Manifest("damaged")
	mc.Constants = "w.bin"
	consts := make([]byte, 1<<20)
	rand.New(rand.NewSource(1)).Read(consts)
	damaged := packedAs(t, testkit.BundleDir(t, mc, consts), "damaged")
	damaged[len(damaged)*3/4] ^= 0xff
	_, err = e.Control().Deploy(context.Background(), "damaged", bytes.NewReader(damaged), false)
	var be *bundle.Error
	if errdefs.KindOf(err) != errdefs.KindInvalid || errors.As(err, &be) || !strings.Contains(err.Error(), "unpack w.bin: reading the archive") || strings.Contains(err.Error(), c.Dir()) || strings.Contains(err.Error(), spool) {
		t.Errorf("a bundle damaged within its constants: %v (kind %v), want 422 naming the entry and no path of the node's", err, errdefs.KindOf(err))
	}
	testkit.Deploy(t, e, dir)
}

// A deploy stores no bundle that another node with the same bundle cache
// would refuse to fetch: one whose archive is over the cache's limit on
// what it fetches (Cache.MaxObject) is 413 naming that limit, though it
// unpacks within it and --max-body is higher, and nothing is stored; one
// at the limit deploys, and another node's cache with the same limit
// fetches it.
func TestDeployStoresOnlyWhatEveryNodeFetches(t *testing.T) {
	ctx := context.Background()
	// An archive larger than its files, as tar's headers and zstd's
	// frames make one of incompressible constants near the limit: here by
	// a skippable frame of 16 KiB, which unpacking passes over.
	b := packedAs(t, testkit.BundleDir(t, testkit.Manifest("big"), nil), "big")
	b = binary.LittleEndian.AppendUint32(b, 0x184D2A50)
	b = binary.LittleEndian.AppendUint32(b, 16<<10)
	b = append(b, make([]byte, 16<<10)...)
	size := int64(len(b))
	if _, err := bundle.Unpack(bytes.NewReader(b), t.TempDir(), size-1); err != nil {
		t.Fatalf("the bundle does not unpack within %d bytes, so this test cannot tell the archive's limit: %v", size-1, err)
	}
	for _, limit := range []int64{size - 1, size} {
		store, err := objectstore.NewFS(t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		cache, err := bundle.NewCache(t.TempDir(), limit, 0)
		if err != nil {
			t.Fatal(err)
		}
		e := testkit.Engine(t, engine.Config{Store: store, Cache: cache, MaxBundleBytes: 1 << 20})
		_, derr := e.Control().Deploy(ctx, "big", bytes.NewReader(b), false)
		other, err := bundle.NewCache(t.TempDir(), limit, 0)
		if err != nil {
			t.Fatal(err)
		}
		_, _, _, ferr := other.Get(ctx, store, bundle.Digest(b))
		if ferr == nil {
			other.Release(bundle.Digest(b))
		}
		var de *errdefs.Error
		switch {
		case limit < size && (!errors.As(derr, &de) || de.Kind != errdefs.KindTooLarge || !strings.Contains(de.Msg, "larger than "+strconv.FormatInt(limit, 10)+" bytes, the most any node's bundle cache fetches")):
			t.Errorf("an archive of %d bytes, %d allowed: %v, want 413 naming the cache's limit", size, limit, derr)
		case limit < size && !errors.Is(ferr, objectstore.ErrNotFound):
			t.Errorf("an archive of %d bytes, %d allowed, refused, is in the store: %v", size, limit, ferr)
		case limit == size && (derr != nil || ferr != nil):
			t.Errorf("an archive of %d bytes, %d allowed: deploy %v, another node's fetch %v", size, limit, derr, ferr)
		}
	}
	// Below the cache's limit, --max-body is the one named.
	e := testkit.Engine(t, engine.Config{MaxBundleBytes: size - 1})
	_, err := e.Control().Deploy(ctx, "big", bytes.NewReader(b), false)
	if errdefs.KindOf(err) != errdefs.KindTooLarge || !strings.Contains(err.Error(), "(plover serve --max-body)") {
		t.Errorf("over --max-body: %v, want 413 naming it", err)
	}
}

// A cold start whose fetch or unpack of its bundle into the bundle cache
// fills this node's disk is 507 naming the stage, the bundle and the
// errno, not the cache's directory, which the server log has.
func TestColdStartDiskFullNamesTheStageNotThePath(t *testing.T) {
	dir := testkit.BundleDir(t, testkit.Manifest("cold"), nil)
	store, err := objectstore.NewFS(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	fi := testkit.Deploy(t, testkit.Engine(t, engine.Config{Store: store}), dir)
	for _, tc := range []struct{ at, stage string }{{"/.fetch-", "fetching"}, {"/.unpack-", "unpacking"}} {
		cache, err := bundle.NewCache(t.TempDir(), 0, 0)
		if err != nil {
			t.Fatal(err)
		}
		var full atomic.Bool
		full.Store(true)
		cache.WriteFault = func(path string, n int) error {
			if full.Load() && strings.Contains(path, tc.at) {
				return syscall.ENOSPC
			}
			return nil
		}
		var log testkit.LogBuffer
		e := testkit.Engine(t, engine.Config{Store: store, Cache: cache, Log: slog.New(slog.NewTextHandler(&log, nil))})
		err = e.Invoke(context.Background(), "cold", &call.Request{Input: []byte("x")})
		var de *errdefs.Error
		want := "function cold: cold start: this node's disk is full: " + tc.stage + " bundle " + fi.SHA256[:12] + " into the node's bundle cache failed (no space left on device)"
		switch {
		case !errors.As(err, &de) || de.Kind != errdefs.KindNoSpace:
			t.Errorf("%s: %v, want 507", tc.stage, err)
		case de.Msg != want:
			t.Errorf("%s: the answer is %q, want %q", tc.stage, de.Msg, want)
		case !strings.Contains(log.String(), cache.Dir()):
			t.Errorf("%s: the log does not name the cache's directory: %s", tc.stage, log.String())
		}
		full.Store(false)
		invoke(t, e, "cold", []byte("x"))
	}
}

// bundlePutGate holds every bundle's Put until opened, counting those
// held: a bucket slow to take bundles.
type bundlePutGate struct {
	objectstore.Store
	held atomic.Int32
	open chan struct{}
}

func (g *bundlePutGate) Put(ctx context.Context, key string, r io.Reader, size int64) error {
	if strings.HasPrefix(key, "bundles/") {
		g.held.Add(1)
		<-g.open
	}
	return g.Store.Put(ctx, key, r, size)
}

// A deploy gives its turn to unpack back once its bundle is in the cache,
// before it writes to the store: two deploys to a slow bucket held both
// of the node's turns through their writes, and every other deploy waited.
func TestADeployWritingToTheStoreHoldsNoTurn(t *testing.T) {
	fs, err := objectstore.NewFS(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	g := &bundlePutGate{Store: fs, open: make(chan struct{})}
	c, err := bundle.NewCache(t.TempDir(), 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	e := testkit.Engine(t, engine.Config{Store: g, Cache: c})
	dir := testkit.BundleDir(t, testkit.Manifest("w-0"), nil)
	errs := make(chan error, 3)
	opened := false
	open := func() {
		if !opened {
			opened = true
			close(g.open)
		}
	}
	defer open() // before the engine closes
	for i := range 3 {
		name := "w-" + strconv.Itoa(i)
		b := packedAs(t, dir, name)
		go func() {
			_, err := e.Control().Deploy(context.Background(), name, bytes.NewReader(b), false)
			errs <- err
		}()
	}
	engine.WaitFor(t, "three deploys writing their bundles to the store at once", func() bool { return g.held.Load() == 3 })
	open()
	for range 3 {
		if err := <-errs; err != nil {
			t.Errorf("deploy: %v", err)
		}
	}
	if n := c.Stats().Bundles; n != 3 { // their first requests fetch nothing
		t.Errorf("%d bundles in the cache, want the 3 deployed", n)
	}
	invoke(t, e, "w-2", []byte("x"))
}

// A version whose cached bundle is damaged while another version of the
// same bundle holds it loaded (one a request named, idle until reaped) is
// answered 503 saying so, naming no path of the node's (the log has
// them): the cache cannot replace the files under the holder.
func TestADamagedBundleInUseIsTheNodes503(t *testing.T) {
	c, err := bundle.NewCache(t.TempDir(), 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	e := testkit.Engine(t, engine.Config{Cache: c})
	m := testkit.Manifest("fn")
	m.Constants = "w.bin"
	dir := testkit.BundleDir(t, m, make([]byte, 4096))
	first := testkit.Deploy(t, e, dir)
	testkit.ForceDeploy(t, e, dir) // the same bundle, a version of its own, current
	ctx := context.Background()
	pin, err := e.PinVersion(ctx, "fn", first.Version, time.Now().Add(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	defer pin.Release()
	if err := pin.Invoke(ctx, &call.Request{Input: []byte("x")}); err != nil { // first loaded: it holds the bundle
		t.Fatal(err)
	}
	w := filepath.Join(c.Dir(), first.SHA256, "w.bin")
	if err := os.WriteFile(w, make([]byte, 4095), 0o644); err != nil {
		t.Fatal(err)
	}
	err = e.Invoke(ctx, "fn", &call.Request{Input: []byte("x")})
	var de *errdefs.Error
	if !errors.As(err, &de) || de.Kind != errdefs.KindUnavailable || !strings.Contains(de.Msg, "is damaged and still in use") || strings.Contains(de.Msg, c.Dir()) {
		t.Fatalf("a version of a damaged bundle another version holds: %v; want 503 saying so, naming no path", err)
	}
}
