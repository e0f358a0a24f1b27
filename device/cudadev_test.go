package device

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/plover-run/plover/internal/fakecuda"
	"github.com/plover-run/plover/loader"
)

// The CUDA device is tested twice over with one suite: against the fake
// driver (testdata/fakecuda, built with gcc; runs anywhere) and against a
// real GPU with testdata/kernels.cu (skipped without one). The fake shows
// the Go and C logic does what it means to; only the GPU run shows the
// driver agrees.

var testEntries = []string{"pl_load", "pl_add_const", "pl_inc", "pl_store", "pl_count", "pl_copy", "pl_fault", "pl_hostile"}

// fakeEntries are testEntries and the fake bundle's own: pl_hold.
var fakeEntries = append(testEntries[:len(testEntries):len(testEntries)], "pl_hold")

var cleanupDirs struct {
	sync.Mutex
	dirs []string
}

func removeLater(dir string) {
	cleanupDirs.Lock()
	cleanupDirs.dirs = append(cleanupDirs.dirs, dir)
	cleanupDirs.Unlock()
}

func TestMain(m *testing.M) {
	code := m.Run()
	fakecuda.Remove()
	for _, d := range cleanupDirs.dirs {
		os.RemoveAll(d)
	}
	os.Exit(code)
}

// bundleEnv is the test bundle loaded for one driver, and a way to open that
// driver's devices.
type bundleEnv struct {
	name    string
	fake    bool
	open    func(t testing.TB, limit int64, log *slog.Logger) *GPU
	lib     *loader.Library
	ents    *Entries
	calls   *int64    // the bundle's pl_entry_calls
	live    *[8]int64 // the fake driver's object counts; nil on a GPU
	ordinal int       // the device the suite uses
}

func (e *bundleEnv) step(t testing.TB, name string, grid, block int32) Step {
	t.Helper()
	i, err := e.ents.Resolve(name)
	if err != nil {
		t.Fatal(err)
	}
	return Step{Entry: i, Grid: grid, Block: block}
}

func (e *bundleEnv) entryCalls() int64 { return atomic.LoadInt64(e.calls) }

// gpu opens the env's device for one test; it is closed when the test ends.
// Opening again only retains the primary context again, so each test gets
// its own GPU object (own budget, logger and once-per-device log state).
func (e *bundleEnv) gpu(t testing.TB) *GPU { return e.open(t, 0, nil) }

func (e *bundleEnv) fresh(t testing.TB, limit int64, log *slog.Logger) *GPU {
	return e.open(t, limit, log)
}

type logBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuf) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func newLog() (*slog.Logger, *logBuf) {
	b := &logBuf{}
	return slog.New(slog.NewTextHandler(b, nil)), b
}

// ---- the fake driver ----

var fake struct {
	env *bundleEnv
}

func fakeDir(t testing.TB) string {
	t.Helper()
	dir, err := fakecuda.Shared()
	if err != nil {
		t.Skipf("cannot build the fake CUDA driver: %v", err)
	}
	return dir
}

func fakeLib(t testing.TB) string { return filepath.Join(fakeDir(t), "libfakecuda.so") }

func openFake(t testing.TB, ordinal int, limit int64, log *slog.Logger) *GPU {
	t.Helper()
	gpus, err := openGPUs(fakeLib(t), limit, log)
	if err != nil {
		t.Fatalf("open fake driver: %v", err)
	}
	// Close them all: the fake, like a real driver, frees a primary context
	// (and so forgets a sticky error) only when its last retain is released.
	t.Cleanup(func() {
		for _, g := range gpus {
			g.Close()
		}
	})
	return gpus[ordinal]
}

func fakeEnv(t testing.TB) *bundleEnv {
	t.Helper()
	dir := fakeDir(t)
	if fake.env == nil {
		lib, err := loader.Open(filepath.Join(dir, "fakebundle.so"), "cuda", fakeEntries)
		if err != nil {
			t.Fatal(err)
		}
		calls, err := lib.Symbol("pl_entry_calls")
		if err != nil {
			t.Fatal(err)
		}
		// dlsym on the bundle's handle searches its dependencies too.
		live, err := lib.Symbol("fakecu_live")
		if err != nil {
			t.Fatal(err)
		}
		fake.env = &bundleEnv{name: "fake", fake: true, lib: lib, ents: NewEntries(lib),
			calls: (*int64)(calls), live: (*[8]int64)(live)}
	}
	e := *fake.env
	e.open = func(t testing.TB, limit int64, log *slog.Logger) *GPU {
		return openFake(t, e.ordinal, limit, log)
	}
	return &e
}

// ---- expected results ----

func randBytes(r *rand.Rand, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.UintN(256))
	}
	return b
}

// chainOut is what load → add_const → inc → store computes.
func chainOut(in, c []byte, tmpLen, outLen int, addConst bool) []byte {
	tmp := make([]byte, tmpLen)
	for i := range tmp {
		if i < len(in) {
			tmp[i] = in[i]
		}
		if addConst && len(c) > 0 {
			tmp[i] += c[i%len(c)]
		}
		tmp[i]++
	}
	out := make([]byte, outLen)
	for i := range out {
		if tmpLen > 0 {
			out[i] = tmp[i%tmpLen]
		}
	}
	return out
}

func firstDiff(a, b []byte) string {
	if len(a) != len(b) {
		return fmt.Sprintf("lengths %d and %d", len(a), len(b))
	}
	for i := range a {
		if a[i] != b[i] {
			return fmt.Sprintf("byte %d: got %#x, want %#x", i, a[i], b[i])
		}
	}
	return "equal"
}

func mustRun(t testing.TB, inst Instance, r *Run) {
	t.Helper()
	if err := inst.Run(r); err != nil {
		t.Fatalf("run: %v", err)
	}
}

func newInst(t testing.TB, g *GPU, e *bundleEnv, cfg InstanceConfig) *gpuInstance {
	t.Helper()
	cfg.Entries = e.ents
	inst, err := g.NewInstance(cfg)
	if err != nil {
		t.Fatalf("new instance: %v", err)
	}
	t.Cleanup(inst.Close)
	return inst.(*gpuInstance)
}

// ---- the suite ----

var suite = []struct {
	name string
	fn   func(*testing.T, *bundleEnv)
}{
	{"Chain", testChain},
	{"LargeConstants", testLargeConstants},
	{"GraphReplay", testGraphReplay},
	{"ZeroTmp", testZeroTmp},
	{"BadLaunch", testBadLaunch},
	{"CaptureFallback", testCaptureFallback},
	{"Concurrent", testConcurrent},
	{"HostBuffer", testHostBuffer},
	{"MemfdSlot", testMemfdSlot},
	{"OutLen", testOutLen},
	{"Hooks", testHooks},
	{"HookDefaultStream", testHookDefaultStream},
	{"CopyPieces", testCopyPieces},
	{"StreamPriorities", testStreamPriorities},
}

func runSuite(t *testing.T, e *bundleEnv) {
	for _, c := range suite {
		t.Run(c.name, func(t *testing.T) { c.fn(t, e) })
	}
}

func TestFakeSuite(t *testing.T) { runSuite(t, fakeEnv(t)) }

func testChain(t *testing.T, e *bundleEnv) {
	g := e.gpu(t)
	r := rand.New(rand.NewPCG(1, 2))
	consts := randBytes(r, 777)
	before := g.MemInfo()
	c, err := g.LoadConstants(bytes.NewReader(consts), int64(len(consts)))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Free()
	if got := g.MemInfo().Used - before.Used; got != 777 {
		t.Errorf("constants: Used grew by %d, want 777", got)
	}
	inst := newInst(t, g, e, InstanceConfig{MaxInput: 1000, Tmp: 4096, Out: 3000, Constants: c})
	if got, want := g.MemInfo().Used-before.Used, int64(777+1000+4096+3000); got != want {
		t.Errorf("instance: Used grew by %d, want %d", got, want)
	}
	if inst.DeviceBytes() != 1000+4096+3000 {
		t.Errorf("DeviceBytes = %d", inst.DeviceBytes())
	}
	chain := []Step{e.step(t, "pl_load", 64, 64), e.step(t, "pl_add_const", 64, 64),
		e.step(t, "pl_inc", 64, 64), e.step(t, "pl_store", 64, 64)}
	for _, tc := range []struct{ in, tmp, out int }{{1000, 4096, 3000}, {10, 4096, 3000}, {0, 100, 50}, {1000, 300, 3000}} {
		in := randBytes(r, tc.in)
		out := make([]byte, tc.out)
		run := &Run{Input: in, Output: out, Chain: chain, TmpLen: int64(tc.tmp)}
		mustRun(t, inst, run)
		if want := chainOut(in, consts, tc.tmp, tc.out, true); !bytes.Equal(out, want) {
			t.Errorf("in=%d tmp=%d out=%d: %s", tc.in, tc.tmp, tc.out, firstDiff(out, want))
		}
		tm := run.Timing
		if tm.CopyIn < 0 || tm.Kernels < 0 || tm.CopyOut < 0 || (!e.fake && tm.Kernels == 0) {
			t.Errorf("timing %+v", tm)
		}
	}
	// Bad requests are refused before the GPU sees them.
	for _, bad := range []*Run{
		{Input: make([]byte, 1001), Output: make([]byte, 1), Chain: chain},
		{Output: make([]byte, 3001), Chain: chain},
		{Output: make([]byte, 1), Chain: chain, TmpLen: 4097},
		{Output: make([]byte, 1)},
	} {
		if err := inst.Run(bad); err == nil {
			t.Errorf("run %+v: no error", bad)
		}
	}
	// Constants belong to their device.
	hc, err := NewHost(0).LoadConstants(bytes.NewReader([]byte{1}), 1)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := g.NewInstance(InstanceConfig{Constants: hc}); err == nil || !strings.Contains(err.Error(), "another device") {
		t.Errorf("foreign constants: %v", err)
	}
	hc.Free()
	inst.Close()
	inst.Close()
	if got := g.MemInfo().Used - before.Used; got != 777 {
		t.Errorf("after Close: Used is %d over the start, want 777", got)
	}
}

func testLargeConstants(t *testing.T, e *bundleEnv) {
	g := e.gpu(t)
	r := rand.New(rand.NewPCG(3, 4))
	n := 2*constantsChunk + 12345 // several staging chunks and a partial one
	consts := randBytes(r, n)
	before := g.MemInfo().Used
	c, err := g.LoadConstants(bytes.NewReader(consts), int64(n))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Free()
	if c.Size() != int64(n) {
		t.Errorf("Size = %d", c.Size())
	}
	// tmp as long as the constants: add_const then reads every byte.
	inst := newInst(t, g, e, InstanceConfig{MaxInput: 16, Tmp: int64(n), Out: int64(n), Constants: c})
	out := make([]byte, n)
	in := randBytes(r, 16)
	chain := []Step{e.step(t, "pl_load", 256, 256), e.step(t, "pl_add_const", 256, 256),
		e.step(t, "pl_inc", 256, 256), e.step(t, "pl_store", 256, 256)}
	mustRun(t, inst, &Run{Input: in, Output: out, Chain: chain, TmpLen: int64(n)})
	if want := chainOut(in, consts, n, n, true); !bytes.Equal(out, want) {
		t.Errorf("%s", firstDiff(out, want))
	}
	// A short reader fails the load and gives the memory back.
	inst.Close()
	c.Free()
	if _, err := g.LoadConstants(bytes.NewReader(consts[:100]), 200); err == nil {
		t.Error("short constants: no error")
	}
	if got := g.MemInfo().Used; got != before {
		t.Errorf("Used = %d after failed load, want %d", got, before)
	}
}

func testGraphReplay(t *testing.T, e *bundleEnv) {
	g := e.gpu(t)
	r := rand.New(rand.NewPCG(5, 6))
	inst := newInst(t, g, e, InstanceConfig{MaxInput: 512, Tmp: 1024, Out: 700})
	chain := []Step{e.step(t, "pl_load", 32, 128), e.step(t, "pl_inc", 32, 128), e.step(t, "pl_store", 32, 128)}
	type want struct {
		direct, captured, replayed uint64
		calls                      int64
	}
	check := func(step string, in []byte, tmp int, out []byte, w want, calls0 int64) {
		t.Helper()
		if exp := chainOut(in, nil, tmp, len(out), false); !bytes.Equal(out, exp) {
			t.Errorf("%s: output: %s", step, firstDiff(out, exp))
		}
		s := inst.stats.load()
		if s.Direct != w.direct || s.Captured != w.captured || s.Replayed != w.replayed || s.CaptureFailures != 0 {
			t.Errorf("%s: stats %+v, want direct %d captured %d replayed %d", step, s, w.direct, w.captured, w.replayed)
		}
		if got := e.entryCalls() - calls0; got != w.calls {
			t.Errorf("%s: %d entry point calls, want %d", step, got, w.calls)
		}
	}
	calls0 := e.entryCalls()
	out := make([]byte, 700)
	run := func(key uint64, in []byte, tmp int) {
		t.Helper()
		mustRun(t, inst, &Run{Input: in, Output: out, Chain: chain, TmpLen: int64(tmp), ChainKey: key})
	}
	// 1st run direct, 2nd captured, from the 3rd on replayed, each with new
	// input bytes: the graph reads the instance's buffers, not a snapshot.
	var w want
	for i := 1; i <= 6; i++ {
		in := randBytes(r, 512)
		run(7, in, 1024)
		switch i {
		case 1:
			w.direct, w.calls = 1, 3
		case 2:
			w.captured, w.calls = 1, 6
		default:
			w.replayed++
		}
		check(fmt.Sprintf("run %d", i), in, 1024, out, w, calls0)
	}
	// Other lengths: direct, then captured again (replacing the graph).
	in := randBytes(r, 100)
	run(7, in, 1024)
	w.direct, w.calls = 2, 9
	check("new input length", in, 1024, out, w, calls0)
	run(7, in, 1024)
	w.captured, w.calls = 2, 12
	check("new input length again", in, 1024, out, w, calls0)
	run(7, in, 1024)
	w.replayed++
	check("new input length, replay", in, 1024, out, w, calls0)
	run(7, in, 512)
	w.direct, w.calls = 3, 15
	check("new tmp length", in, 512, out, w, calls0)
	// Another key: direct; ChainKey 0: always direct.
	run(8, in, 1024)
	w.direct, w.calls = 4, 18
	check("new key", in, 1024, out, w, calls0)
	for i := 0; i < 3; i++ {
		run(0, in, 1024)
		w.direct, w.calls = w.direct+1, w.calls+3
		check("key 0", in, 1024, out, w, calls0)
	}
	// Graph and direct give the same bytes.
	in = randBytes(r, 512)
	direct := make([]byte, 700)
	mustRun(t, inst, &Run{Input: in, Output: direct, Chain: chain, TmpLen: 1024})
	for i := 0; i < 3; i++ {
		run(9, in, 1024)
		if !bytes.Equal(out, direct) {
			t.Errorf("key 9 run %d differs from direct: %s", i+1, firstDiff(out, direct))
		}
	}
	if s := inst.stats.load(); s.Replayed == 0 {
		t.Errorf("no replay for key 9: %+v", s)
	}
	// Graphs recorded for other lengths stay side by side (a batching
	// function's run sizes): alternating between two recorded lengths
	// replays both, with no new direct run or capture.
	before := inst.stats.load()
	for i := 0; i < 4; i++ {
		n := []int{512, 100}[i%2]
		in := randBytes(r, n)
		run(7, in, 1024)
		if exp := chainOut(in, nil, 1024, len(out), false); !bytes.Equal(out, exp) {
			t.Errorf("alternating lengths, run %d (input %d): %s", i, n, firstDiff(out, exp))
		}
	}
	if s := inst.stats.load(); s.Replayed-before.Replayed != 4 || s.Direct != before.Direct || s.Captured != before.Captured {
		t.Errorf("alternating two recorded lengths: stats %+v, before %+v; want 4 more replays only", s, before)
	}
	// New lengths that arrive interleaved from the start are each recorded
	// too: direct, direct, captured, captured, then replayed.
	before = inst.stats.load()
	for i := 0; i < 6; i++ {
		n := []int{200, 300}[i%2]
		in := randBytes(r, n)
		run(11, in, 1024)
		if exp := chainOut(in, nil, 1024, len(out), false); !bytes.Equal(out, exp) {
			t.Errorf("interleaved new lengths, run %d (input %d): %s", i, n, firstDiff(out, exp))
		}
	}
	if s := inst.stats.load(); s.Direct-before.Direct != 2 || s.Captured-before.Captured != 2 || s.Replayed-before.Replayed != 2 {
		t.Errorf("interleaved new lengths: stats %+v, before %+v; want 2 direct, 2 captured, 2 replayed", s, before)
	}
	if e.live != nil && e.live[5] < 1 {
		t.Errorf("fake driver holds %d graph execs, want the cached one", e.live[5])
	}
}

// testHostBuffer: an instance given a host buffer (as a worker gives its
// shared slot) pins it in place, and a run whose input and output are its
// two halves computes the same as one through the instance's own staging;
// closing the instance unpins it.
func testHostBuffer(t *testing.T, e *bundleEnv) {
	g := e.gpu(t)
	const maxIn, tmp, out = 300, 512, 200
	slot, err := syscall.Mmap(-1, 0, int(SlotSize(maxIn, out)), syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED|syscall.MAP_ANONYMOUS)
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Munmap(slot)
	var before int64
	if e.live != nil {
		before = atomic.LoadInt64(&e.live[1])
	}
	inst := newInst(t, g, e, InstanceConfig{MaxInput: maxIn, Tmp: tmp, Out: out, Host: slot})
	if inst.c.h_ext != 1 {
		t.Fatal("the instance did not adopt the host buffer")
	}
	if e.live != nil && atomic.LoadInt64(&e.live[1]) != before+1 {
		t.Errorf("fake driver: %d host ranges held, want %d (the one registration)", atomic.LoadInt64(&e.live[1]), before+1)
	}
	chain := []Step{e.step(t, "pl_load", 4, 128), e.step(t, "pl_inc", 4, 128), e.step(t, "pl_store", 4, 128)}
	in := randBytes(rand.New(rand.NewPCG(7, 8)), 250)
	copy(slot, in)
	at := SlotOut(maxIn) // 512: an input of 300 is not where the output starts
	r := &Run{Input: slot[:len(in)], Output: slot[at : at+out], Chain: chain, TmpLen: tmp}
	mustRun(t, inst, r)
	if want := chainOut(in, nil, tmp, out, false); !bytes.Equal(slot[at:at+out], want) {
		t.Errorf("aliased run: %s", firstDiff(slot[at:at+out], want))
	}
	// The registration's output half is where the slot's is: a run whose
	// halves are the instance's own copies nothing on the host (a stale
	// offset still gave the right bytes, through a memcpy).
	if r.Timing.Copied != 0 {
		t.Errorf("aliased run copied %d bytes on the host, want 0", r.Timing.Copied)
	}
	inst.Close()
	if e.live != nil && atomic.LoadInt64(&e.live[1]) != before {
		t.Errorf("fake driver: %d host ranges held after Close, want %d", atomic.LoadInt64(&e.live[1]), before)
	}
}

// memfdSlot maps a slot as a worker's are made (worker.newSlot): a memfd
// sealed at its size, MAP_SHARED.
func memfdSlot(t *testing.T, size int) []byte {
	t.Helper()
	fd, err := unix.MemfdCreate("plover-slot-test", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		t.Skipf("memfd_create: %v", err)
	}
	defer unix.Close(fd)
	if err := unix.Ftruncate(fd, int64(size)); err != nil {
		t.Fatal(err)
	}
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_SHRINK|unix.F_SEAL_GROW|unix.F_SEAL_SEAL); err != nil {
		t.Fatal(err)
	}
	b, err := unix.Mmap(fd, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Munmap(b) })
	return b
}

// The production mapping, on the device: an instance adopts a memfd slot
// of its own (HostPinned), a second one registered as a pool slot is run
// on in place, and neither run copies a byte on the host.
func testMemfdSlot(t *testing.T, e *bundleEnv) {
	g := e.gpu(t)
	const maxIn, tmp, out = 64 << 10, 4096, 64 << 10
	size, at := int(SlotSize(maxIn, out)), SlotOut(maxIn)
	own, pool := memfdSlot(t, size), memfdSlot(t, size)
	inst := newInst(t, g, e, InstanceConfig{MaxInput: maxIn, Tmp: tmp, Out: out, Host: own})
	if pinned, err := inst.HostPinned(); !pinned || err != nil {
		t.Fatalf("a memfd slot of its own: pinned %v, %v", pinned, err)
	}
	if err := g.RegisterHost(pool); err != nil {
		t.Fatalf("registering a memfd pool slot: %v", err)
	}
	defer func() {
		if err := g.UnregisterHost(pool); err != nil {
			t.Errorf("unregister: %v", err)
		}
	}()
	chain := []Step{e.step(t, "pl_load", 64, 128), e.step(t, "pl_inc", 64, 128), e.step(t, "pl_store", 64, 128)}
	rng := rand.New(rand.NewPCG(9, 10))
	for _, slot := range [][]byte{own, pool} {
		in := randBytes(rng, maxIn-17)
		copy(slot, in)
		r := &Run{Input: slot[:len(in)], Output: slot[at : at+out], Chain: chain, TmpLen: tmp, InPlace: true}
		mustRun(t, inst, r)
		if want := chainOut(in, nil, tmp, out, false); !bytes.Equal(slot[at:at+out], want) {
			t.Errorf("in place on a memfd slot: %s", firstDiff(slot[at:at+out], want))
		}
		if r.Timing.Copied != 0 {
			t.Errorf("in place on a memfd slot: %d bytes copied on the host, want 0", r.Timing.Copied)
		}
	}
}

func testZeroTmp(t *testing.T, e *bundleEnv) {
	g := e.gpu(t)
	inst := newInst(t, g, e, InstanceConfig{MaxInput: 4, Tmp: 4, Out: 4})
	chain := []Step{e.step(t, "pl_count", 1, 1), e.step(t, "pl_store", 1, 32)}
	out := make([]byte, 4)
	count := func(zero bool, key uint64) uint32 {
		t.Helper()
		mustRun(t, inst, &Run{Output: out, Chain: chain, TmpLen: 4, ZeroTmp: zero, ChainKey: key})
		return binary.LittleEndian.Uint32(out)
	}
	for _, key := range []uint64{0, 77} {
		for i := 0; i < 5; i++ {
			if n := count(true, key); n != 1 {
				t.Errorf("key %d: zero_tmp run %d counted %d, want 1", key, i+1, n)
			}
		}
		// Without zero_tmp, tmp keeps the previous request's value, through
		// graph replays too (they run the kernels, not a recording of results).
		for i := 2; i <= 6; i++ {
			if n := count(false, key); n != uint32(i) {
				t.Errorf("key %d: run %d without zero_tmp counted %d, want %d", key, i, n, i)
			}
		}
	}
	if s := inst.stats.load(); s.Replayed < 3 {
		t.Errorf("stats %+v: replay was not exercised", s)
	}
}

func testBadLaunch(t *testing.T, e *bundleEnv) {
	g := e.gpu(t)
	inst := newInst(t, g, e, InstanceConfig{MaxInput: 64, Tmp: 64, Out: 64})
	bad := []Step{e.step(t, "pl_load", 1, 64), e.step(t, "pl_inc", 1, 4096), e.step(t, "pl_store", 1, 64)}
	good := []Step{e.step(t, "pl_load", 1, 64), e.step(t, "pl_inc", 1, 64), e.step(t, "pl_store", 1, 64)}
	in := []byte("a bad launch is the bundle's error, not the device's")
	out := make([]byte, 64)
	for i := 0; i < 3; i++ {
		err := inst.Run(&Run{Input: in, Output: out, Chain: bad, TmpLen: 64, ChainKey: 5})
		var ke *KernelError
		if !errors.As(err, &ke) || !strings.Contains(ke.Msg, "cudaError") {
			t.Fatalf("bad launch: %v (%T), want a KernelError naming a cudaError", err, err)
		}
		if errors.Is(err, ErrUnhealthy) {
			t.Fatalf("bad launch marked the device unhealthy: %v", err)
		}
		t.Logf("bad launch: %v", err)
	}
	if s := inst.stats.load(); s.Captured != 0 || s.CaptureFailures != 0 {
		t.Errorf("a failing chain was captured: %+v", s)
	}
	if err := g.Health(); err != nil {
		t.Fatalf("health after a bad launch: %v", err)
	}
	for i := 0; i < 3; i++ {
		mustRun(t, inst, &Run{Input: in, Output: out, Chain: good, TmpLen: 64, ChainKey: 6})
		if want := chainOut(in, nil, 64, 64, false); !bytes.Equal(out, want) {
			t.Errorf("good run after bad: %s", firstDiff(out, want))
		}
	}
}

func testCaptureFallback(t *testing.T, e *bundleEnv) {
	log, buf := newLog()
	g := e.fresh(t, 0, log)
	chain := []Step{e.step(t, "pl_load", 8, 64), e.step(t, "pl_hostile", 8, 64), e.step(t, "pl_store", 8, 64)}
	in := []byte("stream sync inside an entry point")
	for n := 1; n <= 2; n++ {
		inst := newInst(t, g, e, InstanceConfig{MaxInput: 64, Tmp: 128, Out: 100})
		for i := 1; i <= 2*maxCaptureFailures+2; i++ {
			out := make([]byte, 100)
			mustRun(t, inst, &Run{Input: in, Output: out, Chain: chain, TmpLen: 128, ChainKey: 3})
			if want := chainOut(in, nil, 128, 100, false); !bytes.Equal(out, want) {
				t.Errorf("instance %d run %d: %s", n, i, firstDiff(out, want))
			}
		}
		// Every other run tried to capture, failed, and ran directly; after
		// maxCaptureFailures the instance stops trying.
		want := GraphStats{Direct: 2*maxCaptureFailures + 2, CaptureFailures: maxCaptureFailures}
		if s := inst.stats.load(); s != want {
			t.Errorf("instance %d: stats %+v, want %+v", n, s, want)
		}
		if !inst.graphsOff {
			t.Errorf("instance %d: graphs still on", n)
		}
	}
	if got := strings.Count(buf.String(), "graph capture failed"); got != 1 {
		t.Errorf("capture failure logged %d times, want once per device:\n%s", got, buf.String())
	}
	t.Logf("log: %s", buf.String())
	if err := g.Health(); err != nil {
		t.Errorf("health: %v", err)
	}
}

// testConcurrent runs instances on several goroutines at once: every call
// must make the context current on whatever thread it lands on.
func testConcurrent(t *testing.T, e *bundleEnv) {
	g := e.gpu(t)
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for w := 0; w < 8; w++ {
		inst := newInst(t, g, e, InstanceConfig{MaxInput: 256, Tmp: 256, Out: 256})
		chain := []Step{e.step(t, "pl_load", 4, 64), e.step(t, "pl_inc", 4, 64), e.step(t, "pl_store", 4, 64)}
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(w), 9))
			out := make([]byte, 256)
			for i := 0; i < 50; i++ {
				in := randBytes(r, 256)
				if err := inst.Run(&Run{Input: in, Output: out, Chain: chain, TmpLen: 256, ChainKey: uint64(1 + w%2)}); err != nil {
					errs <- err
					return
				}
				if want := chainOut(in, nil, 256, 256, false); !bytes.Equal(out, want) {
					errs <- fmt.Errorf("worker %d run %d: %s", w, i, firstDiff(out, want))
					return
				}
			}
		}(w)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	// Each instance captured while the others were running and syncing
	// their own streams; none of that may invalidate a capture.
	s := g.GraphStats()
	t.Logf("graph stats: %+v", s)
	if s.CaptureFailures != 0 || s.Captured != 8 {
		t.Errorf("concurrent work broke captures: %+v, want 8 captures and no failures", s)
	}
}

// testFault poisons the device: run it on a device nothing else uses.
func testFault(t *testing.T, e *bundleEnv) {
	g := e.fresh(t, 0, nil)
	chain := []Step{e.step(t, "pl_load", 1, 32), e.step(t, "pl_inc", 1, 32), e.step(t, "pl_store", 1, 32)}
	bystander := newInst(t, g, e, InstanceConfig{MaxInput: 8, Tmp: 8, Out: 8})
	mustRun(t, bystander, &Run{Output: make([]byte, 8), Chain: chain, TmpLen: 8})
	victim := newInst(t, g, e, InstanceConfig{MaxInput: 8, Tmp: 8, Out: 8})

	err := victim.Run(&Run{Output: make([]byte, 8), Chain: []Step{e.step(t, "pl_fault", 1, 1)}, TmpLen: 8})
	t.Logf("faulting run: %v", err)
	var ke *KernelError
	if !errors.As(err, &ke) || !strings.Contains(ke.Msg, "CUDA_ERROR_ILLEGAL_ADDRESS") {
		t.Fatalf("fault: %v (%T), want a KernelError naming CUDA_ERROR_ILLEGAL_ADDRESS", err, err)
	}
	if !errors.Is(err, ErrUnhealthy) {
		t.Errorf("fault error does not wrap ErrUnhealthy: %v", err)
	}
	h := g.Health()
	if !errors.Is(h, ErrUnhealthy) || !strings.Contains(h.Error(), "CUDA_ERROR_ILLEGAL_ADDRESS") {
		t.Fatalf("health after fault: %v", h)
	}
	var df *DeviceFault
	if !errors.As(h, &df) || !df.Err.Sticky() {
		t.Errorf("health is not a sticky DeviceFault: %#v", h)
	}
	// Everything after fails fast, as unavailable rather than as a kernel
	// error, without touching the GPU.
	start := time.Now()
	err = bystander.Run(&Run{Output: make([]byte, 8), Chain: chain, TmpLen: 8})
	if !errors.Is(err, ErrUnhealthy) || errors.As(err, &ke) {
		t.Errorf("run after fault: %v", err)
	}
	if _, err := g.NewInstance(InstanceConfig{MaxInput: 8, Tmp: 8, Out: 8}); !errors.Is(err, ErrUnhealthy) {
		t.Errorf("NewInstance after fault: %v", err)
	}
	if _, err := g.LoadConstants(bytes.NewReader([]byte{1}), 1); !errors.Is(err, ErrUnhealthy) {
		t.Errorf("LoadConstants after fault: %v", err)
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("failing fast took %v", d)
	}
	if m := g.MemInfo(); m.Used != 48 || m.Total <= 0 {
		t.Errorf("MemInfo after fault: %+v", m)
	}
}

// ---- fake-only tests ----

func TestFakeFault(t *testing.T) {
	e := fakeEnv(t)
	e.ordinal = 1 // device 0 stays healthy for the other tests
	testFault(t, e)
}

// TestFakeProcessFatalCodesPoisonTheDevice: every code the driver API
// documents as leaving the process unable to use CUDA ("any further CUDA
// work will return the same error. To continue using CUDA, the process must
// be terminated and relaunched"), and every code of a lost MPS server
// (805-809), met by a run poisons the device as
// CUDA_ERROR_ILLEGAL_ADDRESS does: the run that met it wraps ErrUnhealthy
// (a worker then ends and is replaced), and later runs fail fast instead of
// each failing again as a kernel error.
func TestFakeProcessFatalCodesPoisonTheDevice(t *testing.T) {
	for _, c := range []struct {
		code int
		name string
	}{{226, "CUDA_ERROR_CONTAINED"}, {721, "CUDA_ERROR_TENSOR_MEMORY_LEAK"},
		{810, "CUDA_ERROR_MPS_CLIENT_TERMINATED"}, {911, "CUDA_ERROR_EXTERNAL_DEVICE"},
		// A lost MPS server: not sticky by the driver's list, but every
		// later call fails the same way (fakecuda.c keeps it so).
		{805, "CUDA_ERROR_MPS_CONNECTION_FAILED"}, {806, "CUDA_ERROR_MPS_RPC_FAILURE"},
		{807, "CUDA_ERROR_MPS_SERVER_NOT_READY"}, {808, "CUDA_ERROR_MPS_MAX_CLIENTS_REACHED"},
		{809, "CUDA_ERROR_MPS_MAX_CONNECTIONS_REACHED"}} {
		t.Run(c.name, func(t *testing.T) {
			t.Setenv("FAKECUDA_FAULT", strconv.Itoa(c.code)) // what pl_fault's kernel leaves
			e := fakeEnv(t)
			e.ordinal = 1 // device 0 stays healthy for the other tests
			g := e.fresh(t, 0, nil)
			inst := newInst(t, g, e, InstanceConfig{MaxInput: 8, Tmp: 8, Out: 8})
			err := inst.Run(&Run{Output: make([]byte, 8), Chain: []Step{e.step(t, "pl_fault", 1, 1)}, TmpLen: 8})
			var ke *KernelError
			if !errors.As(err, &ke) || !strings.Contains(ke.Msg, c.name) {
				t.Fatalf("faulting run: %v, want a KernelError naming %s", err, c.name)
			}
			if !errors.Is(err, ErrUnhealthy) {
				t.Errorf("faulting run: %v does not wrap ErrUnhealthy", err)
			}
			if h := g.Health(); !errors.Is(h, ErrUnhealthy) {
				t.Errorf("health after %s: %v", c.name, h)
			}
			chain := []Step{e.step(t, "pl_load", 1, 32), e.step(t, "pl_store", 1, 32)}
			err = inst.Run(&Run{Output: make([]byte, 8), Chain: chain, TmpLen: 8})
			if !errors.Is(err, ErrUnhealthy) || errors.As(err, &ke) {
				t.Errorf("next run: %v, want ErrUnhealthy without touching the GPU", err)
			}
		})
	}
}

func TestFakeNoLeaks(t *testing.T) {
	e := fakeEnv(t)
	g := e.fresh(t, 0, nil)
	base := *e.live
	c, err := g.LoadConstants(bytes.NewReader(make([]byte, 100)), 100)
	if err != nil {
		t.Fatal(err)
	}
	chain := []Step{e.step(t, "pl_load", 1, 32), e.step(t, "pl_add_const", 1, 32), e.step(t, "pl_store", 1, 32)}
	for i := 0; i < 3; i++ {
		cfg := InstanceConfig{MaxInput: 100, Tmp: 100, Out: 100, Constants: c, Entries: e.ents}
		inst, err := g.NewInstance(cfg)
		if err != nil {
			t.Fatal(err)
		}
		for k := uint64(1); k <= 3; k++ {
			for j := 0; j < 4; j++ { // graphs captured, replaced, replayed
				mustRun(t, inst, &Run{Input: make([]byte, 100), Output: make([]byte, 100), Chain: chain, TmpLen: 100, ChainKey: k})
			}
		}
		inst.Close()
	}
	c.Free()
	c.Free()
	now := *e.live
	for i, what := range []string{"device allocations", "pinned allocations", "streams", "events", "graphs", "graph execs"} {
		if now[i] != base[i] {
			t.Errorf("%s: %d live, %d before", what, now[i], base[i])
		}
	}
	if now[7] != base[7] {
		t.Errorf("device bytes: %d live, %d before", now[7], base[7])
	}
	if g.MemInfo().Used != 0 {
		t.Errorf("Used = %d", g.MemInfo().Used)
	}
}

func TestFakeMemoryBudget(t *testing.T) {
	e := fakeEnv(t)
	g := e.fresh(t, 1<<20, nil)
	m := g.MemInfo()
	if m.Total != 1<<20 || m.Free != 1<<20 || m.Used != 0 {
		t.Fatalf("MemInfo %+v, want a 1 MiB budget", m)
	}
	if _, err := g.NewInstance(InstanceConfig{MaxInput: 1 << 20, Tmp: 1, Out: 1}); !errors.Is(err, ErrOutOfMemory) {
		t.Errorf("over budget: %v", err)
	}
	inst, err := g.NewInstance(InstanceConfig{MaxInput: 256 << 10, Tmp: 128 << 10, Out: 128 << 10})
	if err != nil {
		t.Fatal(err)
	}
	if m := g.MemInfo(); m.Used != 512<<10 || m.Free != 512<<10 || m.Total != 1<<20 {
		t.Errorf("MemInfo %+v", m)
	}
	if _, err := g.LoadConstants(bytes.NewReader(make([]byte, 600<<10)), 600<<10); !errors.Is(err, ErrOutOfMemory) {
		t.Errorf("constants over budget: %v", err)
	}
	inst.Close()
	if m := g.MemInfo(); m.Used != 0 {
		t.Errorf("after Close: %+v", m)
	}
	// Without a budget, the driver's numbers.
	g2 := e.fresh(t, 0, nil)
	if m := g2.MemInfo(); m.Total != 1<<30 || m.Free <= 0 {
		t.Errorf("no budget: %+v", m)
	}
	if g2.Target() != "cuda" || !strings.HasSuffix(g2.Name(), "(GPU 0)") || g2.DriverVersion() != "12.4" {
		t.Errorf("Target %q Name %q DriverVersion %q", g2.Target(), g2.Name(), g2.DriverVersion())
	}
}

func TestFakeClosed(t *testing.T) {
	e := fakeEnv(t)
	g := e.fresh(t, 0, nil)
	inst := newInst(t, g, e, InstanceConfig{MaxInput: 8, Tmp: 8, Out: 8})
	inst.Close()
	if err := inst.Run(&Run{Output: make([]byte, 8), Chain: []Step{e.step(t, "pl_inc", 1, 1)}}); err == nil {
		t.Error("run on a closed instance: no error")
	}
	if err := g.Close(); err != nil {
		t.Fatal(err)
	}
	if g.Health() == nil {
		t.Error("closed device is healthy")
	}
	if _, err := g.NewInstance(InstanceConfig{}); err == nil {
		t.Error("NewInstance on a closed device: no error")
	}
}

// The suite's own premise: the fake's buffers start as garbage like real
// device memory, so a test cannot pass by relying on zeroed memory.
func TestFakeMemoryIsNotZeroed(t *testing.T) {
	e := fakeEnv(t)
	g := e.gpu(t)
	inst := newInst(t, g, e, InstanceConfig{MaxInput: 4, Tmp: 4, Out: 4})
	out := make([]byte, 4)
	mustRun(t, inst, &Run{Output: out, Chain: []Step{e.step(t, "pl_count", 1, 1), e.step(t, "pl_store", 1, 1)}, TmpLen: 4})
	if binary.LittleEndian.Uint32(out) == 1 {
		t.Error("tmp started zeroed")
	}
}

// The runtime's hot path allocates nothing; Run must not either.
func TestFakeRunAllocs(t *testing.T) {
	e := fakeEnv(t)
	g := e.gpu(t)
	inst := newInst(t, g, e, InstanceConfig{MaxInput: 64, Tmp: 64, Out: 64})
	chain := []Step{e.step(t, "pl_load", 1, 64), e.step(t, "pl_inc", 1, 64), e.step(t, "pl_store", 1, 64)}
	for _, key := range []uint64{0, 1} {
		r := &Run{Input: make([]byte, 64), Output: make([]byte, 64), Chain: chain, TmpLen: 64, ZeroTmp: true, ChainKey: key}
		mustRun(t, inst, r)
		if n := testing.AllocsPerRun(100, func() { mustRun(t, inst, r) }); n != 0 {
			t.Errorf("key %d: %v allocations per Run", key, n)
		}
	}
	if s := inst.stats.load(); s.Replayed < 100 {
		t.Errorf("replay not exercised: %+v", s)
	}
}

// An entry's lowered out.len is the output's length, replayed graphs
// reproduce it without calling the entry, and raising it fails the run.
func testOutLen(t *testing.T, e *bundleEnv) {
	g := e.gpu(t)
	rng := rand.New(rand.NewPCG(11, 12))
	inst := newInst(t, g, e, InstanceConfig{MaxInput: 256, Out: 256})
	chain := []Step{e.step(t, "pl_copy", 1, 256), e.step(t, "pl_out_len", 100, 1)}
	out := make([]byte, 256)
	for i := 0; i < 4; i++ { // direct, captured, replayed, replayed
		in := randBytes(rng, 256)
		r := &Run{Input: in, Output: out, Chain: chain, ChainKey: 11, ZeroOut: true}
		mustRun(t, inst, r)
		if r.OutLen != 100 || !bytes.Equal(out[:100], in[:100]) {
			t.Fatalf("run %d: OutLen %d, %s", i, r.OutLen, firstDiff(out[:r.OutLen], in[:100]))
		}
	}
	if s := inst.stats.load(); s.Replayed < 2 {
		t.Errorf("replay not exercised: %+v", s)
	}
	// A capture that fails (pl_hostile synchronises) reruns the chain
	// directly: from a fresh state, so out.len is halved once, not twice.
	half := []Step{e.step(t, "pl_hostile", 1, 32), e.step(t, "pl_out_half", 1, 1)}
	for i := 0; i < 4; i++ {
		r := &Run{Input: make([]byte, 10), Output: out, Chain: half, TmpLen: 0, ChainKey: 12}
		mustRun(t, inst, r)
		if r.OutLen != 128 {
			t.Fatalf("run %d with a failing capture: OutLen %d, want 128", i, r.OutLen)
		}
	}
	if s := inst.stats.load(); s.CaptureFailures == 0 {
		t.Errorf("capture failure not exercised: %+v", s)
	}
	r := &Run{Input: make([]byte, 10), Output: out, Chain: []Step{e.step(t, "pl_out_len", 257, 1)}}
	var ke *KernelError
	if err := inst.Run(r); !errors.As(err, &ke) || !strings.Contains(err.Error(), "set s->out.len to 257, above the 256 bytes of out") {
		t.Fatalf("raised out.len: %v", err)
	}
}

// The hooks run on the device's stream and what they leave in s->program
// and s->instance reaches every run; fini sees the instance's pointer.
func testHooks(t *testing.T, e *bundleEnv) {
	g := e.gpu(t)
	p, err := e.lib.Symbol("pl_hook_calls")
	if err != nil {
		t.Fatal(err)
	}
	calls := (*[4]int64)(p)
	var before [4]int64
	for k := range calls {
		before[k] = atomic.LoadInt64(&calls[k])
	}
	if e.ents.program, err = g.programHook(e.ents, hookLoad, nil, nil); err != nil || e.ents.program == nil {
		t.Fatalf("plover_load: %v (program %p)", err, e.ents.program)
	}
	defer func() { e.ents.program = nil }()
	inst, err := g.NewInstance(InstanceConfig{MaxInput: 16, Out: 16, Entries: e.ents})
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ { // direct runs: the check is the entry's host code
		mustRun(t, inst, &Run{Input: make([]byte, 4), Output: make([]byte, 16), Chain: []Step{e.step(t, "pl_hooks", 1, 1)}})
	}
	inst.Close()
	if _, err := g.programHook(e.ents, hookUnload, nil, e.ents.program); err != nil {
		t.Fatalf("plover_unload: %v", err)
	}
	for k, name := range []string{"plover_load", "plover_instance_init", "plover_instance_fini", "plover_unload"} {
		if got := atomic.LoadInt64(&calls[k]) - before[k]; got != 1 {
			t.Errorf("%s ran %d times, want 1", name, got)
		}
	}
}

// What plover_load writes on the legacy default stream (cudaMemset: the
// test bundles rewrite 17 bytes of constants with 0x5a) is done before the
// first request, whose instance stream is non-blocking and so does not
// wait for it: the hook's wait covers the default streams. The fake does
// such work only when they (or the context) are synchronized, the latest
// the driver allows.
func testHookDefaultStream(t *testing.T, e *bundleEnv) {
	g := e.gpu(t)
	c, err := g.LoadConstants(bytes.NewReader(make([]byte, 17)), 17)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Free()
	if e.ents.program, err = g.programHook(e.ents, hookLoad, c, nil); err != nil {
		t.Fatalf("plover_load: %v", err)
	}
	defer func() {
		g.programHook(e.ents, hookUnload, c, e.ents.program)
		e.ents.program = nil
	}()
	inst := newInst(t, g, e, InstanceConfig{MaxInput: 17, Tmp: 17, Out: 17, Constants: c, Entries: e.ents})
	in := []byte("default stream!!!")
	out := make([]byte, 17)
	chain := []Step{e.step(t, "pl_load", 1, 32), e.step(t, "pl_add_const", 1, 32), e.step(t, "pl_inc", 1, 32), e.step(t, "pl_store", 1, 32)}
	mustRun(t, inst, &Run{Input: in, Output: out, Chain: chain, TmpLen: 17})
	if want := chainOut(in, bytes.Repeat([]byte{0x5a}, 17), 17, 17, true); !bytes.Equal(out, want) {
		t.Errorf("the first request after plover_load's default-stream memset: %s", firstDiff(out, want))
	}
}

// copyProbe, BenchmarkCopy's floor, runs its copies through the driver
// (here the fake one), times both ways and leaves the host bytes as they
// were (they go to the device and come back).
func TestFakeCopyProbe(t *testing.T) {
	g := fakeEnv(t).gpu(t)
	buf := make([]byte, 1<<20)
	for i := range buf {
		buf[i] = byte(i * 7)
	}
	want := append([]byte(nil), buf...)
	if err := g.RegisterHost(buf); err != nil {
		t.Fatal(err)
	}
	// Unregistered before the memory goes back to Go: the driver refuses
	// to register a range again (712) while any of it is registered.
	defer func() {
		if err := g.UnregisterHost(buf); err != nil {
			t.Errorf("unregister: %v", err)
		}
	}()
	in, out, err := g.copyProbe(buf, 3)
	if err != nil || in <= 0 || out <= 0 {
		t.Fatalf("copyProbe: in %v, out %v, %v", in, out, err)
	}
	if !bytes.Equal(buf, want) {
		t.Fatal("the bytes did not come back as they went")
	}
}

// The fake refuses what the real driver refuses: host memory registered
// again while part of it is (CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED),
// and unregistering a pointer that is not a registered base
// (CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED), so that the suite shows
// Plover's own code does neither.
func TestFakeHostRegistrationIsStrict(t *testing.T) {
	g := fakeEnv(t).gpu(t)
	buf := make([]byte, 64<<10)
	if err := g.RegisterHost(buf[:32<<10]); err != nil {
		t.Fatal(err)
	}
	code := func(err error) int {
		var de *DriverError
		if !errors.As(err, &de) {
			return 0
		}
		return de.Code
	}
	for _, b := range [][]byte{buf[:32<<10], buf[16<<10:], buf[:4096]} {
		if err := g.RegisterHost(b); code(err) != 712 {
			t.Errorf("registering %d bytes that overlap a registered range: %v, want CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED", len(b), err)
		}
	}
	if err := g.RegisterHost(buf[32<<10:]); err != nil {
		t.Errorf("registering the range beside it: %v", err)
	} else if err := g.UnregisterHost(buf[32<<10:]); err != nil {
		t.Errorf("unregistering it: %v", err)
	}
	if err := g.UnregisterHost(buf[4096:]); code(err) != 713 {
		t.Errorf("unregistering inside a registered range: %v, want CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED", err)
	}
	if err := g.UnregisterHost(buf); err != nil {
		t.Errorf("unregistering the registered base: %v", err)
	}
	if err := g.UnregisterHost(buf); code(err) != 713 {
		t.Errorf("unregistering it twice: %v, want CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED", err)
	}
	if h := g.Health(); h != nil {
		t.Errorf("health after refused registrations: %v", h)
	}
}

// A lost MPS server met by MemInfo alone does not poison the device, as a
// sticky error does: a server that holds a context only to read memory
// (under MPS without NVML) keeps its GPU healthy for its workers, which
// reconnect once the MPS server is back. The fake's two opens share the
// primary context, as on a real driver: one run's error is the other's.
func TestFakeMemInfoDoesNotPoisonOnALostMPSServer(t *testing.T) {
	for _, c := range []struct {
		code   int
		poison bool
	}{{806, false}, {807, false}, {700, true}} {
		t.Run(strconv.Itoa(c.code), func(t *testing.T) {
			t.Setenv("FAKECUDA_FAULT", strconv.Itoa(c.code))
			e := fakeEnv(t)
			e.ordinal = 1 // device 0 stays healthy for the other tests
			runner, reader := e.fresh(t, 0, nil), e.fresh(t, 1<<20, nil)
			inst := newInst(t, runner, e, InstanceConfig{MaxInput: 8, Tmp: 8, Out: 8})
			inst.Run(&Run{Output: make([]byte, 8), Chain: []Step{e.step(t, "pl_fault", 1, 1)}, TmpLen: 8})
			if h := runner.Health(); !errors.Is(h, ErrUnhealthy) {
				t.Fatalf("the run's device after %d: %v", c.code, h)
			}
			m := reader.MemInfo()
			if m.Total != 1<<20 || m.Free != 1<<20 {
				t.Errorf("MemInfo with the context lost: %+v, want the budget's figures", m)
			}
			if h := reader.Health(); errors.Is(h, ErrUnhealthy) != c.poison {
				t.Errorf("MemInfo's device after %d: health %v, want poisoned %v", c.code, h, c.poison)
			}
		})
	}
}
