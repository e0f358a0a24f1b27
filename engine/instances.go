package engine

import (
	"cmp"
	"context"
	"errors"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/api"
	"github.com/plover-run/plover/call"
	"github.com/plover-run/plover/device"
	"github.com/plover-run/plover/errdefs"
	"github.com/plover-run/plover/loader"
	"github.com/plover-run/plover/sched"
)

// newInstance creates an instance of v on a healthy device whose whole
// memory could hold it, the one with the most room first (reserveOn),
// loading v's program there first if needed and evicting idle functions
// when the device's memory budget requires it.
func (e *Engine) newInstance(ctx context.Context, v *version) (*instance, call.Start, error) {
	devs, err := e.pickDevices(v)
	if err != nil {
		return nil, call.Warm, err
	}
	best, need, unreserve, err := e.reserveOn(v, devs)
	if err != nil {
		return nil, call.Warm, err
	}
	defer unreserve()
	if err := waitFree(ctx, best, func() int64 { return e.mem.pendingOn(best) }, need, v); err != nil {
		return nil, call.Warm, err
	}
	p, start, err := e.place(ctx, v, best)
	if err != nil {
		return nil, start, err
	}
	// The bundle's plover_instance_init runs here: a worker that hangs in
	// it is stopped at the request's deadline (ctx carries it).
	dl, _ := ctx.Deadline()
	t0 := time.Now()
	m := v.manifest
	inst, err := p.prog.NewInstance(device.InstanceConfig{MaxInput: m.MaxInputBytes, Tmp: m.TmpBytes, Out: m.OutBytes, Deadline: dl})
	made := time.Since(t0)
	if err != nil {
		if l, ok := device.AsLoss(err); ok {
			return nil, start, v.workerDied(p, l)
		}
		if errors.Is(err, device.ErrNotStarted) { // the program is intact
			return nil, start, errorf(errdefs.KindTimeout, err, "function %s: the request's deadline passed before its instance could be made (its worker was busy with another function's call)", v.fn.name)
		}
		if errors.Is(err, device.ErrDeadline) { // its worker was stopped
			v.pool.abandon(p)
			return nil, start, errorf(errdefs.KindTimeout, err, "function %s: the request's deadline passed while an instance was created", v.fn.name)
		}
		var ke *device.KernelError
		if errors.As(err, &ke) { // plover_instance_init failed
			v.hookFailed(err)
			return nil, start, errorf(errdefs.KindKernel, err, "function %s: creating an instance on %s: %s", v.fn.name, p.dev.Name(), err.Error())
		}
		return nil, start, unavailable(err, "function %s: cannot create an instance on %s", v.fn.name, p.dev.Name())
	}
	v.pool.added()
	return &instance{inst: inst, dev: p, bytes: inst.DeviceBytes(), made: made}, start, nil
}

// memoryBack is a device whose memory comes back some time after the
// server closes what held it (a worker process lets go of its buffers as
// it reads their end, unloads or exits): the ledger counts it free at once,
// the driver only then.
type memoryBack interface {
	// WaitFree waits until room() bytes are free as the driver counts
	// them, for as long as what is on its way back could make them, and
	// returns ctx's error if ctx ends first; room is read at each look.
	WaitFree(ctx context.Context, room func() int64) error
}

// waitFree waits, within ctx, for the memory the ledger reserved for v on
// dev (need bytes) to be free on the device itself before v allocates it:
// an eviction made room that its victims' workers may not yet have given
// back, and an allocation before that fails on a full GPU. It waits for
// room(), the bytes of the reservations on dev not yet done, this one's
// included: two loads waiting for the same returning memory would
// otherwise both go once one's part was back, and one fail. Read at each
// look, as a load that has allocated its part is done soon after, and
// leaves it.
func waitFree(ctx context.Context, dev device.Device, room func() int64, need int64, v *version) error {
	mb, ok := dev.(memoryBack)
	if !ok {
		return nil
	}
	err := mb.WaitFree(ctx, room)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, context.DeadlineExceeded):
		return errorf(errdefs.KindTimeout, err, "function %s: the request's deadline passed while %s gave back the %d bytes it needs (memory closed there is freed as its workers let go of it)", v.fn.name, dev.Name(), need)
	default:
		return errorf(errdefs.KindGone, err, "function %s: the client went away while %s gave back the %d bytes it needs", v.fn.name, dev.Name(), need)
	}
}

// pickDevices is the healthy devices of v's target whose whole memory
// could hold v, in the order to try them (rankDevices).
func (e *Engine) pickDevices(v *version) ([]device.Device, error) {
	target := v.manifest.Target
	var cands []candidate
	var lastErr error
	var tooSmall *abi.FieldError // the last device that could never hold v
	for _, d := range e.cfg.Devices {
		if d.Target() != target {
			continue
		}
		if err := d.Health(); err != nil {
			lastErr = err
			continue
		}
		mi := d.MemInfo()
		if fe := fitsDevice(v.manifest, v.constSize, d, mi.Total); fe != nil {
			tooSmall = fe
			continue
		}
		cands = append(cands, e.candidate(v, d, mi.Free))
	}
	if cands == nil && tooSmall != nil && lastErr == nil { // a faulted device might have held it: 503 below
		return nil, errorf(errdefs.KindInvalid, tooSmall, "function %s: %s", v.fn.name, tooSmall.Error())
	}
	if cands == nil && lastErr == nil {
		// A store shared by nodes of several kinds: this one cannot run it.
		return nil, errorf(errdefs.KindUnavailable, nil, "function %s is built for %q and this node has no such device (its devices run %s): send it to a node that has one", v.fn.name, target, strings.Join(quoted(e.targets), " and "))
	}
	if cands == nil {
		return nil, errorf(errdefs.KindUnavailable, lastErr, "function %s: no healthy %s device", v.fn.name, target)
	}
	return rankDevices(cands), nil
}

// candidate is a device a cold start may use, with what orders it: its
// room, free memory less what loads under way reserved there and more
// what evictions are freeing (two cold starts at once went to the same
// device, the second refused while another had room), and its rank.
type candidate struct {
	dev        device.Device
	rank, room int64
}

// candidate reads d's room and ranks it for v: 2 where v is loaded and
// its instance fits without evicting, 1 where its program and instance
// fit, 0 where either needs an eviction.
func (e *Engine) candidate(v *version, d device.Device, free int64) candidate {
	c := candidate{dev: d, room: e.mem.room(d, free)}
	switch {
	case c.room < needOn(v, d):
	case v.pool.placement(d) == nil:
		c.rank = 1
	default:
		c.rank = 2
	}
	return c
}

// rankDevices orders cands by rank, then room: by room alone an instance
// went to a device where v's program had to load again, evicting others,
// beside one where it was loaded with room for the instance.
func rankDevices(cands []candidate) []device.Device {
	slices.SortStableFunc(cands, func(a, b candidate) int {
		if c := cmp.Compare(b.rank, a.rank); c != 0 {
			return c
		}
		return cmp.Compare(b.room, a.room)
	})
	devs := make([]device.Device, len(cands))
	for i, c := range cands {
		devs[i] = c.dev
	}
	return devs
}

// needOn is the bytes an instance of v takes on d: its buffers, and its
// program's constants where v is not loaded there.
func needOn(v *version, d device.Device) int64 {
	need := instanceBytes(v.manifest)
	if v.pool.placement(d) == nil {
		need += v.constSize
	}
	return need
}

// reserveOn reserves the memory an instance of v needs (and its program's,
// where not loaded there) on the first of devs that has it, else on the
// first that can make it by evicting idle functions, and returns that
// device, the bytes reserved and the func that gives them back. A device
// refused for room is no answer while another may have it: the room
// picked by is a reading already old, and the device with the most free
// memory may have nothing idle to evict where another has. Nor is an
// eviction while another device has the room: two cold starts that read
// the same room both went to the first device, the second evicting there
// beside a device with room (helper-370's LOW). Only once every device
// refused is the request refused, with what each needed.
func (e *Engine) reserveOn(v *version, devs []device.Device) (device.Device, int64, func(), error) {
	var short []*shortage
	for _, evicting := range []bool{false, true} {
		short = short[:0]
		for _, d := range devs {
			need := needOn(v, d)
			unreserve, s := e.mem.reserve(d, need, v, evicting)
			if s == nil {
				return d, need, unreserve, nil
			}
			short = append(short, s)
		}
	}
	return nil, 0, nil, noRoom(v.fn.name, short)
}

// biller is a program that finds device time it used outside its runs
// (a host worker's CPU that no run reported) and passes it to bill, from
// now until it is closed.
type biller interface {
	Bill(bill func(time.Duration))
}

// placeTok is the token of v's program loads on dev (placeToks).
func (v *version) placeTok(dev device.Device) chan struct{} {
	v.placeMu.Lock()
	defer v.placeMu.Unlock()
	tok := v.placeToks[dev]
	if tok == nil {
		if v.placeToks == nil {
			v.placeToks = map[device.Device]chan struct{}{}
		}
		tok = make(chan struct{}, 1)
		v.placeToks[dev] = tok
	}
	return tok
}

// place makes sure v's program is loaded on dev (library, entries,
// constants), loading it once however many requests ask at the same time.
// It says Cold when it loaded the program, Warm when it was there.
func (e *Engine) place(ctx context.Context, v *version, dev device.Device) (*placement, call.Start, error) {
	tok := v.placeTok(dev)
	if err := e.takeTurn(ctx, tok, v.fn.name, "load of it on "+dev.Name(), "make an instance on "+dev.Name()); err != nil {
		if errors.Is(err, errShutDown) {
			return nil, call.Cold, err
		}
		return nil, call.Cold, errorf(errdefs.KindTimeout, err, "function %s: the request's deadline passed while another request loaded it on %s", v.fn.name, dev.Name())
	}
	defer func() { <-tok }()
	if p := v.pool.placement(dev); p != nil {
		return p, call.Warm, nil
	}
	if rf := v.refused.Load(); rf != nil {
		return nil, call.Cold, rf
	}
	// The bundle was checked when the version was prepared, maybe long
	// before this load (its worker restarted after a crash): its files are
	// checked again, a damaged copy fetched again. Loaded as it was, a
	// truncated library was refused as the bundle's fault, for good.
	if err := e.inDir(e.cfg.Cache.Dir(), "bundle cache", func() error {
		return e.cfg.Cache.Recheck(ctx, e.cfg.Store, v.rec.SHA256)
	}); err != nil {
		rf, err := e.prepareFailed(ctx, v, err)
		if rf != nil {
			v.refused.Store(rf)
		}
		return nil, call.Cold, err
	}
	t0 := time.Now()
	m := v.manifest
	budget := v.constSize + int64(v.policy.max)*instanceBytes(m)
	prog, err := dev.Load(ctx, device.ProgramSpec{Dir: v.dir, Manifest: m, MemoryBudget: budget, Output: v.fn.output(), Tenant: e.tenantOf(v)})
	if err != nil {
		var le *loader.Error
		var ke *device.KernelError
		switch {
		case errors.As(err, &le) || isManifestRefusal(err): // the library or the manifest is refused: that will not change
			err = inBundle(err, v.dir, v.manifest.Library)
			rf := errorf(errdefs.KindInvalid, err, "function %s version %s: %s", v.fn.name, v.rec.ID, err.Error())
			v.refused.Store(rf)
			return nil, call.Cold, rf
		case programLost(err):
			return nil, call.Cold, err
		case errors.As(err, &ke): // plover_load failed
			v.hookFailed(err)
			return nil, call.Cold, errorf(errdefs.KindKernel, err, "function %s: loading on %s: %s", v.fn.name, dev.Name(), err.Error())
		case errors.Is(err, device.ErrDeadline) || ctx.Err() != nil:
			return nil, call.Cold, errorf(errdefs.KindTimeout, err, "function %s: the request's deadline passed while its bundle was loading on %s", v.fn.name, dev.Name())
		}
		return nil, call.Cold, unavailable(err, "function %s: cannot load on %s", v.fn.name, dev.Name())
	}
	p := &placement{dev: dev, name: dev.Name(), prog: prog, consts: prog.ConstantsBytes(), flow: e.flow(v, dev)}
	if b, ok := prog.(biller); ok && p.flow != nil {
		b.Bill(p.flow.Bill)
	}
	// The request this load serves logs it (coldStarted), with its own
	// load time: the number its Server-Timing shows. The bundle's
	// preparation is the first load's, on whichever device.
	c := &coldLoad{programMs: ms(time.Since(t0))}
	if prep := v.prep.Swap(nil); prep != nil {
		c.fetched, c.fetchMs = prep.fetched, prep.fetchMs
	}
	p.cold.Store(c)
	v.pool.placed(p)
	if w, ok := prog.(exitWatcher); ok {
		go v.watchExit(p, w)
	}
	return p, call.Cold, nil
}

// coldStarted logs a cold start once, from the request it served (on in,
// the instance made for it). load_ms is that request's whole load time,
// the load of its Server-Timing (for a batching function, its run's: the
// requests fetched the bundle before they queued for it), in parts:
// fetch_ms (bundle from cache or store, verified, unpacked), program_ms
// (library, constants and hooks on the device, in a worker or not),
// instance_ms (its buffers and plover_instance_init) and wait_ms, the
// rest: waits for the version's and the program's locks, for device
// memory, the choice of a device. There is no total here: the request has
// not run yet; its total is its Server-Timing's.
//
// It returns the program part for the request's timing (zero for a
// program another request loaded).
func (e *Engine) coldStarted(f *function, v *version, in *instance, load time.Duration) (program time.Duration) {
	p := in.dev
	c := p.cold.Swap(nil)
	if c == nil {
		return 0 // a program another request loaded (or a pre-warm)
	}
	fetch := c.fetchMs
	if v.batch != nil {
		fetch = 0 // before the run's load, in a request's
	}
	round := func(x float64) float64 { return math.Round(x*1000) / 1000 }
	e.cfg.Log.Info("cold start", "function", f.name, "version", v.rec.ID, "sha256", v.rec.SHA256[:12], "device", p.dev.Name(),
		"fetched", c.fetched, "load_ms", round(ms(load)), "fetch_ms", round(c.fetchMs), "program_ms", round(c.programMs),
		"instance_ms", round(ms(in.made)), "wait_ms", round(max(0, ms(load)-fetch-c.programMs-ms(in.made))))
	return time.Duration(c.programMs * 1e6)
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// flow is v's function's queue in dev's scheduler (nil when runs go
// unscheduled), weighted and classed by the function's current version,
// not by v: every version of a function runs in its one flow, and a
// version a pipeline pinned loads beside the current one. A function
// dropped since its request resolved it (deleted) gets a flow of its own,
// the name's for no one after it.
func (e *Engine) flow(v *version, dev device.Device) *sched.Flow {
	s := e.scheds[dev]
	if s == nil {
		return nil
	}
	var fl *sched.Flow
	if !e.tab.kept(v.fn, func() { fl = s.Flow(v.fn.name) }) {
		fl = s.Detached()
		fl.Set(shareOf(v.rec))
	}
	return fl
}

// weighFlows sets name's device flows, those made, to rv's share and
// priority (table.weighFlows).
func (e *Engine) weighFlows(name string, rv api.Version) {
	weight, class := shareOf(rv)
	for _, s := range e.scheds {
		if fl := s.Lookup(name); fl != nil {
			fl.Set(weight, class)
		}
	}
}
