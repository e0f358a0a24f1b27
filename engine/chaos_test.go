package engine_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/bundle"
	"github.com/plover-run/plover/call"
	"github.com/plover-run/plover/device"
	"github.com/plover-run/plover/engine"
	"github.com/plover-run/plover/errdefs"
	"github.com/plover-run/plover/internal/testkit"
	"github.com/plover-run/plover/worker"
)

// A bounded, randomized test of the engine over tenants' shared workers
// (worker.Options.TenantScope, real worker processes), through its public
// API alone: goroutines invoke two tenants' functions (echoes, a slow one,
// a hostile one; plain, with the body landed in a worker's slot (Land),
// pinned to a version first (Pin), or with a chain of the request's own),
// crash a tenant's worker with the hostile one (SIGSEGV, SIGABRT),
// redeploy, delete, deploy again and roll back functions, and list them,
// all at once, while the engine's reaper unloads what idles (idle_ttl
// 500ms, the hostile one's 200ms). Each goroutine's operations come from
// its seed (PLOVER_ENGINE_CHAOS_SEEDS replays some); their interleaving is
// the scheduler's. Checked on every answer:
//
//   - a request answers its own bytes, transformed as a version of its
//     function that was current at some moment of the request (each
//     version's chain adds its number to every byte, and its out_bytes
//     differ; a pinned request's, as the version it pinned), never
//     another's; it never changes its input, and nothing is written into
//     its output buffer after it returned;
//   - it fails only as documented: not found when its function was deleted
//     at some moment of it (and always then, if it was deleted throughout);
//     a timeout only at a short deadline; a crash of the hostile function
//     as its own loss by its signal; for its siblings a collateral loss
//     (ProcessExit.Shared) only when two deaths of their tenant's worker
//     came too close for the engine's one retry; a back-off only for the
//     hostile function, lasting until the time it names or a control
//     operation on it; and it returns by its deadline (plus the grace a
//     worker's instance creation has);
//   - a deploy is unchanged exactly when its bundle is the current one's
//     and it is not forced; a rollback makes the version it names current;
//   - a listing shows each function with a version it had at some moment
//     of the listing, and no worker process serving two tenants;
//
// and after the play: every function left answers its current version,
// with the hostile one redeployed if backing off; no innocent function was
// ever counted a crash (the log's "worker died"); the listing is the
// model's, each tenant's functions in one worker; and with everything
// deleted no worker process, and no more goroutines than at the start,
// are left.
func TestEngineChaos(t *testing.T) {
	seeds, ops := []uint64{1, 2, 3}, 200
	if testing.Short() {
		seeds, ops = []uint64{1}, 25
	}
	if s := os.Getenv("PLOVER_ENGINE_CHAOS_SEEDS"); s != "" { // to replay a failing seed
		seeds = nil
		for _, f := range strings.Split(s, ",") {
			n, err := strconv.ParseUint(f, 10, 64)
			if err != nil {
				t.Fatalf("PLOVER_ENGINE_CHAOS_SEEDS=%q: %v", s, err)
			}
			seeds = append(seeds, n)
		}
	}
	libs := ecLibs{kernels: filepath.Join(t.TempDir(), "kernels.so"), hostile: filepath.Join(t.TempDir(), "hostile.so")}
	testkit.BuildLib(t, testkit.KernelsSource(), filepath.Dir(libs.kernels), "kernels.so")
	testkit.BuildLib(t, testkit.HostileSource(), filepath.Dir(libs.hostile), "hostile.so")
	var total ecStats
	for _, seed := range seeds {
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			c := newEC(t, libs, seed)
			c.play(ops)
			t.Logf("seed %d in %v: %v", seed, time.Since(c.start).Round(time.Millisecond), &c.stats)
			total.add(&c.stats)
			if t.Failed() {
				t.Logf("seed %d, the operations up to its first failure:\n%s\nthe engine's log then:\n%s", seed, c.traceText(), c.logText())
			}
		})
	}
	// Not vacuous: workers were crashed with siblings in them, which lost
	// them as collateral, and control operations ran between requests.
	t.Logf("all seeds: %v", &total)
	little := total.get(ecEchoes) < int64(len(seeds))*30
	for _, what := range []string{ecCrashes, ecCollateralLogged, ecSurvived, ecRedeploys, ecDeletes, ecRollbacks, ecSharedSeen} {
		little = little || total.get(what) == 0
	}
	if little && !t.Failed() {
		t.Errorf("the chaos did too little to show anything: %v", &total)
	}
}

const (
	ecGoroutines = 6
	ecVariants   = 3 // versions of each function: variant k adds k to each byte
	ecSlowMs     = 20
	ecLong       = 10 * time.Second // an ordinary request's deadline
	// ecSlack is how late past its deadline a request may return: the
	// grace of a worker's instance creation (worker's instanceGrace, 2 s)
	// and some scheduling on a busy machine.
	ecSlack     = 2500 * time.Millisecond
	ecRoundMax  = 90 * time.Second // past it the play is hung
	ecTraceKeep = 150              // operations shown before the first failure
	// ecStale is how long after a crash an instance of the dead worker
	// may still be taken idle (until the engine's exit watcher drops it,
	// once the worker is reaped): a request that took one had its loss
	// before it began.
	ecStale   = 300 * time.Millisecond
	ecLogKeep = 120
)

var ecTenants = []string{"acme", "bolt"}

type ecLibs struct{ kernels, hostile string }

type ecKind int

const (
	ecEcho ecKind = iota
	ecSlow
	ecHostile
)

// ecFn is a function of the play, and what its control operations did.
type ecFn struct {
	name, tenant string
	kind         ecKind
	bundles      [ecVariants][]byte // packed, variant k at k

	// ctl: one control operation on it at a time, so that hist is a
	// sequence; versions are those since it was last created (ctl held).
	ctl      sync.Mutex
	versions []ecVersion

	mu      sync.Mutex
	hist    []ecEvent
	backoff *ecBackoff // the last back-off a request saw
}

type ecVersion struct {
	id string
	k  int
}

// ecState is a function's state after a control operation: deleted, or
// current at version id (variant k; id "" while its deploy is in flight).
type ecState struct {
	exists bool
	k      int
	id     string
}

// ecEvent is a control operation from begin to end (zero: in flight),
// leaving st.
type ecEvent struct {
	begin, end time.Time
	st         ecState
}

// ecBackoff is a back-off a request saw, and its version (the only one
// current throughout that request).
type ecBackoff struct {
	id          string
	seen, until time.Time
}

// ecWindow is a crash the test made: from before its request to after.
type ecWindow struct{ begin, end time.Time }

// ec is one seed's play on one engine.
type ec struct {
	t     *testing.T
	e     *engine.Engine
	logs  *testkit.LogBuffer
	seed  uint64
	fns   []*ecFn
	by    map[string]map[ecKind][]*ecFn // tenant, kind
	stats ecStats
	start time.Time

	crashMu map[string]*sync.Mutex // per tenant: one crash of its worker at a time

	mu         sync.Mutex
	crashes    map[string][]*ecWindow // per tenant
	trace      []string
	firstFail  int       // the trace's line of the first failure (-1: none)
	failedAt   time.Time // when
	maxLate    time.Duration
	goroutines int // at the start
}

func newEC(t *testing.T, libs ecLibs, seed uint64) *ec {
	wd := worker.NewDevice(worker.Options{Exe: os.Args[0], Base: device.NewHost(0), Landlock: true,
		StageDir: t.TempDir(), Spawner: spawner, TenantScope: true})
	t.Cleanup(func() { wd.Close() })
	logs := &testkit.LogBuffer{}
	e := testkit.Engine(t, engine.Config{Devices: []device.Device{wd}, Log: slog.New(slog.NewTextHandler(logs, nil))})
	c := &ec{t: t, e: e, logs: logs, seed: seed, by: map[string]map[ecKind][]*ecFn{}, start: time.Now(),
		crashMu: map[string]*sync.Mutex{}, crashes: map[string][]*ecWindow{}, firstFail: -1}
	c.goroutines = runtime.NumGoroutine()
	for ti, tenant := range ecTenants {
		c.crashMu[tenant] = &sync.Mutex{}
		c.by[tenant] = map[ecKind][]*ecFn{}
		for i, kind := range []ecKind{ecEcho, ecEcho, ecEcho, ecSlow, ecHostile} {
			f := &ecFn{name: fmt.Sprintf("%s-%s%d", tenant, [...]string{"echo", "slow", "hostile"}[kind], i), tenant: tenant, kind: kind}
			for k := range ecVariants {
				f.bundles[k] = ecBundle(t, libs, f, k)
			}
			c.fns = append(c.fns, f)
			c.by[tenant][kind] = append(c.by[tenant][kind], f)
			// Deployed before the play, at variants of the tenant's turn.
			f.ctl.Lock()
			c.deploy(nil, f, (ti+i)%ecVariants, false)
			f.ctl.Unlock()
		}
	}
	return c
}

// ecBundle packs f's variant k: the test kernels' echo, after a sleep for
// a slow one, then add_one k times; the hostile bundle's echo. Its
// out_bytes are 256+32k, so that every variant's answer differs.
func ecBundle(t *testing.T, libs ecLibs, f *ecFn, k int) []byte {
	m := testkit.Manifest(f.name)
	m.OutBytes = 256 + 32*int64(k)
	m.IdleTTL = "500ms" // the reaper unloads functions amid the play
	lib := libs.kernels
	switch f.kind {
	case ecSlow:
		m.Chain = []abi.Launch{{Kernel: "sleep_ms", Grid: ecSlowMs, Block: 1}, {Kernel: "echo", Grid: 1, Block: 8}}
	case ecHostile:
		m.Library, lib = "hostile.so", libs.hostile
		// Shorter than a back-off: the reaper meets versions backing off.
		m.IdleTTL = "200ms"
		m.Chain = []abi.Launch{{Kernel: "echo", Grid: 1, Block: 1}}
	}
	if f.kind != ecHostile {
		for range k {
			m.Chain = append(m.Chain, abi.Launch{Kernel: "add_one", Grid: 1, Block: 1})
		}
	}
	dir := t.TempDir()
	b, err := os.ReadFile(lib)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, m.Library), b, 0o755); err != nil {
		t.Fatal(err)
	}
	testkit.WriteManifest(t, dir, m)
	packed, _, _, err := bundle.PackBytes(dir)
	if err != nil {
		t.Fatal(err)
	}
	return packed
}

// want is f's answer to in at variant k: in, plus k on every byte, then
// k to out_bytes (the hostile echo adds nothing and pads with zeroes);
// with plusOne (a request's chain: echo, add_one), 1 for k.
func (f *ecFn) want(in []byte, k int, plusOne bool) []byte {
	add := byte(k)
	switch {
	case plusOne:
		add = 1
	case f.kind == ecHostile:
		add = 0
	}
	out := bytes.Repeat([]byte{add}, 256+32*k)
	for i, b := range in {
		out[i] = b + add
	}
	return out
}

// ecG is one goroutine's state.
type ecG struct {
	id  int
	rng *rand.Rand
	op  int
	// buf is its requests' output buffer, reused as a server reuses a
	// request's; between requests it holds a canary (canary).
	buf  []byte
	last string
}

// play runs ops operations on each goroutine, the reaper running, then
// checks and deletes everything (end).
func (c *ec) play(ops int) {
	ctx, stop := context.WithCancel(context.Background())
	var reaper sync.WaitGroup
	reaper.Go(func() { c.e.ReapEvery(ctx, 100*time.Millisecond) })
	var wg sync.WaitGroup
	for i := range ecGoroutines {
		g := &ecG{id: i, rng: rand.New(rand.NewPCG(c.seed, uint64(i))), buf: make([]byte, 512)}
		c.canary(g, "start")
		wg.Go(func() {
			for range ops {
				g.op++
				c.step(g)
			}
			c.checkCanary(g)
		})
	}
	c.await(&wg, "the play")
	stop()
	reaper.Wait()
	c.logf(nil, "the play is over")
	c.end()
}

// await waits for wg within ecRoundMax, and fails with every goroutine's
// stack past it.
func (c *ec) await(wg *sync.WaitGroup, what string) {
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(ecRoundMax):
		buf := make([]byte, 1<<20)
		n := runtime.Stack(buf, true)
		c.t.Fatalf("seed %d: %s did not end within %v: hung\n%s\ntrace:\n%s", c.seed, what, ecRoundMax, buf[:n], c.traceText())
	}
}

// step does one randomly chosen operation of g's.
func (c *ec) step(g *ecG) {
	tenant := ecTenants[g.rng.IntN(len(ecTenants))]
	pick := func(kinds ...ecKind) *ecFn {
		var fs []*ecFn
		for _, k := range kinds {
			fs = append(fs, c.by[tenant][k]...)
		}
		return fs[g.rng.IntN(len(fs))]
	}
	// A control operation's function: seldom the hostile one, whose
	// back-offs the requests are to meet.
	ctlPick := func() *ecFn {
		if g.rng.IntN(10) == 0 {
			return pick(ecHostile)
		}
		return pick(ecEcho, ecSlow)
	}
	switch r := g.rng.IntN(100); {
	case r < 28:
		c.judge(c.call(g, pick(ecEcho), "echo", ecReq{limit: ecLong}))
	case r < 34:
		c.judge(c.call(g, pick(ecEcho), "echo pinned", ecReq{limit: ecLong, pin: true}))
	case r < 40:
		// A request's own chain: its kernels looked up in the program that
		// runs it (a lookup that may find the worker dead).
		ov := &call.Override{Chain: []abi.Launch{{Kernel: "echo", Grid: 1, Block: 64}, {Kernel: "add_one", Grid: 1, Block: 1}}, OutBytes: -1, TmpBytes: -1}
		c.judge(c.call(g, pick(ecEcho), "echo (chain +1)", ecReq{limit: ecLong, ov: ov}))
	case r < 52:
		limit := ecLong
		if g.rng.IntN(2) == 0 {
			limit = time.Duration(5+g.rng.IntN(60)) * time.Millisecond
		}
		c.judge(c.call(g, pick(ecSlow), "slow", ecReq{limit: limit}))
	case r < 57:
		c.judge(c.call(g, pick(ecHostile), "hostile echo", ecReq{limit: ecLong}))
	case r < 65:
		c.crash(g, tenant)
	case r < 77:
		f := ctlPick()
		f.ctl.Lock()
		c.deploy(g, f, g.rng.IntN(ecVariants), g.rng.IntN(4) == 0)
		f.ctl.Unlock()
	case r < 82:
		c.remove(g, ctlPick())
	case r < 92:
		c.rollback(g, ctlPick())
	default:
		c.list(g)
	}
}

// ecReq is how a request is made: within limit, with its own chain ov
// (nil: the version's), on a version pinned first (Pin).
type ecReq struct {
	limit time.Duration
	ov    *call.Override
	pin   bool
}

// ecCall is one request and its answer.
type ecCall struct {
	g            *ecG
	f            *ecFn
	what         string
	in, out      []byte
	s, e, dl     time.Time
	short        bool
	err          error
	states       []ecState // f's states at some moment from s to e
	exists, gone bool      // some of states has f, some has not
	plusOne      bool      // its chain adds 1, whatever the version
	pinned       string    // the version it pinned ("": none)
}

// call invokes f with a body of g's own as q says, and checks what any
// answer must be: its input untouched, its return by its deadline and
// ecSlack.
func (c *ec) call(g *ecG, f *ecFn, what string, q ecReq) *ecCall {
	c.checkCanary(g)
	in := fmt.Appendf(nil, "seed %d g%d op %d:", c.seed, g.id, g.op)
	for range g.rng.IntN(200) {
		in = append(in, byte(g.rng.IntN(256)))
	}
	r := &ecCall{g: g, f: f, what: what, in: bytes.Clone(in), short: q.limit < time.Second}
	r.plusOne = q.ov != nil && f.kind != ecHostile
	req := &call.Request{Input: in, Output: g.buf[:0], Override: q.ov}
	r.s = time.Now()
	// Half the ordinary requests read their body into memory the engine
	// lends (Land), as the HTTP path does: a slot of a worker's program
	// that may be crashed, redeployed or unloaded before the run.
	if q.ov == nil && g.rng.IntN(2) == 0 {
		if l := c.e.Land(f.name); l != nil {
			defer l.Release()
			in = l.Input()[:copy(l.Input(), in)]
			req.Input, req.Landing = in, l
			r.what += " (landed)"
			c.stats.count(ecLanded)
		}
	}
	r.dl = r.s.Add(q.limit)
	req.Deadline = r.dl
	if q.pin {
		p, err := c.e.Pin(context.Background(), f.name, r.dl)
		r.err = err
		if err == nil {
			r.pinned = p.Version().ID
			r.err = p.Invoke(context.Background(), req)
			p.Release()
		}
	} else {
		r.err = c.e.Invoke(context.Background(), f.name, req)
	}
	r.e = time.Now()
	if r.err == nil {
		r.out = bytes.Clone(req.Output)
	}
	c.canary(g, fmt.Sprintf("%s on %s (op %d)", what, f.name, g.op))
	r.states = f.states(r.s, r.e)
	for _, st := range r.states {
		r.exists = r.exists || st.exists
		r.gone = r.gone || !st.exists
	}
	c.logf(g, "%s on %s within %v: %s", r.what, f.name, q.limit, brief(r.err, r.out))
	if !bytes.Equal(in, r.in) {
		c.failf(g, "%s on %s: its input changed to %q, was %q", r.what, f.name, in, r.in)
	}
	late := r.e.Sub(r.dl)
	c.mu.Lock()
	c.maxLate = max(c.maxLate, late)
	c.mu.Unlock()
	if late > ecSlack {
		c.failf(g, "%s on %s returned %v past its deadline (%v): %v", r.what, f.name, late.Round(time.Millisecond), q.limit, r.err)
	}
	return r
}

func brief(err error, out []byte) string {
	if err != nil {
		return fmt.Sprintf("%v (kind %d)", err, errdefs.KindOf(err))
	}
	return fmt.Sprintf("answered %d bytes", len(out))
}

// judge checks an ordinary request's answer (see TestEngineChaos).
func (c *ec) judge(r *ecCall) {
	f, g := r.f, r.g
	k := errdefs.KindOf(r.err)
	if f.kind == ecHostile {
		c.checkBackoff(r)
	}
	switch {
	case r.err == nil && !r.exists:
		c.failf(g, "%s on %s answered, though it was deleted before the request began and not deployed since", r.what, f.name)
	case r.err == nil:
		for _, st := range r.states {
			if r.pinned != "" && st.id != "" && st.id != r.pinned {
				continue // not the version it pinned
			}
			if st.exists && bytes.Equal(r.out, f.want(r.in, st.k, r.plusOne)) {
				c.stats.count(ecEchoes)
				if c.crashedDuring(f.tenant, r.s, r.e) && f.kind != ecHostile {
					c.stats.count(ecSurvived)
				}
				return
			}
		}
		c.failf(g, "%s on %s answered %d bytes %q; want its own %q as one of the versions %v (pinned %q)", r.what, f.name, len(r.out), r.out, r.in, r.states, r.pinned)
	case k == errdefs.KindNotFound && r.gone:
		c.stats.count(ecNotFound)
	case k == errdefs.KindTimeout && r.short:
		// Before the check of a deleted function: a deadline of a few
		// milliseconds may pass in the store's read that would have
		// said not found (seed 3 under a loaded make test, 5 ms).
		c.stats.count(ecTimeouts)
	case !r.exists:
		c.failf(g, "%s on %s: %v; want not found: it was deleted before the request began", r.what, f.name, r.err)
	case k == errdefs.KindWorkerCrashed:
		c.judgeLoss(r)
	case k == errdefs.KindUnavailable && f.kind == ecHostile && strings.Contains(r.err.Error(), "backing off"):
		c.sawBackoff(r)
	case k == errdefs.KindUnavailable && strings.HasSuffix(r.what, "(landed)") && strings.Contains(r.err.Error(), "the worker this request's body was read into"):
		// Its body landed in a slot of a worker of the version before
		// a redeploy, or of one an idle unload was ending, which may
		// still have written it: refused, a retry's to land anew.
		c.stats.count(ecRelanded)
	default:
		c.failf(g, "%s on %s (version %v, deadline %v): %v (kind %d): not an error this request may get", r.what, f.name, r.states, r.dl.Sub(r.s), r.err, k)
	}
}

// judgeLoss checks a request that lost its worker: the hostile function's
// own when it crashed it meanwhile; a sibling's only as collateral, and
// only when a second death of the tenant's worker came too close for the
// engine's one retry (the first may have come just before the request,
// leaving an instance of the dead worker idle).
func (c *ec) judgeLoss(r *ecCall) {
	var pe *worker.ProcessExit
	deaths, during := c.deaths(r.f.tenant, r.s, r.e)
	switch {
	case !errors.As(r.err, &pe):
		c.failf(r.g, "%s on %s: %v: a worker crash with no worker's exit in it", r.what, r.f.name, r.err)
	case r.f.kind == ecHostile && during > 0:
		c.stats.count(ecOwnLosses)
	case r.f.kind == ecHostile:
		c.failf(r.g, "%s on %s: %v, with no crash of its tenant's worker during the request", r.what, r.f.name, r.err)
	case !pe.Shared:
		c.failf(r.g, "%s on %s: %v: an innocent function's loss not collateral (its crash, counted towards its back-off)", r.what, r.f.name, r.err)
	case during >= 2 || during == 1 && deaths >= 2:
		c.stats.count(ecCollateral)
	default:
		c.failf(r.g, "%s on %s failed with a collateral loss after %d crashes of its tenant's worker (%d during the request): the engine retries such a loss once: %v",
			r.what, r.f.name, deaths, during, r.err)
	}
}

// sawBackoff notes a back-off r saw, when one version was current all
// through r: until the time it names, or a control operation on its
// function, every request for that version must see it too.
func (c *ec) sawBackoff(r *ecCall) {
	c.stats.count(ecBackoffs)
	msg := r.err.Error()
	i := strings.Index(msg, "until ")
	var until time.Time
	var err error
	if i >= 0 {
		until, err = time.Parse(time.RFC3339, strings.Fields(msg[i+len("until "):])[0])
	}
	if i < 0 || err != nil {
		c.failf(r.g, "%s on %s: a back-off naming no time it ends: %v", r.what, r.f.name, r.err)
		return
	}
	if len(r.states) != 1 {
		return
	}
	r.f.mu.Lock()
	r.f.backoff = &ecBackoff{id: r.states[0].id, seen: r.e, until: until}
	r.f.mu.Unlock()
}

// checkBackoff checks r, a request for the hostile function, against the
// last back-off seen: one that began after it, before it ends, with no
// control operation on the function since, is refused by it too.
func (c *ec) checkBackoff(r *ecCall) {
	f := r.f
	f.mu.Lock()
	b := f.backoff
	last := f.hist[len(f.hist)-1]
	f.mu.Unlock()
	if b == nil || !r.s.After(b.seen) || !r.e.Before(b.until.Add(-time.Second)) || last.end.IsZero() || last.end.After(b.seen) {
		return
	}
	if errdefs.KindOf(r.err) != errdefs.KindUnavailable || !strings.Contains(r.err.Error(), "backing off") {
		c.failf(r.g, "%s on %s: %s; its version %s was backing off until %s (seen %v before), and no control operation on it came since",
			r.what, f.name, brief(r.err, r.out), b.id, b.until.Format(time.RFC3339), r.s.Sub(b.seen).Round(time.Millisecond))
	}
}
