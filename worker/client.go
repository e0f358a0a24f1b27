package worker

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/plover-run/plover/device"
	"github.com/plover-run/plover/worker/contain"
)

// Options configure a Device.
type Options struct {
	Exe      string        // the plover binary; workers run `Exe worker ...`
	Base     device.Device // the server's own view of the device: name, memory, health
	Ordinal  int           // which GPU (CUDA)
	Driver   string        // the CUDA driver library workers open ("": libcuda.so.1)
	MemLimit int64         // the device budget in bytes, 0: none (passed to workers)
	Standby  int           // idle workers kept started, device open, per device
	Drop     *contain.Identity
	Landlock bool
	// StageDir holds each worker's stage, the directory its bundle's files
	// are linked into; on the file system of the bundle cache, so links
	// work (otherwise the files are copied). Required.
	StageDir string
	// MPS starts a worker per program with its limits in the environment
	// (gpu_share, the memory budget), not from the standby pool.
	MPS bool
	// MaxHostMemory is the resident memory a worker may hold (bytes; 0:
	// no limit) when its manifest sets no max_host_memory_mb.
	MaxHostMemory int64
	Spawner       *contain.Spawner
	Log           *slog.Logger
}

// Device runs each program in a worker process of its own. It implements
// device.Device; memory is accounted from the sizes it hands out, since the
// server itself allocates nothing on the device.
type Device struct {
	opts    Options
	used    atomic.Int64
	standby chan *proc
	refill  chan struct{}
	stop    chan struct{}
	once    sync.Once

	mu     sync.Mutex
	procs  map[*proc]struct{}
	closed bool

	landlockLogged atomic.Bool
	startFailures  atomic.Int32 // workers in a row that exited before ready
	lastStartErr   atomic.Value // string: the last one's reason
	lastStartFail  atomic.Int64 // when (Unix ns)
}

var _ device.Device = (*Device)(nil)

// NewDevice starts the standby pool and returns the device.
func NewDevice(opts Options) *Device {
	if opts.Log == nil {
		opts.Log = slog.New(slog.DiscardHandler)
	}
	d := &Device{opts: opts, standby: make(chan *proc, max(opts.Standby, 0)), refill: make(chan struct{}, 1),
		stop: make(chan struct{}), procs: map[*proc]struct{}{}}
	if opts.Standby > 0 && !opts.MPS {
		go d.keepStandby()
		d.refill <- struct{}{}
	}
	go d.watchMemory()
	return d
}

func (d *Device) Target() string { return d.opts.Base.Target() }
func (d *Device) Name() string   { return d.opts.Base.Name() }

// Health is the server's view of the device, and unhealthy too while the
// last startFailureLimit workers in a row could not open it: a fault that
// persists across workers is the device's, one that ends a worker is not.
func (d *Device) Health() error {
	if err := d.opts.Base.Health(); err != nil {
		return err
	}
	// It lapses a while after the last failure, so that a request (or the
	// standby pool) tries a worker again and a recovered device comes back.
	if n := d.startFailures.Load(); n >= startFailureLimit && time.Since(time.Unix(0, d.lastStartFail.Load())) < startFailureHold {
		why, _ := d.lastStartErr.Load().(string)
		return fmt.Errorf("%s: %w: the last %d workers could not open it: %s", d.Name(), device.ErrUnhealthy, n, why)
	}
	return nil
}

// startFailureLimit is how many workers in a row must fail to open the
// device before it is reported unhealthy, for startFailureHold after the
// last one.
const (
	startFailureLimit = 3
	startFailureHold  = 10 * time.Second
)

// MemInfo is the device's memory less what this server's workers were
// given (the server allocates nothing on the device itself).
func (d *Device) MemInfo() device.MemInfo {
	b := d.opts.Base.MemInfo()
	used := d.used.Load()
	free := min(b.Free, b.Total-used)
	if free < 0 {
		free = 0
	}
	return device.MemInfo{Total: b.Total, Free: free, Used: used}
}

// Close stops every worker.
func (d *Device) Close() error {
	d.once.Do(func() { close(d.stop) })
	d.mu.Lock()
	d.closed = true // spawn kills what it starts from now on
	procs := make([]*proc, 0, len(d.procs))
	for p := range d.procs {
		procs = append(procs, p)
	}
	d.mu.Unlock()
	for _, p := range procs {
		p.kill("the server is stopping")
	}
	// Bounded: their stages go as they are reaped.
	deadline := time.After(2 * time.Second)
	for _, p := range procs {
		select {
		case <-p.done:
		case <-deadline:
			return nil
		}
	}
	return nil
}

// deviceSelection is the server's device selection, which a worker's
// ordinal refers to: not secrets, and without them a worker would number
// the GPUs differently from the server.
func deviceSelection() []string {
	var env []string
	for _, k := range []string{"CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER"} {
		if v, ok := os.LookupEnv(k); ok {
			env = append(env, k+"="+v)
		}
	}
	return env
}

// keepStandby refills the pool whenever a worker is taken from it.
func (d *Device) keepStandby() {
	for {
		select {
		case <-d.stop:
			return
		case <-d.refill:
		}
		for len(d.standby) < cap(d.standby) {
			p, err := d.spawn(context.Background())
			if err != nil {
				d.opts.Log.Error("cannot start a standby worker", "device", d.Name(), "error", err)
				select {
				case <-d.stop:
					return
				case <-time.After(time.Second):
				}
				continue
			}
			select {
			case <-d.stop:
				p.kill("the server is stopping")
				return
			default:
			}
			d.standby <- p // never blocks: this goroutine alone fills it, below its capacity
		}
	}
}

// take returns a started worker: a standby one when there is one. The
// caller refills the pool (d.refillLater) once its load is done.
func (d *Device) take(ctx context.Context) (*proc, error) {
	for {
		select {
		case p := <-d.standby:
			if p.alive() {
				return p, nil
			}
			continue
		default:
		}
		return d.spawn(ctx)
	}
}

func (d *Device) refillPool() {
	select {
	case d.refill <- struct{}{}:
	default:
	}
}

// refillDelay keeps a replacement worker's start (runtime, privilege drop,
// Landlock, preloads: milliseconds of a core) out of the cold request that
// took a standby: on a 2-core machine it tripled that request's time.
const refillDelay = 20 * time.Millisecond

func (d *Device) refillLater() { time.AfterFunc(refillDelay, d.refillPool) }

// Load hands the bundle to a worker, which loads it.
func (d *Device) Load(ctx context.Context, spec device.ProgramSpec) (device.Program, error) {
	select {
	case <-d.stop:
		return nil, fmt.Errorf("%s: %w: closed", d.Name(), device.ErrUnhealthy)
	default:
	}
	mj, err := json.Marshal(spec.Manifest)
	if err != nil {
		return nil, err
	}
	// The ledger counts what the server knows, not what a worker says.
	var consts int64
	if c := spec.Manifest.Constants; c != "" {
		fi, err := os.Stat(filepath.Join(spec.Dir, c))
		if err != nil {
			return nil, fmt.Errorf("constants: %w", err)
		}
		consts = fi.Size()
	}
	if err := ctx.Err(); err != nil {
		return nil, device.ErrDeadline
	}
	var p *proc
	if d.opts.MPS {
		p, err = d.spawn(ctx, mpsEnv(spec.Manifest.GPUShare, spec.MemoryBudget, d.opts.Ordinal)...)
	} else {
		p, err = d.take(ctx)
		defer d.refillLater()
	}
	if err != nil {
		return nil, err
	}
	limit := d.opts.MaxHostMemory
	if mb := spec.Manifest.MaxHostMemoryMB; mb > 0 {
		limit = mb << 20
	}
	p.memLimit.Store(limit)
	if err := stage(spec, p.stage); err != nil {
		p.kill("its bundle could not be staged")
		return nil, err
	}
	rep, err := p.call(ctx, append([]byte{opLoad}, mj...), nil, "loading the bundle")
	if err != nil {
		p.kill("its load failed")
		return nil, err
	}
	if rep[0] != stOK {
		p.kill("its bundle was refused")
		return nil, errorOf(rep[0], string(rep[1:]))
	}
	d.used.Add(consts)
	return &program{d: d, p: p, consts: consts, entries: map[string]int32{}}, nil
}

// ---- worker processes ----

type proc struct {
	d        *Device
	pid      int
	ctl      *net.UnixConn
	ctlTok   chan struct{} // one control call at a time
	buf      []byte
	done     chan struct{} // closed once the process is reaped; reason is set
	reason   string
	killed   atomic.Pointer[string] // why the server stopped it
	memLimit atomic.Int64           // resident bytes it may hold; 0: none
	said     chan string            // its first line of output (then closed)

	// exited is set, under mu, once the process has exited and its pid
	// may be reused: no signal may be sent to it after that.
	mu     sync.Mutex
	exited bool
	stage  string // removed when the process is gone
}

// spawn starts a worker; env is added to its (otherwise empty) environment.
func (d *Device) spawn(ctx context.Context, env ...string) (*proc, error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("start worker: socketpair: %w", err)
	}
	theirs := os.NewFile(uintptr(fds[1]), "worker-control")
	ours := os.NewFile(uintptr(fds[0]), "worker-control")
	defer theirs.Close()
	fc, err := net.FileConn(ours)
	ours.Close()
	if err != nil {
		return nil, fmt.Errorf("start worker: %w", err)
	}
	ctl := fc.(*net.UnixConn)
	stageDir, err := os.MkdirTemp(d.opts.StageDir, "worker-*")
	if err == nil {
		err = os.Chmod(stageDir, 0o755) // readable by --worker-user
	}
	var stageF *os.File
	if err == nil {
		stageF, err = os.Open(stageDir)
	}
	if err != nil {
		ctl.Close()
		os.RemoveAll(stageDir)
		return nil, fmt.Errorf("start worker: stage: %w", err)
	}
	defer stageF.Close()
	args := []string{"worker", "--device", d.Target(), "--ordinal", strconv.Itoa(d.opts.Ordinal),
		"--memory-limit", strconv.FormatInt(d.opts.MemLimit, 10), "--parent", strconv.Itoa(os.Getpid())}
	if d.opts.Drop != nil {
		args = append(args, "--user", d.opts.Drop.String())
	}
	if d.opts.Driver != "" {
		args = append(args, "--driver", d.opts.Driver)
	}
	if d.opts.Landlock {
		args = append(args, "--landlock")
	}
	cmd := exec.Command(d.opts.Exe, args...)
	// Nothing of the server's environment: no credentials, no settings.
	cmd.Env = append(append([]string{"PATH=/usr/local/bin:/usr/bin:/bin"}, deviceSelection()...), env...)
	cmd.ExtraFiles = []*os.File{theirs, stageF} // fds 3 and 4: ctlFD, stageFD
	// A pipe of our own rather than an io.Writer: Wait must not wait for
	// a forked grandchild that keeps stderr open.
	pr, pw, err := os.Pipe()
	if err != nil {
		ctl.Close()
		os.RemoveAll(stageDir)
		return nil, fmt.Errorf("start worker: %w", err)
	}
	cmd.Stderr = pw
	// Go opens its descriptors close-on-exec, C code (a driver) may not:
	// mark them all, so a worker inherits nothing but its ExtraFiles.
	if err := unix.CloseRange(3, ^uint(0), unix.CLOSE_RANGE_CLOEXEC); err != nil {
		d.opts.Log.Warn("cannot mark descriptors close-on-exec; a worker may inherit some", "error", err)
	}
	err = d.opts.Spawner.Start(cmd)
	pw.Close()
	if err != nil {
		pr.Close()
		ctl.Close()
		os.RemoveAll(stageDir)
		return nil, fmt.Errorf("start worker: %w", err)
	}
	p := &proc{d: d, pid: cmd.Process.Pid, ctl: ctl, ctlTok: make(chan struct{}, 1), buf: make([]byte, replyMax),
		done: make(chan struct{}), said: make(chan string, 1), stage: stageDir}
	d.mu.Lock()
	closed := d.closed
	d.procs[p] = struct{}{}
	d.mu.Unlock()
	go p.logStderr(pr)
	go p.wait(cmd)
	if closed {
		p.kill("the server is stopping")
		return nil, fmt.Errorf("%s: %w: closed", d.Name(), device.ErrUnhealthy)
	}
	// Ready: the worker contained itself and opened its device.
	if dl, ok := ctx.Deadline(); ok {
		ctl.SetReadDeadline(dl)
	} else {
		ctl.SetReadDeadline(time.Now().Add(30 * time.Second))
	}
	n, err := ctl.Read(p.buf)
	ctl.SetReadDeadline(time.Time{})
	if err != nil || n != 6 || p.buf[0] != opReady {
		if err != nil && errors.Is(err, os.ErrDeadlineExceeded) {
			p.kill("it did not start in time")
			return nil, fmt.Errorf("start worker: %w", device.ErrDeadline)
		}
		err := p.startFailure()
		d.lastStartErr.Store(err.Error())
		d.lastStartFail.Store(time.Now().UnixNano())
		d.startFailures.Add(1)
		return nil, err
	}
	d.startFailures.Store(0)
	if d.opts.Landlock && p.buf[5] == 0 && d.landlockLogged.CompareAndSwap(false, true) {
		d.opts.Log.Warn("this kernel has no Landlock: workers can read whatever their uid can, open network connections and signal processes of their uid; run the server as root so that workers get a uid of their own (--worker-user)")
	}
	return p, nil
}

// stage links the bundle's library and constants into a worker's stage
// (copies them if the stage is on another file system).
func stage(spec device.ProgramSpec, dir string) error {
	for _, name := range []string{spec.Manifest.Library, spec.Manifest.Constants} {
		if name == "" {
			continue
		}
		src, dst := filepath.Join(spec.Dir, name), filepath.Join(dir, name)
		if err := os.Link(src, dst); err == nil {
			continue
		}
		if err := copyFile(src, dst); err != nil {
			return fmt.Errorf("stage %s: %w", name, err)
		}
	}
	return nil
}

func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// startFailure is the error of a worker that ended before it was ready,
// with what it said about why (a device it could not open, say): an
// operator reads it in the request's error and in /healthz, not only in
// the server's log.
func (p *proc) startFailure() error {
	err := p.lost("starting")
	select {
	case line, ok := <-p.said:
		if pe, isExit := err.(*device.ProcessExit); ok && isExit && line != "" {
			pe.Reason += " (it said: " + line + ")"
		}
	case <-time.After(200 * time.Millisecond): // it said nothing
	}
	return err
}

// logStderr passes the first lines a worker writes to the server log (its
// own start-up errors, or what a crashing bundle printed) and drops the rest:
// a bundle must not be able to flood the server's log.
func (p *proc) logStderr(r io.ReadCloser) {
	defer r.Close()
	sc := bufio.NewScanner(r)
	for lines := 0; lines < 20 && sc.Scan(); lines++ {
		if lines == 0 {
			p.said <- sc.Text()
			close(p.said)
		}
		p.d.opts.Log.Warn("worker output", "pid", p.pid, "line", sc.Text())
	}
	// Keep reading, or a worker that writes more would die of SIGPIPE.
	io.Copy(io.Discard, r)
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
	p.mu.Lock()
	contain.KillGroup(p.pid)
	p.exited = true
	p.mu.Unlock()
	err := cmd.Wait()
	os.RemoveAll(p.stage)
	p.reason = exitReason(cmd.ProcessState, err)
	if why := p.killed.Load(); why != nil {
		p.reason = "was stopped by the server (" + *why + ")"
	}
	p.ctl.Close()
	p.d.mu.Lock()
	delete(p.d.procs, p)
	p.d.mu.Unlock()
	close(p.done)
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
	case ps.ExitCode() == exitChannel:
		return fmt.Sprintf("exited with status %d (a channel to the server broke: the bundle closed or damaged it)", exitChannel)
	case ps.ExitCode() == exitFault:
		return fmt.Sprintf("exited with status %d (its device context faulted)", exitFault)
	}
	return fmt.Sprintf("exited with status %d", ps.ExitCode())
}

// idleExit is the error of a run whose worker died before the run reached it.
func (p *proc) idleExit() error {
	p.end("an instance of it was lost")
	return &device.ProcessExit{PID: p.pid, Reason: p.reason, During: "idle", BeforeRun: true}
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
func (p *proc) kill(why string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.exited {
		return
	}
	p.killed.CompareAndSwap(nil, &why)
	contain.KillGroup(p.pid)
}

// lost is the error of a channel that broke: the process died (or is made
// to), and the error says how.
func (p *proc) lost(during string) error {
	p.end("it closed its channel to the server")
	return &device.ProcessExit{PID: p.pid, Reason: p.reason, During: during}
}

// end waits for the process to be gone, killing it (for why) if it does not
// go by itself within a moment.
func (p *proc) end(why string) {
	select {
	case <-p.done:
	case <-time.After(2 * time.Second):
		p.kill(why)
		<-p.done
	}
}

// failed turns a channel error into the run's error.
func (p *proc) failed(err error, during string) error {
	if errors.Is(err, os.ErrDeadlineExceeded) {
		p.kill("the request's deadline passed while " + during)
		return device.ErrDeadline
	}
	return p.lost(during)
}

// call sends one control message (with descriptors) and returns the reply,
// within ctx's deadline; past it the worker is killed.
func (p *proc) call(ctx context.Context, msg []byte, fds []int, during string) ([]byte, error) {
	if _, ok := ctx.Deadline(); !ok { // a pre-warm, say: still bounded
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, maxControlWait)
		defer cancel()
	}
	select {
	case p.ctlTok <- struct{}{}:
	default:
		select {
		case p.ctlTok <- struct{}{}:
		case <-ctx.Done():
			return nil, device.ErrDeadline
		}
	}
	defer func() { <-p.ctlTok }()
	dl, _ := ctx.Deadline()
	p.ctl.SetDeadline(dl)
	// Cancellation, too, ends the wait (as a deadline).
	defer context.AfterFunc(ctx, func() { p.ctl.SetDeadline(time.Now()) })()
	var oob []byte
	if len(fds) > 0 {
		oob = unix.UnixRights(fds...)
	}
	if _, _, err := p.ctl.WriteMsgUnix(msg, oob, nil); err != nil {
		return nil, p.failed(err, during)
	}
	n, err := p.ctl.Read(p.buf)
	if err != nil {
		return nil, p.failed(err, during)
	}
	if n == 0 {
		return nil, p.lost(during)
	}
	return append([]byte(nil), p.buf[:n]...), nil
}

// instanceGrace is how long past its request's deadline an instance
// creation may take before its worker is stopped.
const instanceGrace = 2 * time.Second

// maxControlWait bounds a control call whose context has no deadline.
const maxControlWait = time.Minute

// ---- programs and instances ----

type program struct {
	d      *Device
	p      *proc
	consts int64
	closed atomic.Bool

	mu      sync.Mutex
	entries map[string]int32
}

// PID is the worker process's.
func (g *program) PID() int { return g.p.pid }

// Alive is false once the worker process is gone.
func (g *program) Alive() bool { return g.p.alive() }

func (g *program) ConstantsBytes() int64 { return g.consts }

func (g *program) Entry(kernel string) (int32, error) {
	g.mu.Lock()
	i, ok := g.entries[kernel]
	g.mu.Unlock()
	if ok {
		return i, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	rep, err := g.p.call(ctx, append([]byte{opEntry}, kernel...), nil, "resolving an entry point")
	if err != nil {
		return 0, err
	}
	if len(rep) < 5 {
		return 0, fmt.Errorf("worker %d: malformed entry reply", g.p.pid)
	}
	if rep[0] != stOK {
		return 0, errorOf(rep[0], string(rep[5:]))
	}
	i = int32(le.Uint32(rep[1:]))
	g.mu.Lock()
	g.entries[kernel] = i
	g.mu.Unlock()
	return i, nil
}

func (g *program) NewInstance(cfg device.InstanceConfig) (device.Instance, error) {
	if cfg.MaxInput < 0 || cfg.Tmp < 0 || cfg.Out < 0 {
		return nil, fmt.Errorf("instance sizes %d/%d/%d", cfg.MaxInput, cfg.Tmp, cfg.Out)
	}
	size := cfg.MaxInput + cfg.Out
	if size == 0 {
		size = 1
	}
	memfd, slot, err := newSlot(size)
	if err != nil {
		return nil, err
	}
	defer unix.Close(memfd)
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		unix.Munmap(slot)
		return nil, fmt.Errorf("instance channel: %w", err)
	}
	msg := []byte{opNewInstance}
	msg = le.AppendUint64(msg, uint64(cfg.MaxInput))
	msg = le.AppendUint64(msg, uint64(cfg.Tmp))
	msg = le.AppendUint64(msg, uint64(cfg.Out))
	// The bundle's plover_instance_init runs in there: bounded by the
	// request's deadline plus a grace (a creation merely slowed by load
	// must not cost the worker, which serves other instances), then the
	// worker is stopped and the request times out.
	dl := time.Now().Add(30 * time.Second)
	if !cfg.Deadline.IsZero() {
		dl = cfg.Deadline.Add(instanceGrace)
	}
	ctx, cancel := context.WithDeadline(context.Background(), dl)
	defer cancel()
	rep, err := g.p.call(ctx, msg, []int{memfd, fds[1]}, "creating an instance")
	if err != nil && ctx.Err() != nil && !errors.Is(err, device.ErrDeadline) {
		err = fmt.Errorf("%w: %v", device.ErrDeadline, err)
	}
	unix.Close(fds[1])
	if err == nil && rep[0] != stOK {
		err = errorOf(rep[0], string(rep[1:]))
	}
	if err != nil {
		unix.Close(fds[0])
		unix.Munmap(slot)
		return nil, err
	}
	bytes := cfg.MaxInput + cfg.Tmp + cfg.Out
	g.d.used.Add(bytes)
	return &instance{g: g, fd: fds[0], slot: slot, maxIn: cfg.MaxInput, tmp: cfg.Tmp, out: cfg.Out,
		msg: make([]byte, runMsgMax), rep: make([]byte, replyMax)}, nil
}

// newSlot is an instance's shared memory: a memfd of size bytes, sealed at
// that size, and the server's mapping of it. Sealed, because a worker that
// truncated it would make the server's next copy into the mapping fault
// (SIGBUS) and take the server down.
func newSlot(size int64) (int, []byte, error) {
	memfd, err := unix.MemfdCreate("plover-slot", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return -1, nil, fmt.Errorf("instance slot: %w", err)
	}
	if err := unix.Ftruncate(memfd, size); err != nil {
		unix.Close(memfd)
		return -1, nil, fmt.Errorf("instance slot of %d bytes: %w", size, err)
	}
	if _, err := unix.FcntlInt(uintptr(memfd), unix.F_ADD_SEALS, unix.F_SEAL_SHRINK|unix.F_SEAL_GROW|unix.F_SEAL_SEAL); err != nil {
		unix.Close(memfd)
		return -1, nil, fmt.Errorf("instance slot: seal: %w", err)
	}
	slot, err := unix.Mmap(memfd, 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		unix.Close(memfd)
		return -1, nil, fmt.Errorf("instance slot of %d bytes: %w", size, err)
	}
	return memfd, slot, nil
}

// Close stops the worker: whatever the bundle started goes with it.
func (g *program) Close() error {
	if !g.closed.CompareAndSwap(false, true) {
		return nil
	}
	g.p.kill("its program was unloaded")
	g.d.used.Add(-g.consts)
	return nil
}

// instance is one instance in a worker. Its channel is a plain blocking
// descriptor, not a net.Conn: the request's goroutine waits in ppoll on its
// own thread and the kernel wakes that thread when the reply lands, instead
// of a round through the netpoller and the scheduler (measured: the p50 of
// a hot CNN request and 4-client throughput both improved; BENCHMARKS.md).
type instance struct {
	g               *program
	fd              int
	slot            []byte
	maxIn, tmp, out int64
	msg, rep        []byte
	// overrun, after a run passed its deadline, receives whether the chain
	// finished within overrunGrace (true) or the worker was killed.
	overrun chan bool
}

// overrunGrace is how long a chain may run past its request's deadline
// before its worker is killed. The request is answered (504) at the deadline
// either way; the grace spares the worker's other requests when a chain is
// merely late, and a stuck kernel still ends within it.
const overrunGrace = 200 * time.Millisecond

// finish waits out an overrun chain: its reply is discarded.
func (i *instance) finish(done chan<- bool) {
	n, err := i.recv(time.Now().Add(overrunGrace))
	if err == nil && n >= replyHeader && i.rep[0] != stFault {
		done <- true
		return
	}
	// Late, faulted, or not a reply at all: the worker goes.
	i.g.p.kill("a chain ran past its request's deadline by more than " + overrunGrace.String())
	done <- false
}

// recv waits for the reply until dl (zero: no limit): os.ErrDeadlineExceeded
// past it, io.EOF when the worker's end closed.
func (i *instance) recv(dl time.Time) (int, error) {
	pfd := []unix.PollFd{{Fd: int32(i.fd), Events: unix.POLLIN}}
	for {
		var ts *unix.Timespec
		if !dl.IsZero() {
			left := time.Until(dl)
			if left <= 0 {
				return 0, os.ErrDeadlineExceeded
			}
			t := unix.NsecToTimespec(int64(left))
			ts = &t
		}
		n, err := unix.Ppoll(pfd, ts, nil)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return 0, err
		}
		if n == 0 {
			continue // the timeout: the loop's check says so
		}
		for {
			n, err = unix.Read(i.fd, i.rep)
			if err != unix.EINTR {
				break
			}
		}
		if err != nil {
			return 0, err
		}
		if n == 0 {
			return 0, io.EOF
		}
		return n, nil
	}
}

func deadlineC(dl time.Time) <-chan time.Time {
	if dl.IsZero() {
		return nil
	}
	return time.After(time.Until(dl))
}

func (i *instance) DeviceBytes() int64 { return i.maxIn + i.tmp + i.out }

func (i *instance) Close() {
	if i.slot == nil {
		return
	}
	if i.overrun != nil { // still finishing: the reader owns the buffers
		go func(c chan bool, fd int, slot []byte) {
			<-c
			unix.Close(fd)
			unix.Munmap(slot)
		}(i.overrun, i.fd, i.slot)
		i.slot = nil
		i.g.d.used.Add(-i.DeviceBytes())
		return
	}
	unix.Close(i.fd) // the worker frees the instance when it reads EOF
	unix.Munmap(i.slot)
	i.slot = nil
	i.g.d.used.Add(-i.DeviceBytes())
}

// Run hands one request to the worker: the input into the slot, one message
// each way, the output out of the slot. Past r.Deadline the worker is
// killed (a running kernel cannot be stopped otherwise).
func (i *instance) Run(r *device.Run) error {
	switch {
	case i.slot == nil:
		return errors.New("worker instance: closed")
	case int64(len(r.Input)) > i.maxIn || int64(len(r.Output)) > i.out || r.TmpLen < 0 || r.TmpLen > i.tmp:
		return fmt.Errorf("run of %d/%d/%d bytes on an instance of %d/%d/%d", len(r.Input), r.TmpLen, len(r.Output), i.maxIn, i.tmp, i.out)
	case len(r.Chain) == 0 || len(r.Chain) > (runMsgMax-runHeader)/stepBytes:
		return fmt.Errorf("chain has %d steps", len(r.Chain))
	}
	if i.overrun != nil {
		// The last run passed its deadline and may still be finishing.
		select {
		case ok := <-i.overrun:
			i.overrun = nil
			if !ok {
				return i.g.p.idleExit()
			}
		case <-deadlineC(r.Deadline):
			return device.ErrDeadline
		}
	}
	if !i.g.p.alive() {
		return i.g.p.idleExit()
	}
	copy(i.slot, r.Input)
	msg := encodeRun(i.msg, r)
	// One message is ever in flight, so the send never waits; if it would,
	// the worker stuffed its own channel.
	if err := unix.Sendto(i.fd, msg, unix.MSG_DONTWAIT, nil); err != nil {
		if err == unix.EAGAIN {
			i.g.p.kill("it filled its instance channel")
			return i.g.p.failed(err, "running the chain")
		}
		// The worker's end is gone: the request never reached it.
		return i.g.p.idleExit()
	}
	n, err := i.recv(r.Deadline)
	if err != nil {
		if errors.Is(err, os.ErrDeadlineExceeded) {
			i.overrun = make(chan bool, 1)
			go i.finish(i.overrun)
			return device.ErrDeadline
		}
		return i.g.p.failed(err, "running the chain")
	}
	if n < replyHeader {
		return i.g.p.lost("running the chain")
	}
	rep := i.rep[:n]
	r.Timing = device.Timing{
		CopyIn:  time.Duration(le.Uint64(rep[1:])),
		Kernels: time.Duration(le.Uint64(rep[9:])),
		CopyOut: time.Duration(le.Uint64(rep[17:])),
	}
	switch rep[0] {
	case stOK:
		// The worker runs bundle code: its word on the length is bounded.
		n := le.Uint64(rep[25:])
		if n > uint64(len(r.Output)) {
			i.g.p.kill(fmt.Sprintf("it reported %d output bytes of %d", n, len(r.Output)))
			return i.g.p.lost("running the chain")
		}
		r.OutLen = int64(copy(r.Output, i.slot[i.maxIn:i.maxIn+int64(n)]))
		return nil
	case stFault:
		ke := &device.KernelError{Msg: string(rep[replyHeader:])}
		return &faultError{ke: ke, exit: i.g.p.lost("running the chain")}
	}
	return errorOf(rep[0], string(rep[replyHeader:]))
}

// faultError is a chain that faulted the worker's device context for good:
// the request failed like any kernel failure, and the worker is gone.
type faultError struct {
	ke   *device.KernelError
	exit error
}

func (e *faultError) Error() string   { return e.ke.Error() }
func (e *faultError) Unwrap() []error { return []error{e.ke, e.exit} }
