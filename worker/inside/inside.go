// Package inside is a worker process's side of the worker protocol
// (package worker/wire): `plover worker` and plover-worker contain
// themselves, open their one device, and serve one program's (a tenant's
// worker: several programs') loads, instances and runs to the server that
// started them (package worker).
package inside

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/device"
	"github.com/plover-run/plover/loader"
	"github.com/plover-run/plover/worker/contain"
	"github.com/plover-run/plover/worker/wire"
)

// Config is what a worker process is started with (flags of `plover
// worker`); everything else arrives on the control channel.
type Config struct {
	Device    string // "host" or "cuda"
	Driver    string // the CUDA driver library ("": libcuda.so.1)
	Ordinal   int
	MemLimit  int64             // device memory budget in bytes, 0: none
	Drop      *contain.Identity // run as this user; nil: keep the identity
	ParentPID int               // the server: the worker dies with it
	Landlock  bool              // restrict the filesystem to the stage and system libraries
	Checked   bool              // host device: checked mode (device.Host.EnableChecks)
	Subreaper bool              // keep what the bundle starts under the worker (contain.Subreaper)
	PIDNS     bool              // started in a PID namespace of its own (contain.PIDNamespace)
	// Tenant: a tenant's worker (worker.Options.TenantScope), which may
	// hold several programs: a fatal signal names the program whose run
	// or call took it (fatal_linux.go), which costs each run two cgo calls
	// and a goroutine locked to its thread. Unset, the worker holds one
	// program and runs exactly as before.
	Tenant bool
	// CopyPiece: a CUDA device's runs copy in and out in pieces of at
	// most this many bytes (device.CopyPiecer); 0: whole copies.
	CopyPiece int64
	// MPS: a client of an MPS control daemon (worker.Options.MPS): its
	// Landlock rules let it reach the daemon (contain.FSRules.AddMPS).
	MPS bool
}

// checker is a device with a checked mode (the host).
type checker interface{ EnableChecks(reportFD int) error }

// processCharger is a device whose runs can be charged the process's CPU
// time (the host): in a worker, the threads a chain starts are its work.
type processCharger interface{ ChargeProcessCPU() }

// Serve is a worker process's life: contain itself, open its device, say it
// is ready, then serve its program (a tenant's worker: programs) until the
// server closes the control channel (exit 0). Any broken channel ends the process: the server reads
// it as a crash and starts another.
func Serve(cfg Config) error {
	// What the bundle prints reaches the server line by line (stdio.go).
	lineBuffered()
	if err := containSelf(cfg); err != nil {
		return err
	}
	dev, err := openDevice(cfg)
	if err != nil {
		return err
	}
	// What nearly every bundle links, mapped now rather than in a cold start
	// (about 2 ms of a fresh process's first dlopen of a C++ bundle).
	loader.Preload("libstdc++.so.6", "libgcc_s.so.1", "libm.so.6")
	rehearse()
	landlocked, err := restrictFS(cfg)
	if err != nil {
		return err
	}
	w := &server{cfg: cfg, dev: dev, buf: make([]byte, wire.CtlMax), oob: make([]byte, unix.CmsgSpace(4*4)), progs: map[uint32]*loaded{}}
	msg := wire.AppendReady(nil, wire.Ready{PID: uint32(os.Getpid()), Landlocked: landlocked, Filtered: reachFiltered})
	if err := unix.Sendmsg(wire.CtlFD, msg, nil, nil, 0); err != nil {
		return fmt.Errorf("worker: ready: %w", err)
	}
	return w.serve()
}

// reachFiltered: containSelf installed the reach filter (the ready
// message says so).
var reachFiltered bool

// containSelf enters the worker's containment: the OOM killer's first
// choice, its identity, death with the server, not dumpable, default
// fatal signals.
func containSelf(cfg Config) error {
	parent := cfg.ParentPID
	if cfg.PIDNS {
		// The server is outside the worker's namespace, where getppid()
		// is 0; the namespace's init dies with the server and takes the
		// worker along, which is what the check is for.
		parent = 0
	}
	if err := contain.Enter(contain.Policy{Drop: cfg.Drop, ParentPID: parent, Subreaper: cfg.Subreaper}); err != nil {
		return fmt.Errorf("worker: contain: %w", err)
	}
	// No prlimit or setpriority on another process: a worker of the same
	// uid (or the server's) is out of its reach. After Enter: the filter
	// refuses the subreaper prctl that Enter makes.
	filtered, err := contain.RestrictReach()
	if err != nil {
		return fmt.Errorf("worker: %w", err)
	}
	reachFiltered = filtered
	// Not dumpable: another worker under the same uid cannot read this
	// one's /proc files (memory, environment).
	if err := contain.MakeNonDumpable(); err != nil {
		return fmt.Errorf("worker: %w", err)
	}
	if err := contain.DefaultFatalSignals(); err != nil {
		return fmt.Errorf("worker: signals: %w", err)
	}
	if cfg.Tenant {
		// The control loop's thread carries the program of each call (a
		// constructor that crashes, say).
		runtime.LockOSThread()
	}
	return nil
}

// openDevice opens the worker's device and sets what its runs are charged
// and how its faults are reported: checked mode's handler, and a tenant's
// handler that names the program a fatal signal came in.
func openDevice(cfg Config) (device.Device, error) {
	// Worker-side errors go to the server over the channel; the device's
	// own log lines are of no use to anyone here.
	dev, err := device.OpenOne(cfg.Device, cfg.Ordinal, cfg.MemLimit, cfg.Driver, slog.New(slog.DiscardHandler))
	if err != nil {
		return nil, fmt.Errorf("worker: open device: %w", err)
	}
	if c, ok := dev.(processCharger); ok {
		c.ChargeProcessCPU()
	}
	if c, ok := dev.(device.CopyPiecer); ok && cfg.CopyPiece > 0 {
		c.SetCopyPiece(cfg.CopyPiece)
	}
	if cfg.Tenant || cfg.Checked {
		// The fatal mark's and checked mode's report's pipe.
		if err := reportPipe(); err != nil {
			return nil, fmt.Errorf("worker: signals: %w", err)
		}
	}
	if c, ok := dev.(checker); ok && cfg.Checked {
		// After contain.DefaultFatalSignals: its handler replaces the default one.
		if err := c.EnableChecks(wire.FatalFD); err != nil {
			return nil, fmt.Errorf("worker: %w", err)
		}
	}
	if cfg.Tenant {
		// After contain.DefaultFatalSignals, whose SIG_DFL the handler restores
		// before it re-raises, and after checked mode's handler, which
		// it calls once it has named the program: a fault in checked
		// mode names its program too.
		if err := installFatalHandler(); err != nil {
			return nil, fmt.Errorf("worker: signals: %w", err)
		}
	}
	return dev, nil
}

// restrictFS applies Landlock now, while the worker waits as a standby:
// the bundle will be linked into the stage, which the rules already name,
// so a cold start does not pay for it (about 10 ms, measured). It reports
// whether the kernel applied it.
func restrictFS(cfg Config) (bool, error) {
	if !cfg.Landlock {
		return false, nil
	}
	applied, err := contain.RestrictFS(fsRules(cfg, os.Getenv("CUDA_MPS_PIPE_DIRECTORY")))
	if err != nil {
		return false, fmt.Errorf("worker: landlock: %w", err)
	}
	return applied, nil
}

// fsRules is what a worker of cfg may reach: the system's libraries and
// devices, its stage, and under MPS the daemon's pipes (in pipeDir).
func fsRules(cfg Config, pipeDir string) contain.FSRules {
	rules := contain.DefaultRules()
	rules.RODirs = append(rules.RODirs, stageDir)
	if cfg.MPS {
		rules.AddMPS(pipeDir)
	}
	return rules
}

// serve answers the server's control messages until it closes the channel.
func (w *server) serve() error {
	for {
		n, oobn, _, _, err := unix.Recvmsg(wire.CtlFD, w.buf, w.oob, unix.MSG_CMSG_CLOEXEC)
		if err != nil {
			return fmt.Errorf("worker: control channel: %w", err)
		}
		if n == 0 {
			return nil // the server is done with this worker
		}
		fds, err := rights(w.oob[:oobn])
		if err != nil {
			return fmt.Errorf("worker: control channel: %w", err)
		}
		c, err := wire.DecodeControl(w.buf[:n])
		w.marking(c.Prog, err)
		// A call that finds the device poisoned already did not poison it
		// (claimFault): read before the call, in a tenant's worker.
		healthy := w.cfg.Tenant && w.faulted() == nil
		hooking.Add(1)
		op, rep, own := w.handle(c, err, fds)
		hooking.Add(-1)
		w.marking(0, nil)
		claimed := rep.St == wire.StFault && err == nil &&
			w.claimFault(c.Prog, healthy && own) // at once, ahead of a sibling that meets the fault after
		w.out = wire.AppendControlReply(w.out[:0], op, rep)
		if err := unix.Sendmsg(wire.CtlFD, w.out, nil, nil, 0); err != nil {
			return fmt.Errorf("worker: control channel: %w", err)
		}
		if rep.St == wire.StFault {
			// The device context is poisoned (a bundle hook faulted it):
			// nothing more can run here, as after a faulting chain.
			w.exitFault(claimed)
		}
	}
}

type server struct {
	cfg      Config
	dev      device.Device
	buf, oob []byte
	out      []byte // the reply being sent

	// progs is the programs loaded, by the server's ids: one in a
	// function's worker, a tenant's several. Read by instances'
	// goroutines as they end (loaded.release).
	mu    sync.Mutex
	progs map[uint32]*loaded
}

// loaded is a program in the worker. It is closed once it is unloaded and
// its last instance is gone, whichever comes last: the server closes a
// program's instances' channels before it unloads it, but an instance
// still reading its channel's end (or one the server closes later) must
// not find its program closed under it.
type loaded struct {
	prog device.Program
	id   uint32
	refs int // 1 while loaded, plus its live instances
}

// program is the loaded program id names, or nil.
func (w *server) program(id uint32) *loaded {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.progs[id]
}

// release drops one of l's references, and closes it with the last,
// and its pool slots: no instance of it is left to run on them. In a
// tenant's worker its callers' threads are marked as l's (the control
// loop's for an unload, the instance's own): the unload hook, which runs
// with the last, names l if it crashes. It returns the close's error: a
// fault of plover_unload's own (device.OwnFault) among others.
func (w *server) release(l *loaded) error {
	w.mu.Lock()
	l.refs--
	last := l.refs == 0
	w.mu.Unlock()
	if !last {
		return nil
	}
	w.dropSlots(l.id)
	return l.prog.Close()
}

// marking tells the fatal-signal handler which program the control call
// in hand is about (0, or a message that did not decode: none), in a
// tenant's worker.
func (w *server) marking(id uint32, decodeErr error) {
	if !w.cfg.Tenant {
		return
	}
	if decodeErr != nil {
		id = 0
	}
	setProgram(id)
}

func rights(oob []byte) ([]int, error) {
	if len(oob) == 0 {
		return nil, nil
	}
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return nil, err
	}
	var fds []int
	for _, m := range msgs {
		f, err := unix.ParseUnixRights(&m)
		if err != nil {
			return nil, err
		}
		fds = append(fds, f...)
	}
	return fds, nil
}

// failed is the reply of a call the worker could not make, saying why.
func failed(text string) wire.Reply { return wire.Reply{St: wire.StFailed, Text: text} }

// statusReply is the reply of a call that ended in err (nil: done).
func statusReply(err error) wire.Reply {
	st, msg := wire.StatusOf(err)
	return wire.Reply{St: st, Text: msg}
}

// handle makes the call one control message asks for and returns the
// reply, with the operation it answers (0 for a message it could not
// read): the reply's shape is the operation's; and whether a fault it
// replies was met by the program's own hook once it ran (claimFault), not
// by the calls around it, which meet another's fault as readily.
func (w *server) handle(c wire.Control, err error, fds []int) (byte, wire.Reply, bool) {
	closeAll := func() {
		for _, fd := range fds {
			unix.Close(fd)
		}
	}
	var l *loaded
	if err == nil && c.Op != wire.OpLoad {
		l = w.program(c.Prog)
	}
	switch c.Op {
	case wire.OpLoad:
		closeAll()
		if err != nil {
			return c.Op, failed("load: want a program id, a file name prefix and a manifest"), false
		}
		rep, own := w.load(c)
		return c.Op, rep, own
	case wire.OpUnload:
		closeAll()
		rep, own := w.unload(c.Prog, err)
		return c.Op, rep, own
	case wire.OpEntry:
		closeAll()
		if l == nil {
			return c.Op, failed(fmt.Sprintf("entry: no program %d", c.Prog)), false
		}
		i, err := l.prog.Entry(c.Kernel)
		rep := statusReply(err)
		rep.Index = i
		return c.Op, rep, false
	case wire.OpSlot:
		if len(fds) != 1 || err != nil || l == nil {
			closeAll()
			return c.Op, failed("slot: want a loaded program's id, a size and a memfd"), false
		}
		return c.Op, w.addSlot(c.Prog, c.Size, fds[0]), false
	case wire.OpDropSlot:
		closeAll()
		if err != nil || l == nil {
			return c.Op, failed("drop slot: want a loaded program's id and a slot's"), false
		}
		return c.Op, w.dropSlot(c.Prog, c.Slot), false
	case wire.OpNewInstance:
		if len(fds) != 2 || err != nil || l == nil {
			closeAll()
			return c.Op, failed("new instance: want a loaded program's id, sizes, a memfd and a socket"), false
		}
		rep, own := w.newInstance(l, c.MaxIn, c.Tmp, c.Out, fds[0], fds[1])
		return c.Op, rep, own
	}
	closeAll()
	return c.Op, failed(err.Error()), false // empty, or an unknown operation
}

// unload closes program id once its instances are gone (loaded); an id
// not loaded is refused. It says, as load does, whether a fault it
// replies was its plover_unload's own.
func (w *server) unload(id uint32, err error) (wire.Reply, bool) {
	if err != nil {
		return failed("unload: want a program id"), false
	}
	w.mu.Lock()
	l := w.progs[id]
	delete(w.progs, id)
	w.mu.Unlock()
	if l == nil {
		return failed(fmt.Sprintf("unload: no program %d", id)), false
	}
	closed := w.release(l)
	if err := w.faulted(); err != nil {
		return statusReply(err), device.OwnFault(closed) // StFault: the worker ends once it replied
	}
	return wire.Reply{St: wire.StOK}, false
}

// faulted is the device's fault once a hook whose failure no one is told
// of (an instance's plover_instance_fini, a program's plover_unload)
// poisoned its context, else nil.
func (w *server) faulted() error {
	if err := w.dev.Health(); errors.Is(err, device.ErrUnhealthy) {
		return err
	}
	return nil
}

// stageDir names the stage through the worker's descriptor, so the worker
// needs no right to the path it has on the server's side.
var stageDir = "/proc/self/fd/" + strconv.Itoa(wire.StageFD)

// load loads the bundle the server linked into the stage, its files' names
// led by c.Prefix (a tenant's worker holds many bundles' files side by
// side: no directory each, whose inode costs the server a mkdir at every
// load): the library's constructors run here, inside the restrictions. An
// id in use, or a second program in a function's worker, is refused.
func (w *server) load(c wire.Control) (wire.Reply, bool) {
	w.mu.Lock()
	_, taken := w.progs[c.Prog]
	n := len(w.progs)
	w.mu.Unlock()
	switch {
	case taken:
		return failed(fmt.Sprintf("load: program %d is loaded already", c.Prog)), false
	case n > 0 && !w.cfg.Tenant:
		return failed("load: once per worker"), false
	}
	var m abi.Manifest
	if err := json.Unmarshal(c.Manifest, &m); err != nil {
		return failed("load: manifest: " + err.Error()), false
	}
	// What a failed load says names the bundle's files as its author
	// wrote them, not where the stage keeps them.
	names := []string{stageDir + "/" + c.Prefix, ""}
	for _, f := range []*string{&m.Library, &m.Constants} {
		if *f != "" && c.Prefix != "" {
			names = append(names, c.Prefix+*f, *f)
			*f = c.Prefix + *f
		}
	}
	if w.cfg.Tenant && m.Library != "" && loader.Resident(stageDir+"/"+m.Library) {
		return wire.Reply{St: wire.StMapped, Text: "load: the library's file is mapped in this worker already: stage a copy"}, false
	}
	prog, err := w.dev.Load(context.Background(), device.ProgramSpec{Dir: stageDir, Manifest: &m})
	if err != nil {
		rep := statusReply(err)
		rep.Text = strings.NewReplacer(names...).Replace(rep.Text)
		return rep, device.OwnFault(err)
	}
	w.mu.Lock()
	w.progs[c.Prog] = &loaded{prog: prog, id: c.Prog, refs: 1}
	w.mu.Unlock()
	return wire.Reply{St: wire.StOK}, false
}

func (w *server) newInstance(l *loaded, maxIn, tmp, out int64, memfd, sock int) (wire.Reply, bool) {
	fail := func(err error) (wire.Reply, bool) {
		unix.Close(memfd)
		unix.Close(sock)
		return statusReply(err), false
	}
	if maxIn < 0 || tmp < 0 || out < 0 || maxIn+out <= 0 {
		return fail(fmt.Errorf("new instance: sizes %d/%d/%d", maxIn, tmp, out))
	}
	slot, err := unix.Mmap(memfd, 0, int(device.SlotSize(maxIn, out)), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return fail(fmt.Errorf("new instance: map the slot: %w", err))
	}
	unix.Close(memfd) // the mapping keeps the memory
	inst, err := l.prog.NewInstance(device.InstanceConfig{MaxInput: maxIn, Tmp: tmp, Out: out, Host: slot})
	if err != nil {
		unix.Munmap(slot)
		unix.Close(sock)
		return statusReply(err), device.OwnFault(err) // its plover_instance_init's
	}
	own := poolMem{mem: slot}
	var pin wire.Pin // PinNone
	if _, ok := w.dev.(device.HostRegistrar); ok {
		// The device pinned the slot when it made the instance, or
		// staged the instance's copies in buffers of its own: a run on
		// the slot is then not in place.
		pin = pinOf(instancePin(inst))
	}
	own.inPlace = pin.State != wire.PinRefused
	w.mu.Lock()
	l.refs++ // the control loop alone unloads: l is still loaded
	w.mu.Unlock()
	go func() {
		if w.cfg.Tenant {
			// The fatal-signal handler learns whose run, fini or
			// unload hook took a signal from the thread, marked for
			// the instance's life and its release: that may be the
			// program's last reference.
			defer marked(l.id)()
		}
		healthy, fini := w.serveInstance(l.id, sock, own, inst, maxIn, out)
		unload := w.release(l)
		// Closed once its program is let go of, and closed too where this
		// was its last reference: the server counts the program's memory
		// back as it sees this end, the instance's at Freed
		// (worker/release.go).
		unix.Close(sock)
		hooking.Add(-1) // counted once the channel closed (serveInstance)
		if w.faulted() != nil {
			// Nothing more can run here, as after a faulting chain; kept,
			// the worker would fail its siblings' next requests as theirs.
			// l's plover_instance_fini (or, its last reference gone, its
			// plover_unload) faulted it if it was healthy before and the
			// hook met the fault once it ran; the frees around the hooks
			// may meet another's first.
			w.exitFault(w.claimFault(l.id, healthy && (device.OwnFault(fini) || device.OwnFault(unload))))
		}
	}()
	return wire.Reply{St: wire.StOK, Pin: pin}, false
}

// instancePin is whether inst's device pinned its slot.
func instancePin(inst device.Instance) error {
	p, ok := inst.(device.HostPinner)
	if !ok {
		return nil
	}
	pinned, err := p.HostPinned()
	if err == nil && !pinned {
		err = errors.New("the device did not pin it")
	}
	return err
}

// pinOf is a device's pin (err: RegisterHost's or instancePin's) as the
// worker tells it: done, or refused saying why.
func pinOf(err error) wire.Pin {
	if err != nil {
		return wire.Pin{State: wire.PinRefused, Why: err.Error()}
	}
	return wire.Pin{State: wire.PinDone}
}

// serveInstance answers run messages on one instance's channel until the
// server closes it. A channel that breaks otherwise (the bundle closed it,
// say) ends the worker. Not locked to an OS thread: a run is one cgo call
// that makes its device context current itself, and a locked thread cost
// two scheduler hand-offs per request (measured with perf). Except in a
// tenant's worker, whose caller locks it to a thread marked as the
// program's (marked) for the instance's life. id is the instance's
// program's, named should one of its runs fault the device (claimFault).
// It returns once the server closed the channel, the instance closed
// (its plover_instance_fini run), saying whether the device was healthy
// before that close, and the fault the fini met once it ran, if any
// (device.CloseFault): a fault found after it is then the fini's.
func (w *server) serveInstance(id uint32, sock int, own poolMem, inst device.Instance, maxIn, out int64) (healthy bool, fini error) {
	msg := make([]byte, wire.RunMsgMax+1)
	rep := make([]byte, wire.ReplyMax)
	steps := make([]device.Step, abi.MaxChainLength)
	var r device.Run
	var gap wire.WaitEstimate // from a reply to the next request (worker/wire/poll.go)
	var replied time.Time
	alone := false // the last request came while the device ran nothing else
	for {
		var n int
		var err error = unix.EAGAIN
		// Polled for only while the server's device was otherwise idle at
		// the last request and none of this worker's other instances runs.
		if busy := running.Load(); busy == 0 && alone && !replied.IsZero() {
			if b := gap.Budget(); b > 0 {
				n, err = wire.PollRecv(sock, msg, b, &running, 0)
			}
		}
		if err == unix.EAGAIN {
			n, err = unix.Read(sock, msg)
		}
		got := wire.Mono() // the server's hand-off ends here (its reply says so)
		if !replied.IsZero() {
			gap.Observe(time.Since(replied))
		}
		if n == 0 && err == nil {
			healthy = w.faulted() == nil
			hooking.Add(1) // until the program's release, if the close is its last
			fini = device.CloseFault(inst)
			unix.Munmap(own.mem)
			// Not waited for: a server that went has nobody to tell.
			unix.Sendto(sock, []byte{wire.Freed}, unix.MSG_NOSIGNAL|unix.MSG_DONTWAIT, nil)
			return healthy, fini // the caller closes sock
		}
		if err != nil {
			os.Exit(wire.ExitChannel)
		}
		var st byte
		var text string
		claimed := false
		running.Add(1)
		alone = wire.SentAlone(msg[:n])
		r.Timing, r.OutLen = device.Timing{}, 0
		if mem, ok := slotOf(wire.RunSlot(msg[:n]), own); !ok {
			st, text = wire.StBadRunMsg, fmt.Sprintf("run names slot %d, which this worker does not have", wire.RunSlot(msg[:n]))
		} else if err := wire.DecodeRun(msg[:n], &r, steps, mem.mem, maxIn, out); err != nil {
			st, text = wire.StBadRunMsg, err.Error()
		} else {
			// The slot is this run's alone until the reply: the device
			// works on it where it is, if it can.
			r.InPlace = mem.inPlace
			err := inst.Run(&r)
			if st, text = wire.StatusOf(err); st == wire.StFault {
				claimed = w.claimFault(id, device.OwnFault(err)) // at once, ahead of a sibling that meets the fault after
			}
		}
		running.Add(-1)
		rep = wire.EncodeReply(rep, st, &r, wire.RunSeq(msg[:n]), got, wire.Mono(), text)
		if _, err := unix.Write(sock, rep); err != nil {
			os.Exit(wire.ExitChannel)
		}
		replied = time.Now()
		if st == wire.StFault {
			// The context is poisoned for good: nothing more can run here.
			w.exitFault(claimed)
		}
	}
}

// running is the instances of this worker running a chain (worker/wire/poll.go).
var running atomic.Int32

// hooking is the control calls and instance closes in progress, in which a
// bundle's hooks run (a fault claim waits for them: awaitClaim).
var hooking atomic.Int32

// rehearse runs the code a load runs (manifest decoding, the ELF checks)
// on harmless input while the worker is a standby, so that a cold start
// does not pay for a fresh process touching that code for the first time.
func rehearse() {
	var m abi.Manifest
	json.Unmarshal([]byte(`{"name":"rehearsal","abi":2,"target":"host","library":"r.so","max_input_bytes":1,"out_bytes":1,"chain":[{"kernel":"k","grid":1,"block":1}]}`), &m)
	m.Validate()
	for _, dir := range []string{"/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib"} {
		if _, err := loader.Inspect(filepath.Join(dir, "libm.so.6")); err == nil || !errors.Is(err, fs.ErrNotExist) {
			return
		}
	}
}

// RunIfWorker runs the worker and exits when this process was started as
// one ("EXE worker FLAGS"), and returns otherwise: the first line of main in
// plover-worker and in test binaries that stand in for it.
func RunIfWorker() {
	if len(os.Args) < 2 || os.Args[1] != "worker" {
		return
	}
	if err := Main(os.Args[2:]); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	os.Exit(0)
}

// Main is a worker process's main after "worker" in its argv: the flags
// the server's spawn writes, then Serve. plover worker, plover-worker and
// test binaries that stand in for them all run it.
func Main(args []string) error {
	var cfg Config
	fs := flag.NewFlagSet("worker", flag.ContinueOnError)
	resolve := BindFlags(fs, &cfg)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if err := resolve(); err != nil {
		return err
	}
	return Serve(cfg)
}

// BindFlags registers the flags a worker process is started with (the
// server's spawn writes them) on fs, into cfg. Once fs is parsed, resolve
// turns --user into cfg.Drop.
func BindFlags(fs *flag.FlagSet, cfg *Config) (resolve func() error) {
	var user string
	fs.StringVar(&cfg.Device, "device", "host", "host | cuda")
	fs.IntVar(&cfg.Ordinal, "ordinal", 0, "CUDA device ordinal")
	fs.StringVar(&cfg.Driver, "driver", "", "CUDA driver library (default libcuda.so.1)")
	fs.Int64Var(&cfg.MemLimit, "memory-limit", 0, "device memory budget in bytes")
	fs.IntVar(&cfg.ParentPID, "parent", 0, "the server's pid")
	fs.StringVar(&user, "user", "", "run as UID:GID")
	fs.BoolVar(&cfg.Landlock, "landlock", false, "restrict the filesystem to the stage and system libraries")
	fs.BoolVar(&cfg.MPS, "mps", false, "CUDA: a client of an MPS control daemon, whose pipes its Landlock rules let it reach")
	fs.BoolVar(&cfg.Checked, "checked", false, "host device: catch accesses past in, tmp and out (checked mode)")
	fs.BoolVar(&cfg.Tenant, "tenant", false, "a tenant's worker: holds several programs, and a fatal signal names the program it took")
	fs.BoolVar(&cfg.PIDNS, "pid-namespace", false, "started in a PID namespace of its own (its /proc is mounted before Go starts: package contain)")
	fs.Int64Var(&cfg.CopyPiece, "copy-piece", 0, "CUDA: issue each run's copies between host and device in pieces of at most this many bytes (0: whole)")
	fs.BoolVar(&cfg.Subreaper, "subreaper", false, "keep what the bundle starts under this process (a child subreaper), for the server to end")
	// Only read in /proc/PID/cmdline: a later server ends what this one
	// left by it (contain.EndLeftovers).
	fs.String("server-tag", "", "names the server that started this worker")
	return func() error {
		if user == "" {
			return nil
		}
		id, err := contain.LookupUser(user)
		if err != nil {
			return err
		}
		cfg.Drop = &id
		return nil
	}
}
