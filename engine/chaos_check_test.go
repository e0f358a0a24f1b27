package engine_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/call"
	"github.com/plover-run/plover/errdefs"
	"github.com/plover-run/plover/worker"
)

// TestEngineChaos's crashes, control operations, its model of each
// function's versions, and its checks after the play.

// begin records a control operation on f beginning, to leave st (f.ctl
// held); end records it done, leaving st.
func (f *ecFn) begin(st ecState) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.hist = append(f.hist, ecEvent{begin: time.Now(), st: st})
	return len(f.hist) - 1
}

func (f *ecFn) end(i int, st ecState) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.hist[i].end, f.hist[i].st = time.Now(), st
}

// current is f's state after its last control operation (f.ctl held:
// none is in flight).
func (f *ecFn) current() ecState {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.hist[len(f.hist)-1].st
}

// states are f's states at some moment from s to e: the one its last
// operation ended before s left, and those of the operations from then
// to e (their order is their begin's: ctl).
func (f *ecFn) states(s, e time.Time) []ecState {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []ecState
	base := -1
	for i, ev := range f.hist {
		switch {
		case !ev.end.IsZero() && !ev.end.After(s):
			base = i
		case !ev.begin.After(e):
			out = append(out, ev.st)
		}
	}
	if base >= 0 {
		out = append(out, f.hist[base].st)
	}
	return out
}

// crash has tenant's hostile function crash its worker, 1 to 3 times in a
// row, a crash at a time per tenant: each request fails as that crash
// (its own loss, not collateral, by the signal), unless the function is
// gone or backing off; a back-off is ended by a forced redeploy, which
// the next crash must find ended.
func (c *ec) crash(g *ecG, tenant string) {
	mu := c.crashMu[tenant]
	mu.Lock()
	defer mu.Unlock()
	f := c.by[tenant][ecHostile][0]
	redeployed := false
	for n := 1 + g.rng.IntN(3); n > 0; n-- {
		kernel, sig := "segv", "SIGSEGV"
		if g.rng.IntN(2) == 0 {
			kernel, sig = "abort_now", "SIGABRT"
		}
		w := &ecWindow{begin: time.Now()}
		c.mu.Lock()
		c.crashes[tenant] = append(c.crashes[tenant], w)
		c.mu.Unlock()
		ov := &call.Override{Chain: []abi.Launch{{Kernel: kernel, Grid: 1, Block: 1}}, OutBytes: -1, TmpBytes: -1}
		r := c.call(g, f, "crash by "+kernel, ecReq{limit: ecLong, ov: ov})
		c.mu.Lock()
		w.end = r.e
		c.mu.Unlock()
		c.checkBackoff(r)
		if !c.judgeCrash(g, r, kernel, sig, redeployed) {
			// No crash: the window is no death.
			c.mu.Lock()
			w.end = w.begin.Add(-time.Hour)
			c.mu.Unlock()
		}
		redeployed = false
		if errdefs.KindOf(r.err) == errdefs.KindUnavailable && strings.Contains(r.err.Error(), "backing off") {
			if g.rng.IntN(4) != 0 {
				return // left backing off, for the requests to come to find
			}
			f.ctl.Lock()
			if cur := f.current(); cur.exists {
				c.deploy(g, f, cur.k, true)
				redeployed = true
			}
			f.ctl.Unlock()
		}
	}
}

// judgeCrash checks the answer of a crash by kernel (its signal sig), and
// reports whether it crashed the worker.
func (c *ec) judgeCrash(g *ecG, r *ecCall, kernel, sig string, redeployed bool) bool {
	k := errdefs.KindOf(r.err)
	var pe *worker.ProcessExit
	switch {
	case r.err == nil:
		c.failf(g, "a %s chain on %s answered %d bytes", kernel, r.f.name, len(r.out))
	case k == errdefs.KindNotFound && r.gone:
		c.stats.count(ecNotFound)
	case !r.exists:
		c.failf(g, "crash by %s on %s: %v; want not found: it was deleted before the request began", kernel, r.f.name, r.err)
	case k == errdefs.KindUnavailable && strings.Contains(r.err.Error(), "backing off"):
		if redeployed && len(r.states) == 1 {
			c.failf(g, "crash by %s on %s: %v, right after a forced redeploy (version %s)", kernel, r.f.name, r.err, r.states[0].id)
		}
		c.sawBackoff(r)
	case k == errdefs.KindWorkerCrashed && errors.As(r.err, &pe) && !pe.Shared && strings.Contains(pe.Error(), sig):
		c.stats.count(ecCrashes)
		return true
	case k == errdefs.KindWorkerCrashed:
		// A death all the same, told wrong: its siblings' losses count it.
		c.failf(g, "crash by %s on %s: %v; want its own loss of its worker by %s", kernel, r.f.name, r.err, sig)
		return true
	default:
		c.failf(g, "crash by %s on %s: %v (kind %d); want its own loss of its worker by %s", kernel, r.f.name, r.err, k, sig)
	}
	return false
}

// deaths counts the crashes of tenant's worker from ecStale before s to
// e, and those during s to e.
func (c *ec) deaths(tenant string, s, e time.Time) (near, during int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, w := range c.crashes[tenant] {
		if w.begin.After(e) || !w.end.IsZero() && w.end.Before(s.Add(-ecStale)) {
			continue
		}
		near++
		if w.end.IsZero() || !w.end.Before(s) {
			during++
		}
	}
	return near, during
}

func (c *ec) crashedDuring(tenant string, s, e time.Time) bool {
	_, during := c.deaths(tenant, s, e)
	return during > 0
}

func (c *ec) ctlCtx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), 30*time.Second)
}

// deploy deploys f's variant k (force: as a new version even when it is
// the current one), f.ctl held; g is nil before the play. Unchanged
// exactly when the current version is k's bundle and force is not set.
func (c *ec) deploy(g *ecG, f *ecFn, k int, force bool) {
	var cur ecState
	if g != nil {
		cur = f.current()
	}
	i := f.begin(ecState{exists: true, k: k})
	ctx, cancel := c.ctlCtx()
	defer cancel()
	fi, err := c.e.Control().DeployAs(ctx, f.name, f.tenant, bytes.NewReader(f.bundles[k]), force)
	st := ecState{exists: true, k: k, id: fi.Version}
	defer f.end(i, st)
	c.logf(g, "deploy %s v%d (force %v): version %s, unchanged %v, %v", f.name, k, force, fi.Version, fi.Unchanged, err)
	if err != nil {
		c.failf(g, "deploy %s variant %d (force %v): %v", f.name, k, force, err)
		return
	}
	c.stats.count(ecRedeploys)
	if want := !force && cur.exists && cur.k == k; fi.Unchanged != want || fi.Unchanged && fi.Version != cur.id {
		c.failf(g, "deploy %s variant %d (force %v) over %+v: version %s, unchanged %v; want unchanged %v", f.name, k, force, cur, fi.Version, fi.Unchanged, want)
	}
	if !fi.Unchanged {
		f.versions = append(f.versions, ecVersion{fi.Version, k})
	}
}

// remove deletes f, and half the time deploys it again; a deleted one's
// delete must find nothing.
func (c *ec) remove(g *ecG, f *ecFn) {
	f.ctl.Lock()
	defer f.ctl.Unlock()
	ctx, cancel := c.ctlCtx()
	defer cancel()
	if !f.current().exists {
		err := c.e.Control().Delete(ctx, f.name, false)
		c.logf(g, "delete %s, deleted: %v", f.name, err)
		if errdefs.KindOf(err) != errdefs.KindNotFound {
			c.failf(g, "delete %s, deleted already: %v; want not found", f.name, err)
		}
		return
	}
	i := f.begin(ecState{})
	err := c.e.Control().Delete(ctx, f.name, false)
	f.end(i, ecState{})
	c.logf(g, "delete %s: %v", f.name, err)
	if err != nil {
		c.failf(g, "delete %s: %v", f.name, err)
	}
	f.versions = nil
	c.stats.count(ecDeletes)
	if g.rng != nil && g.rng.IntN(2) == 0 {
		c.deploy(g, f, g.rng.IntN(ecVariants), false)
	}
}

// rollback makes one of f's versions current; a deleted one's rollback
// must find nothing.
func (c *ec) rollback(g *ecG, f *ecFn) {
	f.ctl.Lock()
	defer f.ctl.Unlock()
	ctx, cancel := c.ctlCtx()
	defer cancel()
	if !f.current().exists || len(f.versions) == 0 {
		_, err := c.e.Control().Rollback(ctx, f.name, "00000000-0000-0000-0000-000000000000")
		c.logf(g, "rollback %s, deleted or new: %v", f.name, err)
		if errdefs.KindOf(err) != errdefs.KindNotFound {
			c.failf(g, "rollback %s to a version it never had: %v; want not found", f.name, err)
		}
		return
	}
	v := f.versions[g.rng.IntN(len(f.versions))]
	st := ecState{exists: true, k: v.k, id: v.id}
	i := f.begin(st)
	fi, err := c.e.Control().Rollback(ctx, f.name, v.id)
	f.end(i, st)
	c.logf(g, "rollback %s to %s (v%d): %s, %v", f.name, v.id, v.k, fi.Version, err)
	if err != nil || fi.Version != v.id {
		c.failf(g, "rollback %s to %s: version %q, %v", f.name, v.id, fi.Version, err)
	}
	c.stats.count(ecRollbacks)
}

// list checks a listing: each function of the play shown with a version
// it had at some moment of it (or not shown, deleted at some moment), and
// no worker process serving two tenants.
func (c *ec) list(g *ecG) {
	ctx, cancel := c.ctlCtx()
	defer cancel()
	s := time.Now()
	infos, err := c.e.Control().Functions(ctx)
	e := time.Now()
	if err != nil {
		c.failf(g, "list: %v", err)
		return
	}
	c.stats.count(ecListings)
	listed := map[string]int{}
	for i, fi := range infos {
		listed[fi.Name] = i
	}
	tenantOf, programs := map[int]string{}, map[int]int{}
	for _, f := range c.fns {
		states := f.states(s, e)
		i, ok := listed[f.name]
		if !ok {
			if !slices.ContainsFunc(states, func(st ecState) bool { return !st.exists }) {
				c.failf(g, "list: %s missing; it existed throughout (%v)", f.name, states)
			}
			continue
		}
		fi := infos[i]
		if !slices.ContainsFunc(states, func(st ecState) bool { return st.exists && (st.id == "" || st.id == fi.Version) }) {
			c.failf(g, "list: %s at version %s; it was at %v meanwhile", f.name, fi.Version, states)
		}
		for _, w := range fi.Workers {
			if t, ok := tenantOf[w.PID]; ok && t != f.tenant {
				c.failf(g, "list: worker %d runs functions of tenants %s and %s (%s among them)", w.PID, t, f.tenant, f.name)
			}
			tenantOf[w.PID] = f.tenant
			if programs[w.PID]++; programs[w.PID] == 2 {
				c.stats.count(ecSharedSeen)
			}
		}
	}
}

// canary fills g's output buffer with a pattern, and checkCanary checks
// it is still there: nothing wrote into a request's output once Invoke
// returned (a chain overrunning its deadline, say).
func (c *ec) canary(g *ecG, after string) {
	b := g.buf[:cap(g.buf)]
	for i := range b {
		b[i] = byte(0xA5 ^ i)
	}
	g.last = after
}

func (c *ec) checkCanary(g *ecG) {
	b := g.buf[:cap(g.buf)]
	for i := range b {
		if b[i] != byte(0xA5^i) {
			c.failf(g, "the output buffer of %s was written after it returned (byte %d: %#x)", g.last, i, b[i])
			c.canary(g, g.last)
			return
		}
	}
}

// end checks, the play over: every function left answers its current
// version (the hostile one redeployed if backing off); no innocent
// function was counted a crash; the listing is the model's, each tenant
// in one worker at most; and, everything deleted, no worker process and
// no more goroutines than at the start are left.
func (c *ec) end() {
	g := &ecG{id: -1, buf: make([]byte, 512)}
	c.canary(g, "end")
	for _, f := range c.fns {
		cur := f.current()
		if !cur.exists {
			continue
		}
		in := fmt.Appendf(nil, "seed %d: the last request of %s", c.seed, f.name)
		req := &call.Request{Input: in, Deadline: time.Now().Add(ecLong)}
		err := c.e.Invoke(context.Background(), f.name, req)
		if f.kind == ecHostile && errdefs.KindOf(err) == errdefs.KindUnavailable && strings.Contains(err.Error(), "backing off") {
			f.ctl.Lock()
			c.deploy(g, f, cur.k, true)
			f.ctl.Unlock()
			req = &call.Request{Input: in, Deadline: time.Now().Add(ecLong)}
			err = c.e.Invoke(context.Background(), f.name, req)
		}
		if want := f.want(in, cur.k, false); err != nil || !bytes.Equal(req.Output, want) {
			c.failf(nil, "after the play, %s (version %s, v%d): %s %q; want %q", f.name, cur.id, cur.k, brief(err, req.Output), req.Output, want)
		}
	}
	c.checkBlame()
	c.checkListing()
	for _, f := range c.fns {
		if f.current().exists {
			c.remove(g, f)
		}
	}
	if n := c.poll(func() int { return len(workerProcs(c.t)) }); n != 0 {
		c.failf(nil, "everything deleted, %d worker processes are left: %v", n, workerProcs(c.t))
	}
	if n := c.poll(func() int { return max(0, runtime.NumGoroutine()-c.goroutines-1) }); n != 0 {
		buf := make([]byte, 1<<20)
		c.failf(nil, "everything deleted, %d goroutines more than the %d at the start:\n%s", n, c.goroutines, buf[:runtime.Stack(buf, true)])
	}
	c.mu.Lock()
	late := c.maxLate
	c.mu.Unlock()
	c.logf(nil, "the latest answer came %v past its deadline", late.Round(time.Millisecond))
}

// poll waits, 10 s at most, for n() to be 0, and returns its last value.
func (c *ec) poll(n func() int) int {
	v := n()
	for end := time.Now().Add(10 * time.Second); v != 0 && time.Now().Before(end); v = n() {
		time.Sleep(10 * time.Millisecond)
	}
	return v
}

var ecDied = regexp.MustCompile(`level=ERROR msg="worker died" function=(\S+) .*`)

// checkBlame: the log's "worker died" (a death counted towards the
// function's back-off) names the hostile functions alone, or a slow one
// its server killed for a chain past its deadline's grace (its own fault).
func (c *ec) checkBlame() {
	for _, m := range ecDied.FindAllStringSubmatch(c.logs.String(), -1) {
		switch {
		case strings.Contains(m[1], "-hostile"):
		case strings.Contains(m[1], "-slow") && strings.Contains(m[0], "past its request's deadline"):
			c.stats.count(ecOverruns)
		default:
			c.failf(nil, "an innocent function was counted a crash: %s", m[0])
		}
	}
	c.stats.addN(ecCollateralLogged, int64(strings.Count(c.logs.String(), `msg="lost with its tenant's worker"`)))
}

// checkListing: the listing is the model's, and each tenant's loaded
// functions share one worker.
func (c *ec) checkListing() {
	ctx, cancel := c.ctlCtx()
	defer cancel()
	infos, err := c.e.Control().Functions(ctx)
	if err != nil {
		c.failf(nil, "list after the play: %v", err)
		return
	}
	got := map[string]string{}
	pids := map[string]map[int]bool{}
	for _, fi := range infos {
		got[fi.Name] = fi.Version
		for _, w := range fi.Workers {
			t := strings.Split(fi.Name, "-")[0]
			if pids[t] == nil {
				pids[t] = map[int]bool{}
			}
			pids[t][w.PID] = true
		}
	}
	want := map[string]string{}
	for _, f := range c.fns {
		if cur := f.current(); cur.exists {
			want[f.name] = cur.id
		}
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		c.failf(nil, "after the play, the listing's versions are %v; the model's %v", got, want)
	}
	for t, ps := range pids {
		if len(ps) > 1 {
			c.failf(nil, "after the play, tenant %s's functions run in %d workers: %v", t, len(ps), ps)
		}
	}
}

// workerProcs are the worker processes this test process started and has
// not reaped ("plover worker": argv[1] is "worker").
func workerProcs(t interface{ Fatal(...any) }) []int {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	me := strconv.Itoa(os.Getpid())
	var pids []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...: comm may hold spaces and parentheses.
		f := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:]))
		if len(f) < 2 || f[1] != me {
			continue
		}
		if argv, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline")); bytes.Contains(argv, []byte("\x00worker\x00")) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// ecStats counts what the play did, by what (the ec* names).
type ecStats struct {
	mu sync.Mutex
	n  map[string]int64
}

const (
	ecEchoes           = "answers"
	ecSurvived         = "answers across a crash"
	ecTimeouts         = "timeouts"
	ecNotFound         = "not found"
	ecCrashes          = "crashes"
	ecOwnLosses        = "the crasher's other losses"
	ecCollateral       = "collateral failures"
	ecCollateralLogged = "collateral losses logged"
	ecBackoffs         = "back-offs"
	ecRedeploys        = "deploys"
	ecDeletes          = "deletes"
	ecRollbacks        = "rollbacks"
	ecListings         = "listings"
	ecSharedSeen       = "shared workers seen"
	ecOverruns         = "overrun kills"
	ecLanded           = "landed"
	ecRelanded         = "landed in another version's worker"
)

func (s *ecStats) count(what string) { s.addN(what, 1) }

func (s *ecStats) addN(what string, n int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.n == nil {
		s.n = map[string]int64{}
	}
	s.n[what] += n
}

func (s *ecStats) get(what string) int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.n[what]
}

func (s *ecStats) add(o *ecStats) {
	o.mu.Lock()
	n := maps.Clone(o.n)
	o.mu.Unlock()
	for what, k := range n {
		s.addN(what, k)
	}
}

func (s *ecStats) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var parts []string
	for _, what := range slices.Sorted(maps.Keys(s.n)) {
		parts = append(parts, fmt.Sprintf("%s %d", what, s.n[what]))
	}
	return strings.Join(parts, "; ")
}

func (c *ec) logf(g *ecG, format string, args ...any) {
	who := "main"
	if g != nil {
		who = fmt.Sprintf("g%d op %d", g.id, g.op)
	}
	line := fmt.Sprintf("%8.3fs %s: %s", time.Since(c.start).Seconds(), who, fmt.Sprintf(format, args...))
	c.mu.Lock()
	c.trace = append(c.trace, line)
	c.mu.Unlock()
}

func (c *ec) failf(g *ecG, format string, args ...any) {
	c.logf(g, "FAIL: "+format, args...)
	c.mu.Lock()
	if c.firstFail < 0 {
		c.firstFail, c.failedAt = len(c.trace)-1, time.Now()
	}
	c.mu.Unlock()
	who := "main"
	if g != nil {
		who = fmt.Sprintf("goroutine %d op %d", g.id, g.op)
	}
	c.t.Errorf("seed %d, %s: %s", c.seed, who, fmt.Sprintf(format, args...))
}

// traceText is the trace from ecTraceKeep operations before the first
// failure to a few after it.
func (c *ec) traceText() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	end := len(c.trace)
	if c.firstFail >= 0 {
		end = min(end, c.firstFail+20)
	}
	return strings.Join(c.trace[max(0, end-ecTraceKeep-20):end], "\n")
}

// logText is the engine's log of the second before the first failure
// (ecLogKeep lines at most).
func (c *ec) logText() string {
	c.mu.Lock()
	at := c.failedAt
	c.mu.Unlock()
	var lines []string
	for _, l := range strings.Split(c.logs.String(), "\n") {
		ts, _, _ := strings.Cut(strings.TrimPrefix(l, "time="), " ")
		if t, err := time.Parse(time.RFC3339Nano, ts); err == nil && !t.Before(at.Add(-time.Second)) && !t.After(at.Add(100*time.Millisecond)) {
			lines = append(lines, l)
		}
	}
	return strings.Join(lines[max(0, len(lines)-ecLogKeep):], "\n")
}
