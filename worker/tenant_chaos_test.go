package worker

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/device"
	"github.com/plover-run/plover/internal/testkit"
)

// A bounded, randomized test of tenants' workers: goroutines load, run,
// unload and reload programs of two tenants, give up on loads at short
// deadlines (late loads), crash a worker with a segv and hang one past a
// run's deadline, all at once. Each goroutine's operations come from its
// seed; their interleaving is the scheduler's. Checked as it goes:
//
//   - a run answers its own bytes, or fails;
//   - a failure of a program that did not crash or hang its worker is a
//     collateral loss (ProcessExit.Shared) of a worker that a crash or a
//     hang ended, never a plain error;
//   - the crasher's own loss, and the hung program's, are not collateral;
//   - an unloaded program's staged files are gone;
//
// between rounds, with every goroutine stopped (polled for, bounded):
// each tenant's live programs share one worker, which holds those
// programs and no others, its stage their files and no others, its slot
// accounting their instances' and pool slots'; the device's memory and
// runs in flight are the instances held and none; no late load is left;
// and at the end, everything closed: no worker, no stage, no tenant slot,
// no death counted towards a tenant's back-off (every death was named),
// and the goroutines and descriptors of the start.
func TestTenantChaos(t *testing.T) {
	seeds, rounds, ops, minEchoes := []uint64{1, 2, 3}, 5, 16, int64(50)
	if testing.Short() {
		seeds, rounds, ops, minEchoes = []uint64{1, 2}, 3, 12, 20
	}
	b := chaosBundles{kernels: t.TempDir(), hostile: t.TempDir()}
	testkit.BuildLib(t, testkit.KernelsSource(), b.kernels, "kernels.so")
	testkit.BuildLib(t, testkit.HostileSource(), b.hostile, "hostile.so")
	var total chaosStats
	for _, seed := range seeds {
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			c := newChaos(t, b, seed)
			c.play(rounds, ops)
			t.Logf("seed %d: %v", seed, &c.stats)
			total.add(&c.stats)
			if t.Failed() {
				t.Logf("trace of seed %d (the last %d operations):\n%s", seed, chaosTraceKeep, c.traceText())
			}
		})
	}
	// Not vacuous: the goroutines crashed and hung workers with siblings
	// in them, gave loads up, and ran between the crashes.
	t.Logf("all seeds: %v", &total)
	little := total[chaosEchoes].Load() < minEchoes
	for _, k := range []chaosStat{chaosCrashes, chaosHangs, chaosCollateral, chaosLateLoads} {
		little = little || total[k].Load() == 0
	}
	if little && !t.Failed() {
		t.Errorf("the chaos did too little to show anything: %v", &total)
	}
}

// chaosBundles are the bundle directories every seed loads from: the
// test kernels (functions echo and slow), and the hostile ones.
type chaosBundles struct{ kernels, hostile string }

const (
	chaosWorkers   = 4
	chaosTraceKeep = 300
	// chaosRoundMax bounds a round: past it the test fails as hung.
	chaosRoundMax = 60 * time.Second
)

type chaosKind int

const (
	chaosEcho chaosKind = iota
	chaosSlow
	chaosHostile
)

func (k chaosKind) String() string { return [...]string{"echo", "slow", "hostile"}[k] }

// chaosProg is a program a goroutine holds, and its instance (nil: none).
type chaosProg struct {
	g    *program
	kind chaosKind
	m    *abi.Manifest
	in   device.Instance
}

// chaosWorker is one goroutine's state: its tenant and programs.
type chaosWorker struct {
	id     int
	tenant string
	rng    *rand.Rand
	held   []*chaosProg
	op     int
}

// chaosStats counts what the goroutines did, by chaosStat.
type chaosStats [chaosStatCount]atomic.Int64

type chaosStat int

const (
	chaosEchoes chaosStat = iota
	chaosSlowRuns
	chaosLentRuns
	chaosLoads
	chaosLateLoads
	chaosUnloads
	chaosCrashes
	chaosHangs
	chaosCollateral
	chaosDropped
	chaosStatCount
)

func (s *chaosStats) count(k chaosStat) { s[k].Add(1) }

func (s *chaosStats) add(o *chaosStats) {
	for k := range o {
		s[k].Add(o[k].Load())
	}
}

func (s *chaosStats) String() string {
	names := [chaosStatCount]string{"echoes", "slow runs", "lent runs", "loads", "late loads", "unloads", "crashes", "hangs", "collateral losses", "dropped"}
	var b strings.Builder
	for k, name := range names {
		fmt.Fprintf(&b, "%s %d; ", name, s[k].Load())
	}
	return strings.TrimSuffix(b.String(), "; ")
}

// chaos is one seed's play on one device.
type chaos struct {
	t       *testing.T
	d       *Device
	b       chaosBundles
	seed    uint64
	workers []*chaosWorker
	stats   chaosStats

	// crashMu: one crash or hang at a time, so that a worker's death has
	// one culprit, and every death is one the test caused.
	crashMu sync.Mutex

	mu      sync.Mutex
	crashed map[int]string // pid -> what the test did to it
	trace   []string
	start   time.Time

	goroutines, fds int // at the start
}

func newChaos(t *testing.T, b chaosBundles, seed uint64) *chaos {
	d := NewDevice(Options{Exe: os.Args[0], Base: device.NewHost(0), Landlock: true, StageDir: t.TempDir(), Spawner: spawner, TenantScope: true})
	t.Cleanup(func() { d.Close() })
	d.lateKeep = 100 * time.Millisecond // a late load nobody takes is unloaded soon
	d.own.shareOverrun = true           // a hung program stays in its tenant's worker (overran)
	c := &chaos{t: t, d: d, b: b, seed: seed, crashed: map[int]string{}, start: time.Now()}
	for i := range chaosWorkers {
		tenant := "t1"
		if i == chaosWorkers-1 {
			tenant = "t2" // a tenant of its own: another's crashes never reach it
		}
		c.workers = append(c.workers, &chaosWorker{id: i, tenant: tenant, rng: rand.New(rand.NewPCG(seed, uint64(i)))})
	}
	c.goroutines, c.fds = runtime.NumGoroutine(), openFDs(t)
	return c
}

// play runs rounds of ops operations per goroutine, checking the device
// between rounds, then closes everything and checks nothing is left.
func (c *chaos) play(rounds, ops int) {
	for round := range rounds {
		var wg sync.WaitGroup
		for _, w := range c.workers {
			wg.Go(func() {
				for range ops {
					c.step(w)
				}
			})
		}
		c.await(&wg, fmt.Sprintf("round %d", round))
		c.logf(nil, "round %d done", round)
		c.settle(fmt.Sprintf("after round %d", round))
		if c.t.Failed() {
			break
		}
	}
	for _, w := range c.workers {
		for len(w.held) > 0 {
			c.unload(w, w.held[0])
		}
	}
	c.settle("with everything unloaded")
	c.checkEmpty()
}

// await waits for wg within chaosRoundMax, and fails with every
// goroutine's stack past it.
func (c *chaos) await(wg *sync.WaitGroup, what string) {
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(chaosRoundMax):
		buf := make([]byte, 1<<20)
		n := runtime.Stack(buf, true)
		c.t.Fatalf("seed %d: %s did not end within %v: hung\n%s\ntrace:\n%s", c.seed, what, chaosRoundMax, buf[:n], c.traceText())
	}
}

// step does one randomly chosen operation of w's.
func (c *chaos) step(w *chaosWorker) {
	w.op++
	pick := func(kind ...chaosKind) *chaosProg {
		var cands []*chaosProg
		for _, cp := range w.held {
			if len(kind) == 0 || slices.Contains(kind, cp.kind) {
				cands = append(cands, cp)
			}
		}
		if len(cands) == 0 {
			return nil
		}
		return cands[w.rng.IntN(len(cands))]
	}
	switch r := w.rng.IntN(100); {
	case r < 18 && len(w.held) < 5:
		c.load(w, chaosKind(w.rng.IntN(3)), time.Minute)
	case r < 18:
		c.unload(w, pick()) // at most 5 held: one goes
	case r < 23:
		c.load(w, chaosKind(w.rng.IntN(2)), time.Duration(w.rng.IntN(3000))*time.Microsecond)
	case r < 60:
		c.run(w, pick(), false, 0)
	case r < 70:
		c.run(w, pick(), true, 0)
	case r < 78:
		c.run(w, pick(chaosSlow), false, int32(20+w.rng.IntN(200)))
	case r < 82:
		if cp := pick(); cp != nil && cp.in != nil {
			c.logf(w, "close the instance of %s", cp)
			cp.in.Close()
			cp.in = nil
		}
	case r < 92:
		if cp := pick(); cp != nil {
			c.unload(w, cp)
		}
	case r < 97:
		c.crash(w, pick(chaosHostile))
	default:
		c.hang(w, pick(chaosSlow))
	}
}

func (cp *chaosProg) String() string {
	return fmt.Sprintf("%s(id %d, pid %d)", cp.kind, cp.g.id, cp.g.PID())
}

// spec is the load of kind for w's tenant.
func (c *chaos) spec(w *chaosWorker, kind chaosKind) device.ProgramSpec {
	switch kind {
	case chaosSlow:
		return device.ProgramSpec{Dir: c.b.kernels, Manifest: testkit.Slow("slow", 1), Tenant: w.tenant}
	case chaosHostile:
		m := testkit.Manifest("hostile")
		m.Library = "hostile.so"
		m.Chain = []abi.Launch{{Kernel: "segv", Grid: 1, Block: 1}}
		return device.ProgramSpec{Dir: c.b.hostile, Manifest: m, Tenant: w.tenant}
	}
	return device.ProgramSpec{Dir: c.b.kernels, Manifest: testkit.Manifest("echo"), Tenant: w.tenant}
}

// load loads a program of kind for w within limit: a short one may end
// with the request's deadline (the load goes on, late).
func (c *chaos) load(w *chaosWorker, kind chaosKind, limit time.Duration) {
	spec := c.spec(w, kind)
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	p, err := c.d.Load(ctx, spec)
	if err != nil {
		if limit < time.Second && errors.Is(err, device.ErrDeadline) {
			c.stats.count(chaosLateLoads)
			c.logf(w, "load %s within %v: %v", kind, limit, err)
			return
		}
		c.sibling(w, nil, "load "+kind.String(), err)
		return
	}
	cp := &chaosProg{g: p.(*program), kind: kind, m: spec.Manifest}
	c.stats.count(chaosLoads)
	c.logf(w, "loaded %s within %v", cp, limit)
	if got := cp.g.p.tenant.name; got != w.tenant {
		c.failf(w, "load of %s for tenant %q placed it in a worker of tenant %q", cp, w.tenant, got)
	}
	w.held = append(w.held, cp)
}

// sibling checks err, the failure of an operation of w on cp (nil: a
// load) that did not crash or hang its worker: a collateral loss of a
// worker the test crashed or hung. A failed program is dropped.
func (c *chaos) sibling(w *chaosWorker, cp *chaosProg, what string, err error) {
	if cp != nil {
		what += " on " + cp.String()
	}
	c.logf(w, "%s failed: %v", what, err)
	var pe *ProcessExit
	switch {
	case !errors.As(err, &pe):
		c.failf(w, "%s failed with no loss of its worker: %v", what, err)
	case !pe.Collateral():
		c.failf(w, "%s lost its worker by its own fault, not collaterally: %v", what, err)
	case cp != nil && pe.PID != cp.g.PID():
		c.failf(w, "%s lost worker %d, not its own: %v", what, pe.PID, err)
	case c.why(pe.PID) == "":
		c.failf(w, "%s lost worker %d, which the test neither crashed nor hung: %v", what, pe.PID, err)
	default:
		c.stats.count(chaosCollateral)
	}
	if cp != nil {
		c.drop(w, cp)
	}
}

// drop closes cp, a program whose worker died, in either order (the
// engine's abandon closes the program while busy instances of it are
// still out).
func (c *chaos) drop(w *chaosWorker, cp *chaosProg) {
	c.stats.count(chaosDropped)
	if cp.in != nil && w.rng.IntN(2) == 0 {
		cp.g.Close()
		cp.in.Close()
		cp.in = nil
	}
	c.unload(w, cp)
}

// unload closes cp's instance, then cp, as the engine does, and takes it
// out of w's programs: its staged files are gone, its Exited closed.
func (c *chaos) unload(w *chaosWorker, cp *chaosProg) {
	if cp.in != nil {
		cp.in.Close()
		cp.in = nil
	}
	cp.g.Close()
	c.stats.count(chaosUnloads)
	c.logf(w, "unloaded %s", cp)
	w.held = slices.DeleteFunc(w.held, func(x *chaosProg) bool { return x == cp })
	// Removed by the unload, or with the stage as the worker, ended with
	// its last program, is reaped.
	left := func() string {
		for _, f := range cp.g.staged {
			if _, err := os.Lstat(f); !errors.Is(err, os.ErrNotExist) {
				return filepath.Base(f)
			}
		}
		return ""
	}
	for end := time.Now().Add(c.patience()); left() != ""; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(end) {
			c.failf(w, "unloaded %s: its staged file %s is left %v on", cp, left(), c.patience())
			break
		}
	}
	select {
	case <-cp.g.Exited():
	default:
		c.failf(w, "unloaded %s: its Exited is not closed", cp)
	}
}

// instance is cp's instance, made if it has none; nil if cp was lost.
func (c *chaos) instance(w *chaosWorker, cp *chaosProg) device.Instance {
	if cp.in != nil {
		return cp.in
	}
	in, err := cp.g.NewInstance(device.InstanceConfig{MaxInput: cp.m.MaxInputBytes, Tmp: cp.m.TmpBytes, Out: cp.m.OutBytes})
	if err != nil {
		c.sibling(w, cp, "new instance", err)
		return nil
	}
	cp.in = in
	return in
}

// chain is the steps of an echo on cp (sleeping ms first on a slow one).
func (c *chaos) chain(w *chaosWorker, cp *chaosProg, ms int32) ([]device.Step, bool) {
	switch cp.kind {
	case chaosSlow:
		return []device.Step{{Entry: 0, Grid: max(ms, 1), Block: 1}, {Entry: 1, Grid: 1, Block: 8}}, true
	case chaosHostile:
		e, err := cp.g.Entry("echo")
		if err != nil {
			c.sibling(w, cp, "entry echo", err)
			return nil, false
		}
		return []device.Step{{Entry: e, Grid: 1, Block: 1}}, true
	}
	return []device.Step{{Entry: 0, Grid: 1, Block: 64}}, true
}

// run echoes bytes of w's own through cp (in a pool slot it lends, with
// lent; after ms of sleep on a slow one): they come back exactly, or the
// run fails as a sibling's may.
func (c *chaos) run(w *chaosWorker, cp *chaosProg, lent bool, ms int32) {
	if cp == nil {
		return
	}
	steps, ok := c.chain(w, cp, ms)
	if !ok {
		return
	}
	in := c.instance(w, cp)
	if in == nil {
		return
	}
	msg := fmt.Appendf(nil, "seed %d worker %d op %d:", c.seed, w.id, w.op)
	for range w.rng.IntN(int(cp.m.OutBytes) - len(msg)) {
		msg = append(msg, byte(w.rng.IntN(256)))
	}
	r := &device.Run{Input: msg, Output: make([]byte, cp.m.OutBytes), Chain: steps, Deadline: time.Now().Add(30 * time.Second)}
	how := "run"
	if lent {
		if s, ok := cp.g.Lend(cp.m.MaxInputBytes, cp.m.OutBytes); ok {
			defer s.Release()
			r.Input, r.Output, r.Slot = s.Input()[:copy(s.Input(), msg)], s.Output(), s
			how = "run in a lent slot"
		}
	}
	if ms > 0 {
		how = fmt.Sprintf("%s after %d ms", how, ms)
	}
	if err := in.Run(r); err != nil {
		c.sibling(w, cp, how, err)
		return
	}
	out := r.Output
	if r.OutLen != int64(len(out)) || !bytes.Equal(out[:len(msg)], msg) || slices.ContainsFunc(out[len(msg):], func(b byte) bool { return b != 0 }) {
		c.failf(w, "%s on %s: %d bytes answered %q, want %q zero-padded to %d", how, cp, r.OutLen, out, msg, len(out))
	}
	switch {
	case r.Slot != nil:
		c.stats.count(chaosLentRuns)
	case ms > 0:
		c.stats.count(chaosSlowRuns)
	default:
		c.stats.count(chaosEchoes)
	}
	c.logf(w, "%s on %s: echoed %d bytes", how, cp, len(msg))
}

// crash has cp, a hostile program, crash its worker with a segv, while
// the goroutines' other programs run on: its run's loss is its own, not
// collateral (the fatal mark names it), and so is its Death.
func (c *chaos) crash(w *chaosWorker, cp *chaosProg) {
	c.crashMu.Lock()
	defer c.crashMu.Unlock()
	in, pid := c.doom(w, cp, "crashed")
	if in == nil {
		return
	}
	stop := make(chan struct{})
	var storm sync.WaitGroup
	if w.rng.IntN(2) == 0 {
		c.logf(w, "crash %s (stage %s) amid a storm of loads", cp, filepath.Base(cp.g.p.stage))
		for range 2 {
			storm.Go(func() { c.storm(w, pid, stop) })
		}
	} else {
		c.logf(w, "crash %s (stage %s)", cp, filepath.Base(cp.g.p.stage))
	}
	defer storm.Wait()
	defer close(stop)
	err := in.Run(&device.Run{Output: make([]byte, cp.m.OutBytes), Chain: []device.Step{{Entry: 0, Grid: 1, Block: 1}}, Deadline: time.Now().Add(30 * time.Second)})
	var pe *ProcessExit
	if !errors.As(err, &pe) || pe.Collateral() || pe.PID != pid || !strings.Contains(pe.Reason, "SIGSEGV") {
		c.failf(w, "the crashing run of %s: %v, want its own loss of worker %d by SIGSEGV", cp, err, pid)
	}
	c.stats.count(chaosCrashes)
	c.culpritGone(w, cp, false)
}

// storm loads programs for w's tenant, and unloads them, one after the
// other, while worker pid crashes, until one lands in another worker (or
// stop, once pid was reaped): as requests retrying their loads would. A
// load fails only as a collateral loss of pid.
func (c *chaos) storm(w *chaosWorker, pid int, stop <-chan struct{}) {
	spec := c.spec(w, chaosEcho)
	for end := time.Now().Add(10 * time.Second); time.Now().Before(end); {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		p, err := c.d.Load(ctx, spec)
		cancel()
		if err != nil {
			var pe *ProcessExit
			if !errors.As(err, &pe) || !pe.Collateral() || pe.PID != pid {
				c.failf(w, "a load beside the crash of worker %d: %v, want a collateral loss of that worker", pid, err)
			}
			c.logf(w, "a load beside the crash of worker %d: %v", pid, err)
			c.stats.count(chaosCollateral)
			continue
		}
		g := p.(*program)
		g.Close()
		if g.PID() != pid {
			return
		}
		select {
		case <-stop:
			return
		default:
		}
	}
}

// hang has cp, a slow program, run past its deadline and the grace after
// it: the run fails at its deadline, the server kills the worker for cp,
// whose loss it is (ByServer), not collateral.
func (c *chaos) hang(w *chaosWorker, cp *chaosProg) {
	c.crashMu.Lock()
	defer c.crashMu.Unlock()
	in, pid := c.doom(w, cp, "hung")
	if in == nil {
		return
	}
	c.logf(w, "hang %s (worker %d)", cp, pid)
	err := in.Run(&device.Run{Output: make([]byte, cp.m.OutBytes), Chain: []device.Step{{Entry: 0, Grid: 5000, Block: 1}},
		Deadline: time.Now().Add(50 * time.Millisecond)})
	if _, lost := device.AsLoss(err); !errors.Is(err, device.ErrDeadline) || lost {
		c.failf(w, "the hanging run of %s: %v, want the request's deadline", cp, err)
	}
	c.stats.count(chaosHangs)
	c.culpritGone(w, cp, true)
}

// doom readies cp (nil: none) to end its worker, crashMu held: cp alive,
// its instance, and its worker's pid noted as one the test ends (verb).
// A nil instance: cp was lost meanwhile, or there was none.
func (c *chaos) doom(w *chaosWorker, cp *chaosProg, verb string) (device.Instance, int) {
	if cp == nil || !c.held(w, cp) {
		return nil, 0
	}
	in := c.instance(w, cp)
	if in == nil {
		return nil, 0
	}
	pid := cp.g.PID()
	c.culprit(pid, fmt.Sprintf("worker %d op %d %s it by %s", w.id, w.op, verb, cp))
	return in, pid
}

// held reports whether cp, about to crash or hang its worker, is alive
// (crashMu held: no other death can come); one lost with a worker a
// sibling ended is dropped.
func (c *chaos) held(w *chaosWorker, cp *chaosProg) bool {
	if cp.g.Alive() {
		return true
	}
	c.sibling(w, cp, "a crash's look at it", cp.g.Death())
	return false
}

// culpritGone waits for cp's worker, which cp crashed (or hung: byServer),
// to be gone, checks cp's Death is its own, and drops cp.
func (c *chaos) culpritGone(w *chaosWorker, cp *chaosProg, byServer bool) {
	select {
	case <-cp.g.Exited():
	case <-time.After(20 * time.Second):
		c.failf(w, "the worker of %s outlived its crash (hung %v) by 20 s", cp, byServer)
	}
	if dg := cp.g.Death(); dg == nil || dg.Collateral() || dg.ByServer() != byServer {
		c.failf(w, "the death of %s's worker: %v, want its own loss, by the server %v", cp, dg, byServer)
	}
	c.unload(w, cp)
}

// culprit notes that the test is about to end worker pid on purpose.
func (c *chaos) culprit(pid int, why string) {
	c.mu.Lock()
	c.crashed[pid] = why
	c.mu.Unlock()
}

// why is what the test did to worker pid ("": nothing).
func (c *chaos) why(pid int) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.crashed[pid]
}

func (c *chaos) logf(w *chaosWorker, format string, args ...any) {
	who := "main"
	if w != nil {
		who = fmt.Sprintf("w%d/%s op %d", w.id, w.tenant, w.op)
	}
	line := fmt.Sprintf("%8.3fs %s: %s", time.Since(c.start).Seconds(), who, fmt.Sprintf(format, args...))
	c.mu.Lock()
	c.trace = append(c.trace, line)
	if len(c.trace) > 4*chaosTraceKeep {
		c.trace = slices.Clone(c.trace[len(c.trace)-chaosTraceKeep:])
	}
	c.mu.Unlock()
}

func (c *chaos) failf(w *chaosWorker, format string, args ...any) {
	c.logf(w, "FAIL: "+format, args...)
	who := "main"
	if w != nil {
		who = fmt.Sprintf("worker %d (tenant %s) op %d", w.id, w.tenant, w.op)
	}
	c.t.Errorf("seed %d, %s: %s", c.seed, who, fmt.Sprintf(format, args...))
}

func (c *chaos) traceText() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return strings.Join(c.trace[max(0, len(c.trace)-chaosTraceKeep):], "\n")
}
