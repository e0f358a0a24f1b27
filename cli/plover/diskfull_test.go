package main_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/plover-run/plover/bundle"
	"github.com/plover-run/plover/engine"
	"github.com/plover-run/plover/httpapi"
	"github.com/plover-run/plover/internal/testkit"
	"github.com/plover-run/plover/objectstore"
)

// TestDiskFull: a node whose disk fills at each stage that writes to it (a
// deploy's spooling and unpacking of the upload, the file store's write, a
// cold start's fetch and unpacking into the bundle cache) answers 507
// insufficient_storage naming the stage (a cold start: its fetch or unpack
// into the node's bundle cache, not the store, which is fine) and never
// where the node keeps its files; a function already warm keeps serving
// meanwhile; and once the space is back the same request succeeds, with
// nothing to repair and no leftovers of the failed one on the disk.
//
// Two nodes run the same stages: a real `plover serve` on small tmpfs
// mounts of its own (a private mount namespace; skipped where the test may
// not make one, as in most CI containers), and an in-process server with
// the real engine, cache, file store and HTTP API whose writes go through
// the WriteFault seams (bundle.Cache, engine.Config), which runs anywhere.
func TestDiskFull(t *testing.T) {
	if testing.Short() {
		t.Skip("builds binaries and starts servers")
	}
	bin := buildPlover(t)
	spin, vecadd := sampleDir(t, "spin-host"), sampleDir(t, "vecadd-host")
	t.Run("tmpfs", func(t *testing.T) { diskFullStages(t, bin, tmpfsNode(t, bin), spin, vecadd) })
	t.Run("seam", func(t *testing.T) { diskFullStages(t, bin, seamNode(t), spin, vecadd) })
}

// disk is one of a node's disks.
type disk int

const (
	nodeDisk  disk = iota // --data: the spool and the bundle cache
	storeDisk             // the file store's directory
)

// diskNode is a serving node whose disks the test can fill.
type diskNode struct {
	url      string
	storeURL string // the node's store, for `plover deploy --store` from here
	data     string // its data directory, as this process reaches it
	store    string // its file store's directory, as this process reaches it
	cacheDir string // its bundle cache, as the node would name it
	// fill leaves about free bytes on d (0: none at all); empty gives d its
	// space back (a no-op on a disk not filled).
	fill  func(t *testing.T, d disk, free int64)
	empty func(t *testing.T, d disk)
}

func diskFullStages(t *testing.T, bin string, n *diskNode, spin, vecadd string) {
	in := bytes.Repeat([]byte("full"), 8)
	spinWant := spinOut(in, 1024)
	vecIn := readSample(t, "vecadd-input.bin")
	vecWant := readSample(t, "vecadd-expected.bin")
	// The vecadd sample packs to a few KiB (its 4 MB of constants compress
	// well): a disk with room for that and not for the unpacked files fills
	// at the unpacking, after the upload or the fetch went through.
	const roomPacked = 256 << 10

	warm := sampleVariant(t, spin, "warm", nil)
	if code, body, err := putBundle(http.DefaultClient, n.url, warm.name, warm.packed); err != nil || code != http.StatusCreated {
		t.Fatalf("deploy %s: %d %v %.300s", warm.name, code, err, body)
	}
	mustServe(t, n.url, "warm", in, spinWant, "")

	for _, st := range []struct {
		name   string // also the function's
		disk   disk
		free   int64
		sample string
		cold   bool     // an invoke of a bundle another client put in the store; else a deploy through the node
		want   []string // in the 507's message: the stage
	}{
		{"deploy-spool", nodeDisk, 0, spin, false, []string{"deploy deploy-spool: spooling the bundle", "no space left on device"}},
		{"deploy-unpack", nodeDisk, roomPacked, vecadd, false, []string{"deploy deploy-unpack: unpacking the bundle", "no space left on device"}},
		{"deploy-store", storeDisk, 0, spin, false, []string{"deploy deploy-store: cannot write to the store", "no space left on device"}},
		{"cold-fetch", nodeDisk, 0, spin, true, []string{"function cold-fetch: cold start: this node's disk is full: fetching bundle ", " into the node's bundle cache failed (no space left on device)"}},
		{"cold-unpack", nodeDisk, roomPacked, vecadd, true, []string{"function cold-unpack: cold start: this node's disk is full: unpacking bundle ", " into the node's bundle cache failed (no space left on device)"}},
	} {
		t.Run(st.name, func(t *testing.T) {
			input, want := in, spinWant
			if st.sample == vecadd {
				input, want = vecIn, vecWant
			}
			var request func() isoResp
			if st.cold {
				// Deployed by a client of the store, so that this node's
				// first invoke fetches it (a deploy through the node
				// would leave it in the node's cache).
				run(t, bin, nil, "deploy", sampleVariantDir(t, st.sample, st.name, nil), "--store", n.storeURL)
				request = func() isoResp { return invokeResp(n.url, st.name, input) }
			} else {
				b := sampleVariant(t, st.sample, st.name, nil)
				request = func() isoResp {
					code, body, err := putBundle(http.DefaultClient, n.url, b.name, b.packed)
					return isoResp{code: code, body: body, err: err}
				}
			}
			t.Cleanup(func() { n.empty(t, st.disk) }) // a failed stage must not leave the next one a full disk

			n.fill(t, st.disk, st.free)
			r := request()
			if r.err != nil {
				t.Fatalf("on a full disk: %v", r.err)
			}
			msg := expectError(t, r, http.StatusInsufficientStorage, "insufficient_storage", "")
			for _, w := range st.want {
				if !strings.Contains(msg, w) {
					t.Errorf("the 507's message does not say %q: %s", w, msg)
				}
			}
			if strings.Contains(msg, "from the store") {
				t.Errorf("the 507 blames the store, which is fine: %s", msg)
			}
			if strings.Contains(msg, n.cacheDir) {
				t.Errorf("the 507 names where the node keeps its files (the log's alone): %s", msg)
			}
			mustServe(t, n.url, "warm", in, spinWant, "cold")

			n.empty(t, st.disk)
			r = request()
			if st.cold {
				if r.err != nil || r.code != http.StatusOK || !bytes.Equal(r.body, want) {
					t.Fatalf("invoke %s once the space is back: %d %v, %d bytes (%.200q)", st.name, r.code, r.err, len(r.body), r.body)
				}
			} else {
				if r.err != nil || r.code != http.StatusCreated {
					t.Fatalf("deploy %s once the space is back: %d %v %.300s", st.name, r.code, r.err, r.body)
				}
				mustServe(t, n.url, st.name, input, want, "")
			}
			checkNoLeftovers(t, n.data, n.store)
		})
	}
}

// invokeResp invokes name with in as octet-stream.
func invokeResp(url, name string, in []byte) isoResp {
	resp, err := http.Post(url+"/v1/functions/"+name+"/invoke", "application/octet-stream", bytes.NewReader(in))
	if err != nil {
		return isoResp{err: err}
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return isoResp{code: resp.StatusCode, body: body, hdr: resp.Header, err: err}
}

// mustServe invokes name and wants 200 with want, started otherwise than
// notStart ("cold": the request must not have needed the disk) when set.
func mustServe(t *testing.T, url, name string, in, want []byte, notStart string) {
	t.Helper()
	r := invokeResp(url, name, in)
	if r.err != nil || r.code != http.StatusOK || !bytes.Equal(r.body, want) {
		t.Fatalf("invoke %s: %d %v, %d bytes (%.200q)", name, r.code, r.err, len(r.body), r.body)
	}
	if s := r.hdr.Get("X-Plover-Start"); notStart != "" && s == notStart {
		t.Errorf("invoke %s: X-Plover-Start %s", name, s)
	}
}

// checkNoLeftovers: a failed request cleaned up after itself; nothing it
// wrote is left in the spool, the cache holds only complete bundles and the
// store no half-written object.
func checkNoLeftovers(t *testing.T, data, store string) {
	t.Helper()
	filepath.WalkDir(store, func(p string, de fs.DirEntry, err error) error {
		if err == nil && strings.HasPrefix(de.Name(), ".put-") {
			t.Errorf("the store holds %s", p)
		}
		return err
	})
	if left, err := os.ReadDir(filepath.Join(data, "spool")); err != nil || len(left) > 0 {
		t.Errorf("the spool holds %d files (%v)", len(left), err)
	}
	cached, err := os.ReadDir(filepath.Join(data, "cache"))
	if err != nil {
		t.Fatal(err)
	}
	for _, de := range cached {
		if !bundle.ValidDigest(de.Name()) {
			t.Errorf("the cache holds %s", de.Name())
		}
	}
}

func readSample(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(testkit.Root(), "build", "samples", name))
	if err != nil {
		t.Skipf("no %s (run make samples): %v", name, err)
	}
	return b
}

// ---- a real server on tmpfs mounts ------------------------------------------

const mountTmpfs = `mount -t tmpfs -o size=32m plover-node "$1" && mount -t tmpfs -o size=8m plover-store "$2" && shift 2 && exec "$@"`

// inPrivateMounts makes a command run in a mount namespace of its own
// (through a user namespace when not root), where mountTmpfs may mount; the
// mounts go with its last process.
func inPrivateMounts(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Unshareflags: syscall.CLONE_NEWNS}
	if os.Geteuid() != 0 {
		cmd.SysProcAttr.Cloneflags = syscall.CLONE_NEWUSER
		cmd.SysProcAttr.UidMappings = []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Getuid(), Size: 1}}
		cmd.SysProcAttr.GidMappings = []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Getgid(), Size: 1}}
	}
}

// tmpfsNode starts `plover serve` with its data directory on a 32 MiB tmpfs
// and its file store on an 8 MiB one, both seen only by the server, and
// reaches them through /proc/PID/root.
func tmpfsNode(t *testing.T, bin string) *diskNode {
	data, store := t.TempDir(), t.TempDir()
	probe := exec.Command("sh", "-c", mountTmpfs, "sh", data, store, "true")
	inPrivateMounts(probe)
	if out, err := probe.CombinedOutput(); err != nil {
		t.Skipf("cannot mount a tmpfs in a private mount namespace here (%v: %s); the seam subtest runs the same stages", err, bytes.TrimSpace(out))
	}
	args := []string{"sh", "-c", mountTmpfs, "sh", data, store, bin, "serve", "--listen", "127.0.0.1:0", "--data", data, "--store", "file://" + store, "--device", "host"}
	if os.Geteuid() != 0 {
		// The namespace maps one uid, the server's: there is no other for
		// its workers to run as.
		args = append(args, "--isolation", "none")
	}
	cmd := exec.Command(args[0], args[1:]...)
	inPrivateMounts(cmd)
	srv := startIsoCmd(t, cmd, data)
	waitReady(t, srv.url)
	root := fmt.Sprintf("/proc/%d/root", srv.pid)
	mounts := map[disk]string{nodeDisk: root + data, storeDisk: root + store}
	return &diskNode{
		url: srv.url, storeURL: "file://" + root + store, data: root + data, store: root + store, cacheDir: filepath.Join(data, "cache"),
		fill:  func(t *testing.T, d disk, free int64) { fillTmpfs(t, mounts[d], free) },
		empty: func(t *testing.T, d disk) { os.Remove(filepath.Join(mounts[d], "filler")) },
	}
}

// fillTmpfs writes a filler file into the file system at dir until about
// free bytes are left (a page either way), or none at all for 0.
func fillTmpfs(t *testing.T, dir string, free int64) {
	t.Helper()
	avail := func() int64 {
		var st syscall.Statfs_t
		if err := syscall.Statfs(dir, &st); err != nil {
			t.Fatal(err)
		}
		return int64(st.Bavail) * st.Bsize
	}
	f, err := os.OpenFile(filepath.Join(dir, "filler"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zeros := make([]byte, 1<<20)
	if free == 0 {
		for {
			_, err := f.Write(zeros)
			if errors.Is(err, syscall.ENOSPC) {
				break
			}
			if err != nil {
				t.Fatalf("filling %s: %v", dir, err)
			}
		}
	}
	for left := avail() - free; left > 0; left -= int64(len(zeros)) {
		if _, err := f.Write(zeros[:min(left, int64(len(zeros)))]); err != nil {
			t.Fatalf("filling %s: %v", dir, err)
		}
	}
	if got := avail(); got > free+4096 || got < free-4096 {
		t.Fatalf("filled %s to %d bytes free, want %d", dir, got, free)
	}
}

// ---- an in-process server behind the seams ----------------------------------

// seamDisk is a disk with free bytes left (-1: unlimited) that every write
// through a seam takes from, failing with ENOSPC once they are gone. Space
// freed by removing files is not given back: a stage's requests fit.
type seamDisk struct{ free atomic.Int64 }

func (d *seamDisk) fault(path string, n int) error {
	for {
		f := d.free.Load()
		if f < 0 {
			return nil
		}
		if int64(n) > f {
			return syscall.ENOSPC
		}
		if d.free.CompareAndSwap(f, f-int64(n)) {
			return nil
		}
	}
}

// seamStore is a file store on a seamDisk: a Put or PutIf that does not
// fit fails as objectstore.FS's does when its disk fills, before writing.
type seamStore struct {
	objectstore.Store
	root string
	disk *seamDisk
}

func (s seamStore) full(key string, size int64) error {
	err := s.disk.fault(key, int(size))
	if err == nil {
		return nil
	}
	return fmt.Errorf("put %s: %w", key, &os.PathError{Op: "write", Path: filepath.Join(s.root, filepath.Dir(key), ".put-seam"), Err: err})
}

func (s seamStore) Put(ctx context.Context, key string, r io.Reader, size int64) error {
	if err := s.full(key, size); err != nil {
		return err
	}
	return s.Store.Put(ctx, key, r, size)
}

func (s seamStore) PutIf(ctx context.Context, key string, r io.Reader, size int64, ifMatch string) error {
	if err := s.full(key, size); err != nil {
		return err
	}
	return s.Store.PutIf(ctx, key, r, size, ifMatch)
}

// seamNode serves the real engine (file store, bundle cache, the host
// device in process) through the HTTP API, with the node's and the store's
// writes behind seamDisks.
func seamNode(t *testing.T) *diskNode {
	data := t.TempDir()
	disks := map[disk]*seamDisk{nodeDisk: {}, storeDisk: {}}
	for _, d := range disks {
		d.free.Store(-1)
	}
	files, err := objectstore.NewFS(filepath.Join(data, "store"))
	if err != nil {
		t.Fatal(err)
	}
	cache, err := bundle.NewCache(filepath.Join(data, "cache"), 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	cache.WriteFault = disks[nodeDisk].fault
	spool := filepath.Join(data, "spool")
	if err := os.Mkdir(spool, 0o700); err != nil {
		t.Fatal(err)
	}
	e := testkit.Engine(t, engine.Config{
		Store: seamStore{Store: files, root: filepath.Join(data, "store"), disk: disks[storeDisk]},
		Cache: cache, SpoolDir: spool, WriteFault: disks[nodeDisk].fault,
	})
	return &diskNode{
		url: testkit.Serve(t, e, httpapi.Options{}), storeURL: "file://" + filepath.Join(data, "store"),
		data: data, store: filepath.Join(data, "store"), cacheDir: cache.Dir(),
		fill:  func(t *testing.T, d disk, free int64) { disks[d].free.Store(free) },
		empty: func(t *testing.T, d disk) { disks[d].free.Store(-1) },
	}
}
