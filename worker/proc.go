package worker

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/device"
	"github.com/plover-run/plover/fileutil"
	"github.com/plover-run/plover/worker/contain"
	"github.com/plover-run/plover/worker/wire"
)

// proc is one worker process: its control channel, its reaping, and the
// reason it ended.
type proc struct {
	d        *Device
	pid      int
	tree     *contain.Tree // ends what it starts (Kill with it, Release once reaped)
	ctl      *net.UnixConn
	ctlTok   chan struct{} // one control call at a time
	buf      []byte
	done     chan struct{} // closed once the process is reaped; reason is set
	reason   string
	killed   atomic.Pointer[string] // why the server stopped it
	unreaped atomic.Bool            // end gave up waiting for its reap (said once)
	ret      returning              // its device memory on its way back (release.go)
	memLimit atomic.Int64           // resident bytes it may hold; 0: none
	// reported is set once it runs a program: from then on the watch
	// loop samples its figures into sample (nil until the first), which
	// Process reports; asked is set by Process, cleared by the loop when
	// it takes the next sample.
	reported, asked atomic.Bool
	sample          atomic.Pointer[sample]
	said            chan string   // its first line on stderr (then closed)
	heard           chan struct{} // closed once its stdout and stderr are read to the end
	// out is where its output goes once Load gave it a function's program
	// (ProgramSpec.Output); before, a standby's own start-up messages, the
	// first few of which go to the server log. It stays once its program
	// closed: the lines read after the kill were printed before it.
	out      atomic.Pointer[output]
	startOut atomic.Int32 // lines written before it had a function
	// lines bounds the lines of its output the server passes on, both
	// streams together (output.go).
	lines lineBudget
	// fault is checked mode's report of the access that killed it, the
	// last its fault handler wrote on its report pipe (marks, read by
	// readMark once it died), told with its exit: never a line of its
	// stderr, where a bundle can echo its clients' bytes and, in a
	// tenant's worker, a sibling's lines go.
	fault string
	// faulted is fault's report, once the process died of the fault:
	// told by the losses of the program at fault alone (ProcessExit.Fault).
	faulted string
	// runs is the chains in flight on it; a run that sees the process die
	// counts until the process is reaped, so that wait can say what the
	// worker was doing (during).
	runs atomic.Int32
	// cpu is its CPU that its runs reported, and what was billed beside
	// them (cpucharge.go).
	cpu cpuTally
	// slots is the server's slots it maps, and those it pinned (pin.go).
	slots slotMem
	// tenant is set on every worker of a device in tenant scope, from its
	// start: its tenant once given one, its programs and their ids
	// (tenant.go).
	tenant *tenancy
	// killedBy is the program whose run or call the server killed the
	// process for (past its deadline, a message it should not have sent).
	killedBy atomic.Pointer[program]
	// killedHeld: killedBy was one of a tenant's worker's programs when
	// the kill was made (a run's, a load's), not one let go of (an
	// unload's call); under mu. Read by blame, which may run after a
	// failed load let its program go.
	killedHeld bool
	// fatal is the program a tenant's worker named as it died of a fatal
	// signal (wire.FatalMark), 0: none; read from marks, the server's end
	// of its wire.FatalFD, once it died.
	fatal atomic.Uint32
	marks *os.File

	// exited is set, under mu, once the process has exited and its pid
	// may be reused: no signal may be sent to it after that.
	mu     sync.Mutex
	exited bool
	// ctlBusy: a control call is on the channel; ctlGone: the process was
	// reaped. Whichever of the two ends last closes ctl, so that a call
	// reads a reply the worker sent just before it exited (a fault's)
	// instead of a channel closed under it.
	ctlBusy, ctlGone bool
	// cgroup is its CPU group (CPUGroups.Place), and pids its pids group
	// (PidGroups.Place), removed once it is reaped.
	cgroup *Group
	pids   *ownGroup
	// mem is its memory group (MemGroups.Place; nil: none), set before it
	// runs bundle code, and closed once it exited (closeMemGroup).
	mem   atomic.Pointer[MemGroup]
	stage string // removed when the process is gone, once stagers are done
	// stagers counts the loads putting files in stage (inStage).
	stagers sync.WaitGroup
	// gone is exited, read without mu (placeTenant, under the device's):
	// a process that exited takes no new program, reaped or not.
	gone atomic.Bool
	// calling is what the control call on the channel does (ctlBusy),
	// and for which program (nil: none).
	calling     string
	callingProg *program
	// during is what it was doing when it ended ("running the chain",
	// a control call's, "idle"): set before done is closed.
	during string
}

// spawn starts a worker, in a CPU group of weight w (0: the smallest, for a
// standby: its start does not slow the cold starts in flight); env is
// added to its (otherwise empty) environment.
func (d *Device) spawn(ctx context.Context, w float64, env ...string) (*proc, error) {
	ctl, theirs, err := controlChannel()
	if err != nil {
		return nil, err
	}
	defer theirs.Close()
	stageDir, stageF, err := d.newStage()
	if err != nil {
		ctl.Close()
		return nil, err
	}
	defer stageF.Close()
	// A panic from here on (a device's Go code; a load's is recovered by
	// its request's transport) releases what the start made, the started
	// worker (its reaping removes its stage) or the channel and the stage,
	// then goes on: they would leak, with no one left to end them.
	var p *proc
	settled := false
	defer func() {
		switch {
		case settled:
		case p != nil:
			p.kill("its start panicked")
		default:
			ctl.Close()
			os.RemoveAll(stageDir)
		}
	}()
	if p, err = d.start(d.workerCommand(theirs, stageF, env), ctl, stageDir); err != nil {
		settled = true // start released them
		return nil, err
	}
	p.placeCgroups(w)
	err = p.awaitReady(ctx)
	settled = true
	if err != nil {
		return nil, err
	}
	return p, nil
}

// controlChannel is a worker's control channel: the server's end, and the
// worker's (its wire.CtlFD), which the server closes once the worker has
// it.
func controlChannel() (*net.UnixConn, *os.File, error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("start worker: socketpair: %w", err)
	}
	theirs := os.NewFile(uintptr(fds[1]), "worker-control")
	ours := os.NewFile(uintptr(fds[0]), "worker-control")
	fc, err := net.FileConn(ours)
	ours.Close()
	if err != nil {
		theirs.Close()
		return nil, nil, fmt.Errorf("start worker: %w", err)
	}
	return fc.(*net.UnixConn), theirs, nil
}

// newStage makes a worker's stage, the directory the server puts its
// bundle's files in, and opens it for the worker (its wire.StageFD). The
// stages' directory is made again where it was removed under the server
// (fileutil.MakeAgain): before, no worker started until a restart.
func (d *Device) newStage() (string, *os.File, error) {
	var dir string
	err := fileutil.InDir(d.opts.StageDir, d.opts.Log, "workers' stage", func() (err error) {
		dir, err = os.MkdirTemp(d.opts.StageDir, "worker-*")
		return err
	})
	if err == nil {
		err = os.Chmod(dir, 0o755) // readable by --worker-user
	}
	var f *os.File
	if err == nil {
		f, err = os.Open(dir)
	}
	if err != nil {
		os.RemoveAll(dir)
		return "", nil, fmt.Errorf("start worker: stage: %w", err)
	}
	return dir, f, nil
}

// workerCommand is the worker's command line (inside.BindFlags reads it),
// its environment and its descriptors: the control channel's end and the
// stage.
func (d *Device) workerCommand(ctl, stage *os.File, env []string) *exec.Cmd {
	args := []string{"worker", "--device", d.Target(), "--ordinal", strconv.Itoa(d.opts.Ordinal),
		"--memory-limit", strconv.FormatInt(d.opts.MemLimit, 10), "--parent", strconv.Itoa(os.Getpid())}
	args = append(args, d.opts.Spawner.WorkerArgs()...)
	if d.opts.Drop != nil {
		args = append(args, "--user", d.opts.Drop.String())
	}
	if d.opts.Driver != "" {
		args = append(args, "--driver", d.opts.Driver)
	}
	if d.opts.Landlock {
		args = append(args, "--landlock")
	}
	if d.opts.Checked {
		args = append(args, "--checked")
	}
	if d.opts.MPS {
		args = append(args, "--mps")
	}
	if d.opts.CopyPiece > 0 {
		args = append(args, "--copy-piece", strconv.FormatInt(d.opts.CopyPiece, 10))
	}
	if d.tenantScope() {
		args = append(args, "--tenant")
	}
	cmd := exec.Command(d.opts.Exe, args...)
	// Nothing of the server's environment: no credentials, no settings.
	cmd.Env = append(append(append([]string{"PATH=/usr/local/bin:/usr/bin:/bin"}, deviceSelection()...), d.opts.env...), env...)
	cmd.ExtraFiles = []*os.File{ctl, stage} // fds 3 and 4: wire.CtlFD, wire.StageFD
	return cmd
}

// start starts cmd, the worker on the server's end ctl of its control
// channel, with its output read and its exit waited for (wait). It fails
// for a device that is closed; failing, it closes ctl and removes the
// stage.
func (d *Device) start(cmd *exec.Cmd, ctl *net.UnixConn, stageDir string) (*proc, error) {
	fail := func(err error) (*proc, error) {
		ctl.Close()
		os.RemoveAll(stageDir)
		return nil, fmt.Errorf("start worker: %w", err)
	}
	// The base device's Go code before the process exists: a panic in it
	// past the start would leave the process unreaped.
	billsCPU := d.billsCPU()
	pr, pw, err := outputPipes(cmd)
	if err != nil {
		return fail(err)
	}
	// Go opens its descriptors close-on-exec, C code (a driver) may not:
	// mark them all, so a worker inherits nothing but its ExtraFiles.
	if err := unix.CloseRange(3, ^uint(0), unix.CLOSE_RANGE_CLOEXEC); err != nil {
		d.opts.Log.Warn("cannot mark descriptors close-on-exec; a worker may inherit some", "error", err)
	}
	var marks, markW *os.File
	if d.tenantScope() || d.opts.Checked { // the fatal mark's, checked mode's report's
		if marks, markW, err = os.Pipe(); err != nil {
			closeAll(pr[:]...)
			closeAll(pw[:]...)
			return fail(err)
		}
		cmd.ExtraFiles = append(cmd.ExtraFiles, markW) // wire.FatalFD
	}
	tree, err := d.opts.Spawner.Start(cmd)
	closeAll(append(pw[:], markW)...)
	if err != nil {
		closeAll(append(pr[:], marks)...)
		return fail(err)
	}
	p := &proc{d: d, pid: cmd.Process.Pid, tree: tree, ctl: ctl, ctlTok: make(chan struct{}, 1), buf: make([]byte, wire.ReplyMax),
		done: make(chan struct{}), said: make(chan string, 1), heard: make(chan struct{}), stage: stageDir, marks: marks}
	p.cpu.on = billsCPU
	if d.tenantScope() {
		p.tenant = &tenancy{progs: map[uint32]*program{}, tasksFor: 1, wake: make(chan struct{}, 1), window: weighWindow}
		if d.opts.CPU != nil {
			go p.weighLoop()
		}
	}
	d.mu.Lock()
	closed := d.closed
	d.procs[p] = struct{}{}
	d.mu.Unlock()
	var reading sync.WaitGroup
	for i, stream := range []string{"stdout", "stderr"} {
		reading.Go(func() { p.readOutput(pr[i], stream) })
	}
	go func() { reading.Wait(); close(p.heard) }()
	go p.wait(cmd)
	if closed {
		p.kill("the server is stopping")
		return nil, fmt.Errorf("%s: %w: closed", d.Name(), device.ErrUnhealthy)
	}
	return p, nil
}

// awaitReady waits for the worker's ready message, within ctx's deadline
// (30 s without one): it contained itself and opened its device. A worker
// of another protocol is refused; one that ended first is a start failure
// (startFailure), which the device counts.
func (p *proc) awaitReady(ctx context.Context) error {
	d := p.d
	if dl, ok := ctx.Deadline(); ok {
		p.ctl.SetReadDeadline(dl)
	} else {
		p.ctl.SetReadDeadline(time.Now().Add(30 * time.Second))
	}
	n, err := p.ctl.Read(p.buf)
	p.ctl.SetReadDeadline(time.Time{})
	var ready wire.Ready
	if err == nil {
		ready, err = wire.DecodeReady(p.buf[:n])
	}
	if other := (*wire.VersionError)(nil); errors.As(err, &other) {
		p.kill("it speaks another protocol")
		return fmt.Errorf("start worker: %s speaks worker protocol %s, this server %d: install plover and plover-worker from one build", d.opts.Exe, other.Theirs(), wire.Protocol)
	}
	if err != nil {
		if errors.Is(err, os.ErrDeadlineExceeded) {
			p.kill("it did not start in time")
			return fmt.Errorf("start worker: %w", device.ErrDeadline)
		}
		err := p.startFailure()
		d.lastStartErr.Store(err.Error())
		d.lastStartFail.Store(monoNow())
		d.startFailures.Add(1)
		return err
	}
	d.startFailures.Store(0)
	if d.opts.Landlock && !ready.Landlocked && d.landlockLogged.CompareAndSwap(false, true) {
		// The server is non-dumpable (contain.MakeNonDumpable), but in a
		// container its PID 1 (tini in the image) holds the same
		// environment and is not: Landlock's ptrace rule is what keeps a
		// worker out of its /proc/1/environ, store credentials and all.
		d.opts.Log.Warn("this kernel has no Landlock: workers can read and write whatever their uid can (the bundle cache, the data directory, and where they have the server's uid the cgroups it made for them: their own pids and memory limits, and which group they are in), read the environment of any dumpable process of their uid outside a PID namespace (a container's PID 1, such as the image's tini, holds the server's: store credentials given as AWS_* variables are theirs to read), and signal processes of their uid; use a kernel with Landlock, or run the server as root so that workers get a uid of their own (--worker-user)")
	}
	if !ready.Filtered && d.filterLogged.CompareAndSwap(false, true) {
		// The filter is what refuses a worker every socket family but
		// Unix's and netlink; without it Landlock refuses TCP at best
		// (from its ABI 4), and UDP never.
		network := "reach the network by UDP and TCP (Landlock refuses TCP only from its ABI 4, Linux 6.7): a bundle can call the node's services and a cloud instance's metadata service (169.254.169.254) for its credentials"
		if d.opts.Landlock && ready.Landlocked && landlockABI() >= landlockRefusesTCP {
			network = "reach the network by UDP (Landlock refuses them TCP, not UDP): a bundle can call the node's UDP services and send anywhere"
		}
		d.opts.Log.Warn("this kernel has no seccomp filters: workers can "+network+"; without PID namespaces a worker can change the resource limits, nice level, scheduling policy, CPUs and I/O priority of another process of its uid (another worker's, the server's threads' when they share it), and with subreapers move what it starts out of its worker's tree (clone with CLONE_PARENT, a cleared subreaper flag), where its CPU is not billed", "landlock_abi", landlockABI())
	}
	if d.opts.Landlock && ready.Landlocked && landlockABI() < landlockScopesSignals && d.landlockLogged.CompareAndSwap(false, true) {
		d.opts.Log.Warn("this kernel's Landlock does not scope signals (that needs its ABI 6, Linux 6.12): workers, which share one uid (--worker-user), can signal one another, another tenant's included", "landlock_abi", landlockABI())
	}
	return nil
}

// landlockABI is the kernel's Landlock ABI (a variable for tests),
// landlockRefusesTCP the first that refuses a worker TCP bind and connect,
// and landlockScopesSignals the first that keeps a worker from signalling
// processes outside its domain.
var landlockABI = contain.LandlockABI

const (
	landlockRefusesTCP    = 4
	landlockScopesSignals = 6
)

// startFailure is the error of a worker that ended before it was ready,
// with what it said about why (a device it could not open, say): an
// operator reads it in the request's error and in /healthz, not only in
// the server's log.
func (p *proc) startFailure() error {
	err := p.lost("starting")
	select {
	case line, ok := <-p.said:
		if pe, isExit := err.(*ProcessExit); ok && isExit && line != "" {
			pe.Reason += " (it said: " + line + ")"
		}
	case <-time.After(200 * time.Millisecond): // it said nothing
	}
	return err
}

func closeAll(fs ...*os.File) {
	for _, f := range fs {
		f.Close()
	}
}

func (p *proc) wait(cmd *exec.Cmd) {
	// Wait for the exit without reaping, so the pid (and group id) cannot
	// be reused while kill may still signal it; then kill what it forked.
	var info unix.Siginfo
	for {
		if err := unix.Waitid(unix.P_PID, p.pid, &info, unix.WEXITED|unix.WNOWAIT, nil); err != unix.EINTR {
			break
		}
	}
	p.look(true) // before exited: its clock reads until the reap
	p.mu.Lock()
	contain.KillGroup(p.pid)
	p.exited = true
	p.allBack() // its memory went with its exit
	p.cgroup.Exited()
	p.gone.Store(true)
	// What it was doing: a run or a call that saw it die still counts
	// (they wait for done before they end).
	p.during = "idle"
	switch {
	case p.runs.Load() > 0:
		p.during = "running the chain"
	case p.ctlBusy:
		p.during = p.calling
	}
	cg, pg := p.cgroup, p.pids
	p.mu.Unlock()
	// What it started ends with it, a daemon that left its group and
	// session included, before the reap frees its pid (Tree.End): all
	// of it at once through its cgroups where it has them, and through
	// its tree (contain.Containment), which also reaps it.
	mg := p.mem.Load()
	for _, err := range []error{cg.Empty(), pg.Empty(), mg.Empty()} {
		if err != nil {
			p.d.opts.Log.Warn("a dead worker's processes", "pid", p.pid, "error", err)
		}
	}
	p.closeMemGroup()
	// Its groups go before the reap frees its pid (a zombie keeps no
	// group populated, v1's included): a new worker of that pid must
	// never meet them, nor have them removed under it.
	p.mu.Lock()
	p.cgroup, p.pids = nil, nil
	p.mu.Unlock()
	cg.Remove()
	pg.Remove()
	mg.Remove()
	p.tree.End()
	err := cmd.Wait()
	p.tree.Release()
	p.readMark()
	// Its last lines (a crash's message) are passed on before it is
	// reported gone; not for long: a child it forked may hold the pipes.
	select {
	case <-p.heard:
	case <-time.After(100 * time.Millisecond):
	}
	p.stagers.Wait() // exited is set: no new one begins (inStage)
	os.RemoveAll(p.stage)
	p.reason = exitReason(cmd.ProcessState, err)
	sig := deathSignal(cmd.ProcessState)
	p.memGroupDeath(sig)
	// Only a death by a memory fault (SIGSEGV, SIGBUS: the signals checked
	// mode's handler reports before it lets them kill the process) takes
	// the handler's report.
	if p.fault != "" && (sig == syscall.SIGSEGV || sig == syscall.SIGBUS) && p.killed.Load() == nil {
		p.faulted = p.fault
	}
	if why := p.killed.Load(); why != nil {
		p.reason = "was stopped by the server (" + *why + ")"
	}
	p.blame(sig)
	p.d.tenantDied(p)
	p.mu.Lock()
	p.ctlGone = true
	busy := p.ctlBusy
	p.mu.Unlock()
	if busy {
		// The call reads what the worker sent before it exited, then the
		// end: a child it forked may hold the worker's side open.
		p.ctl.CloseRead()
	} else {
		p.ctl.Close()
	}
	p.unpin()
	p.d.mu.Lock()
	delete(p.d.procs, p)
	p.d.mu.Unlock()
	close(p.done)
	p.programsGone()
}

// placeCgroups puts the worker in a CPU group of weight w (CPUGroups.Place),
// bounds its tasks (PidGroups.Place) and gives it a memory group
// (MemGroups.Place), before it runs bundle code, and
// keeps the groups' removal for its exit. It writes the pid under mu and
// only while the process has not exited, as kill signals it: a reaped pid
// may belong to another process.
func (p *proc) placeCgroups(w float64) {
	if p.d.opts.CPU == nil && p.d.opts.Pids == nil && p.d.opts.Mem == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.exited {
		p.cgroup = p.d.opts.CPU.Place(p.pid, w)
		p.cgroup.Tree(p.tree.Root())
		p.pids = p.d.opts.Pids.Place(p.pid, p.cgroup)
		p.mem.Store(p.d.opts.Mem.Place(p.pid, p.cgroup))
	}
}

// weigh sets the worker's CPU weight for the function it took, under mu:
// its group is removed once it exited (wait), not while this writes.
func (p *proc) weigh(m *abi.Manifest) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cgroup.Weigh(m)
}

func exitReason(ps *os.ProcessState, err error) string {
	if ps == nil {
		return "could not be waited for: " + err.Error()
	}
	ws, ok := ps.Sys().(syscall.WaitStatus)
	switch {
	case ok && ws.Signaled():
		sig := ws.Signal()
		return fmt.Sprintf("was killed by signal %s (%s)", unix.SignalName(sig), sig.String())
	case ps.ExitCode() == wire.ExitChannel:
		return fmt.Sprintf("exited with status %d (a channel to the server broke: the bundle closed or damaged it)", wire.ExitChannel)
	case ps.ExitCode() == wire.ExitFault:
		return fmt.Sprintf("exited with status %d (its device context faulted)", wire.ExitFault)
	}
	return fmt.Sprintf("exited with status %d", ps.ExitCode())
}

// idleExit is the error of a run whose worker died before the run reached it.
func (p *proc) idleExit() error {
	p.end("an instance of it was lost")
	e := p.exit("idle")
	e.BeforeRun = true
	return e
}

// exit is its death as a run or call doing during saw it (the process has
// ended: reason is set).
func (p *proc) exit(during string) *ProcessExit {
	select {
	case <-p.done:
	default:
		// Not reaped within end's bound: what the reap finds (the exit
		// status, a fault's report, the blame) is not there to read.
		what := "ended"
		k := p.killed.Load()
		if k != nil {
			what = "was stopped by the server (" + *k + ")"
		}
		return &ProcessExit{PID: p.pid, During: during, Killed: k != nil,
			Reason: fmt.Sprintf("%s and is not reaped %s later: its reap waits on a process that does not end (stuck in the kernel, say)", what, endWait+reapWait)}
	}
	return &ProcessExit{PID: p.pid, Reason: p.reason, Fault: p.faulted, During: during, Killed: p.killed.Load() != nil}
}

// inStage runs put, which puts a load's files in p's stage, unless the
// process has exited, whose stage wait removes: the load is then lost
// with the process (its ProcessExit). wait removes the stage only once
// every put under way has returned, so that none links into a directory
// being removed (a file linked after the removal read it would leave the
// directory behind for good).
func (p *proc) inStage(put func() error) error {
	p.mu.Lock()
	if p.exited {
		p.mu.Unlock()
		return p.lost("staging the bundle")
	}
	p.stagers.Add(1) // before wait's Wait: exited is set under mu, then Wait
	p.mu.Unlock()
	defer p.stagers.Done()
	return put()
}

// usable reports whether p can take a load: alive, and its stage still
// there. A stage removed under the server (rm -rf DATA/workers) cannot be
// made again for p, which reads it through the removed directory's
// descriptor: every load into p would fail.
func (p *proc) usable() bool {
	if !p.alive() {
		return false
	}
	_, err := os.Lstat(p.stage)
	return !errors.Is(err, fs.ErrNotExist)
}

func (p *proc) alive() bool {
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// kill stops the worker and everything it started; the first reason given
// is the one reported.
func (p *proc) kill(why string) { p.killFor(nil, why) }

// killFor is kill for g's run or call (nil: none): in a tenant's worker
// the others it ends are collateral (tenant.go). g is blamed only when
// this kill is the process's end: under mu, with the process not exited
// and not killed already. A process that died of its own fault (a
// sibling's crash) before a run of g passed its deadline must not have g
// blamed for it, nor a kill already under way (a memory limit) be
// credited to g.
func (p *proc) killFor(g *program, why string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.exited {
		return
	}
	if p.killed.CompareAndSwap(nil, &why) && g != nil {
		p.killedBy.Store(g)
		p.killedHeld = p.tenant != nil && p.tenant.progs[g.id] == g
	}
	contain.KillGroup(p.pid)
	p.tree.Kill()
	p.cgroup.Dying()
}

// lost is the error of a channel that broke: the process died (or is made
// to), and the error says how.
func (p *proc) lost(during string) error {
	p.end("it closed its channel to the server")
	return p.exit(during)
}

// end waits for the process to be gone, killing it (for why) if it does not
// go by itself within a moment, and waits for its reap up to reapWait then.
func (p *proc) end(why string) {
	if p.unreaped.Load() {
		// Known not to be reaped: each request that waited 12 s again
		// would hold its instance as long.
		return
	}
	select {
	case <-p.done:
		return
	case <-time.After(endWait):
	}
	p.kill(why)
	select {
	case <-p.done:
	case <-time.After(reapWait):
		if p.unreaped.CompareAndSwap(false, true) {
			p.allBack() // its memory may never come back
			p.d.opts.Log.Warn("a killed worker is not reaped: its requests are told so without waiting longer", "pid", p.pid, "waited", (endWait + reapWait).String())
		}
	}
}

// reapWait bounds end's wait for a killed worker's reap. A process of it
// stuck in the kernel (uninterruptible: a hung driver call, say) holds the
// reap for good, in a PID namespace through its init too, and every
// request that saw the worker go waited with it, each holding its
// instance, until the function had none left. A variable for tests.
//
// endWait is how long end lets a worker go by itself before it kills it.
var reapWait, endWait = 10 * time.Second, 2 * time.Second

// deathSignal is the signal that killed a process, 0 for none (an exit):
// a fatal signal's line, wire.FatalMark, is believed only for a signal.
func deathSignal(ps *os.ProcessState) syscall.Signal {
	if ps == nil {
		return 0
	}
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return ws.Signal()
	}
	return 0
}
