package cli

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/device"
	"github.com/plover-run/plover/worker"
	"github.com/plover-run/plover/worker/contain"
)

// runFlags are plover run's flags.
type runFlags struct {
	in, out         string
	repeat          int
	asJSON, checked bool
	timeout         time.Duration
}

func runCmd() *command {
	var f runFlags
	return &command{
		nargs: 1,
		name:  "run", summary: "run a bundle's chain on an input in a worker process, on the CPU (no server), with timings",
		usage: "DIR --in FILE|- [--out FILE|-] [--repeat N] [--timeout 30s] [--json]",
		example: "  plover run saxpy --in input.bin --out output.bin      # saxpy/build/host, built by plover build\n" +
			"  plover run build/samples/vecadd-host --in build/samples/vecadd-input.bin --out /tmp/sum.bin --repeat 100",
		flags: func(fs *flag.FlagSet) {
			fs.StringVar(&f.in, "in", "", "input file, - for stdin (required)")
			fs.StringVar(&f.out, "out", "-", "output file, - for stdout: written as plover invoke's --out is, opened before the run and given the output only once it is whole; a failed run, or one interrupted (^C, SIGTERM, SIGHUP) before its output is whole, leaves FILE as it was (one interrupted after that gives FILE the whole output, says so, and exits as the signal's status)")
			fs.IntVar(&f.repeat, "repeat", 1, "run the chain N times on one instance and print min/median/p99 of each phase")
			fs.BoolVar(&f.asJSON, "json", false, "print a JSON report to stdout instead: timings, and the output in base64 unless --out names a file")
			fs.BoolVar(&f.checked, "checked", true, "catch an access past the end of in, tmp or out, naming the entry and the buffer (guard pages; --checked=false runs in place, as plover serve does by default)")
			fs.DurationVar(&f.timeout, "timeout", 30*time.Second, "each run's deadline, as plover serve's --timeout: a chain still running then is stopped (its worker killed) and reported")
		},
		run: func(_ *flag.FlagSet, args []string, env *Env) error { return f.run(args[0], env) },
	}
}

// run is plover run of the bundle at arg.
func (f *runFlags) run(arg string, env *Env) (err error) {
	switch {
	case f.in == "":
		return usagef(env, "run", "--in FILE is required (- reads stdin)")
	case f.repeat < 1:
		return usagef(env, "run", "--repeat %d: want 1 or more", f.repeat)
	case f.timeout <= 0:
		return usagef(env, "run", "--timeout %v: want a positive duration", f.timeout)
	case !f.asJSON && f.out == "-" && env.StdoutIsTerminal:
		return usagef(env, "run", "the output is binary and stdout is a terminal: write it with --out FILE, or ask for --json")
	}
	dir, err := resolveBundle(arg, abi.TargetHost, env)
	if err != nil {
		return err
	}
	input, err := readInput(f.in, env)
	if err != nil {
		return err
	}
	// Caught as invoke catches them (outSignals), from before --out
	// is made until it is committed: caught only during the run,
	// they left the temporary file (and a FILE made for the output)
	// when they came before or after it.
	sigs := catchSignals()
	defer sigs.release() // after the deferred abort
	defer func() { err = sigs.status(err) }()
	// Opened before the run and written as invoke's --out is
	// (outfile.go): a FILE that cannot be written fails first, and
	// one written fails whole or not at all.
	var of *outFile
	if f.out != "-" {
		if of, err = createOut(f.out, env); err != nil {
			return err
		}
		defer of.abort()
	}
	// Caught to the end of the run, whatever the output: none of
	// it is written before then, and a second ^C ended the run's
	// clean-up midway, its stage left behind. Written through
	// (a FIFO, a device), it is caught once again from the write.
	sigs.hold()
	if of != nil && of.whole() {
		sigs.pending(of)
	}
	rep, output, err := runLocal(sigs.ctx, dir, input, f.repeat, f.timeout, f.checked, env.Stderr)
	if of != nil && !of.whole() {
		sigs.pending(of)
	}
	if err != nil && of != nil && of.whole() && sigs.ctx.Err() != nil {
		return fmt.Errorf("%w (--out %s left as it was)", err, f.out)
	}
	if err != nil {
		return err
	}
	if of != nil {
		if _, err := of.Write(output); err != nil {
			return fmt.Errorf("--out %s: %w", f.out, err)
		}
		if err := sigs.commit(of); err != nil {
			return err
		}
	}
	// What is left to write has nothing to clean up after it: a
	// signal, or a reader of stdout gone, may end it as it would
	// any command.
	sigs.release()
	return f.report(rep, output, env)
}

// report writes the run's report: JSON to stdout, or the output to stdout
// (without --out) and the timings to stderr.
func (f *runFlags) report(rep *runReport, output []byte, env *Env) error {
	if f.asJSON {
		printWarnings(env.Stderr, rep.Warnings) // also where a person sees them
		if f.out == "-" {
			rep.Output = output
		}
		return printJSON(env.Stdout, rep)
	}
	if f.out == "-" {
		if _, err := env.Stdout.Write(output); err != nil {
			return err
		}
	}
	rep.print(env.Stderr)
	return nil
}

// loadTimeout is the least time plover run gives a worker to start and
// load the bundle, and an instance to be made.
const loadTimeout = 30 * time.Second

// runReport is what plover run measured, and its --json output.
type runReport struct {
	Bundle     string   `json:"bundle"`
	Function   string   `json:"function"`
	Chain      []string `json:"chain"`
	InputBytes int      `json:"input_bytes"`
	// Items is, for a batching bundle, how many requests the input held
	// and ran as one batch; its output is theirs, item_output_bytes each.
	Items       int       `json:"batch_items,omitempty"`
	OutputBytes int64     `json:"output_bytes"`
	Output      []byte    `json:"output,omitempty"` // base64 in JSON
	Runs        int       `json:"runs"`
	Checked     bool      `json:"checked"` // checked mode: buffers against guard pages, copied in and out
	Timing      runTiming `json:"timing_us"`
	// Warnings are what the run found suspicious without failing: a chain
	// whose output depends on the run before (state left in tmp).
	Warnings []string `json:"warnings,omitempty"`
}

// runTiming is in microseconds: load and instance happen once, the rest on
// every run.
type runTiming struct {
	Load     float64 `json:"load"`
	Instance float64 `json:"instance"`
	CopyIn   stats   `json:"copy_in"`
	Kernels  stats   `json:"kernels"`
	CopyOut  stats   `json:"copy_out"`
	Total    stats   `json:"run"` // one Run call, measured around it
}

type stats struct {
	Min    float64 `json:"min"`
	Median float64 `json:"median"`
	P99    float64 `json:"p99"`
}

// summarize is ds' min, median and p99 (nearest rank), in microseconds.
func summarize(ds []time.Duration) stats {
	s := slices.Clone(ds)
	slices.Sort(s)
	rank := func(q float64) time.Duration {
		i := int(math.Ceil(q*float64(len(s)))) - 1
		return s[max(0, min(i, len(s)-1))]
	}
	return stats{Min: us(s[0]), Median: us(rank(0.5)), P99: us(rank(0.99))}
}

func us(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 }

// runLocal loads the bundle in dir into a worker process on the host
// device, contained as plover serve's are, makes one instance and runs the
// manifest's chain on input repeat times, each run within timeout. It
// returns the report and the last run's output. In a worker, a chain that
// writes past its buffers or never returns ends as it would on a server
// (the worker crashes, or is killed at the deadline) instead of corrupting
// or hanging this process. What the bundle prints goes to stderr, escaped
// as plover logs shows it (visibleLines). sig done (a signal) stops it.
func runLocal(sig context.Context, dir string, input []byte, repeat int, timeout time.Duration, checked bool, stderr io.Writer) (*runReport, []byte, error) {
	m, err := checkDir(dir)
	if err != nil {
		return nil, nil, err
	}
	if m.Target != abi.TargetHost {
		return nil, nil, fmt.Errorf("%s is a %s bundle; plover run runs host bundles, on this machine's CPU: build one with plover build --target host (and run this one on a plover serve with a GPU)", dir, m.Target)
	}
	items, err := batchItems(m, len(input), dir)
	if err != nil {
		return nil, nil, err
	}
	if int64(len(input)) > m.MaxInputBytes {
		return nil, nil, fmt.Errorf("the input is %d bytes, over max_input_bytes %d in %s", len(input), m.MaxInputBytes, filepath.Join(dir, abi.ManifestFile))
	}
	rep := &runReport{Bundle: dir, Function: m.Name, InputBytes: len(input), Items: int(items), Runs: repeat, Checked: checked}
	for _, l := range m.Chain {
		rep.Chain = append(rep.Chain, l.Kernel)
	}
	stages, err := os.MkdirTemp("", "plover-run-")
	if err != nil {
		return nil, nil, err
	}
	defer os.RemoveAll(stages)
	spawner := contain.NewSpawner()
	defer spawner.Close()
	log := slog.New(slog.DiscardHandler)
	dev := worker.NewDevice(worker.Options{Exe: workerExe(log), Base: device.NewHost(0), Landlock: true,
		StageDir: stages, Spawner: spawner, Log: log, Output: escapingWriter{stderr}, Checked: checked})
	defer dev.Close()
	t0 := time.Now()
	// A signal (sig done) stops the workers, so that the run returns and
	// the deferred clean-up (the stage's links to the bundle) happens.
	defer context.AfterFunc(sig, func() { dev.Close() })()
	// The load and the instance get the timeout or loadTimeout, whichever is
	// longer: --timeout bounds runs, and a short one must not read as a
	// chain that overran while the worker was still starting.
	setup := max(timeout, loadTimeout)
	ctx, cancel := context.WithTimeout(sig, setup)
	prog, err := dev.Load(ctx, device.ProgramSpec{Dir: dir, Manifest: m})
	cancel()
	if sig.Err() != nil {
		return nil, nil, errors.New("interrupted")
	}
	if err != nil {
		return nil, nil, fmt.Errorf("loading %s: %w", dir, err)
	}
	defer prog.Close()
	t1 := time.Now()
	inst, err := prog.NewInstance(device.InstanceConfig{MaxInput: m.MaxInputBytes, Tmp: m.TmpBytes, Out: m.OutBytes, Deadline: time.Now().Add(setup)})
	if err != nil && sig.Err() != nil { // the stop ended the worker in plover_instance_init
		return nil, nil, errors.New("interrupted")
	}
	if err != nil {
		return nil, nil, fmt.Errorf("creating an instance of %s: %w", dir, err)
	}
	defer inst.Close()
	rep.Timing.Load, rep.Timing.Instance = us(t1.Sub(t0)), us(time.Since(t1))

	steps, err := chainSteps(prog, m)
	if err != nil && sig.Err() != nil {
		return nil, nil, errors.New("interrupted")
	}
	if err != nil {
		return nil, nil, err
	}
	outLen := m.OutBytes
	if items > 0 {
		outLen = int64(items) * m.Batch.ItemOutputBytes // each request's slice of out, as a server answers them
	}
	lr := &localRun{dir: dir, manifest: editableManifest(dir, m.Target), timeout: timeout, sig: sig, inst: inst, rep: rep,
		r: &device.Run{Input: input, Output: make([]byte, outLen), Chain: steps,
			TmpLen: m.TmpBytes, ZeroTmp: m.ZeroTmp, ZeroOut: m.ZeroesOut(), Items: items}}
	if err := lr.repeat(repeat, items > 0); err != nil {
		return nil, nil, err
	}
	r := lr.r
	if r.OutLen < 0 || r.OutLen > int64(len(r.Output)) {
		return nil, nil, fmt.Errorf("%s: the device reported %d output bytes of %d", dir, r.OutLen, len(r.Output))
	}
	rep.OutputBytes = r.OutLen
	output := slices.Clone(r.Output[:r.OutLen])
	if m.TmpBytes > 0 && !m.ZeroTmp {
		if err := lr.checkTmpKept(output); err != nil {
			return nil, nil, err
		}
	}
	return rep, output, nil
}

// chainSteps is m's chain as the program's entries.
func chainSteps(prog device.Program, m *abi.Manifest) ([]device.Step, error) {
	steps := make([]device.Step, len(m.Chain))
	for i, l := range m.Chain {
		e, err := prog.Entry(l.Kernel)
		if err != nil {
			return nil, fmt.Errorf("chain[%d] kernel %q: %w", i, l.Kernel, err)
		}
		steps[i] = device.Step{Entry: e, Grid: int32(l.Grid), Block: int32(l.Block)}
	}
	return steps, nil
}

// localRun is plover run's chain on its one instance: the run it repeats
// and the report its timings go to.
type localRun struct {
	dir      string
	manifest string // the manifest the author edits (editableManifest)
	timeout  time.Duration
	sig      context.Context // done on a signal (outSignals)
	inst     device.Instance
	r        *device.Run
	rep      *runReport
}

// repeat runs the chain n times, each under the timeout, and sums up
// their timings in the report; batched: the output must stay its full
// length, as a server fails a batch whose s->out.len changed.
func (lr *localRun) repeat(n int, batched bool) error {
	r, outLen := lr.r, int64(len(lr.r.Output))
	var copyIn, kernels, copyOut, total []time.Duration
	for k := 0; k < n; k++ {
		start := time.Now()
		r.Deadline = start.Add(lr.timeout)
		err := lr.inst.Run(r)
		el := time.Since(start)
		if err != nil && lr.sig.Err() != nil {
			return errors.New("interrupted")
		}
		if err == nil && batched && r.OutLen != outLen {
			err = &device.KernelError{Msg: abi.OutLenChanged} // as a server fails the batch
		}
		if err != nil {
			return lr.failed(err, k, n)
		}
		copyIn, kernels, copyOut = append(copyIn, r.Timing.CopyIn), append(kernels, r.Timing.Kernels), append(copyOut, r.Timing.CopyOut)
		total = append(total, el)
	}
	t := &lr.rep.Timing
	t.CopyIn, t.Kernels = summarize(copyIn), summarize(kernels)
	t.CopyOut, t.Total = summarize(copyOut), summarize(total)
	return nil
}

// failed is the error of run k of n that failed with err.
func (lr *localRun) failed(err error, k, n int) error {
	what, chain := "", strings.Join(lr.rep.Chain, " ")
	if n > 1 {
		what = fmt.Sprintf(" (run %d of %d)", k+1, n)
	}
	var ke *device.KernelError
	if errors.As(err, &ke) && ke.Rejected {
		return fmt.Errorf("%s: the chain [%s] refused its input%s (plover_reject: a server answers 422 invalid_input): %s", lr.dir, chain, what, ke.Msg)
	}
	if errors.As(err, &ke) {
		return fmt.Errorf("%s: the chain [%s] failed%s: %s", lr.dir, chain, what, ke.Msg)
	}
	if errors.Is(err, device.ErrDeadline) {
		return fmt.Errorf("%s: the chain [%s] was still running at the --timeout of %v%s: it was stopped (a kernel that never returns, or one slower than the timeout: raise --timeout)", lr.dir, chain, lr.timeout, what)
	}
	return fmt.Errorf("%s: running the chain [%s]%s: %w", lr.dir, chain, what, err)
}

// checkTmpKept warns of a chain whose output depends on the run before.
// tmp kept between runs (zero_tmp false) is right for a cache and wrong
// for an accumulator (atomicAdd into tmp): the first run is correct and
// every later one, on a server, is not. One more run of the same input
// tells them apart: its output must not change from output.
func (lr *localRun) checkTmpKept(output []byte) error {
	r := lr.r
	r.Deadline = time.Now().Add(lr.timeout)
	advice := fmt.Sprintf("the chain [%s] reads what an earlier run left in tmp, and %s has \"zero_tmp\": false. A kernel that accumulates into tmp (atomicAdd, +=) needs \"zero_tmp\": true, or a server answers its second request wrongly",
		strings.Join(lr.rep.Chain, " "), lr.manifest)
	switch err := lr.inst.Run(r); {
	case err != nil && lr.sig.Err() != nil:
		return errors.New("interrupted")
	case err != nil: // what tmp kept broke the run: the same bug, worse
		lr.rep.Warnings = append(lr.rep.Warnings, fmt.Sprintf("the same input, run again on the same instance, failed (%v): %s", err, advice))
	case !bytes.Equal(r.Output[:r.OutLen], output):
		lr.rep.Warnings = append(lr.rep.Warnings, "the same input, run again on the same instance, gave another output: "+advice)
	}
	return nil
}

// batchItems is how many requests the input holds for a batching bundle
// (0 for one that does not batch). A server takes one a request, of
// exactly batch.item_input_bytes, and answers each its item_output_bytes;
// plover run takes one, or up to max_items back to back, run as one batch
// (s->items of them), and writes their outputs back to back.
func batchItems(m *abi.Manifest, n int, dir string) (uint32, error) {
	b := m.Batch
	if b == nil {
		return 0, nil
	}
	if n == 0 || int64(n)%b.ItemInputBytes != 0 || int64(n)/b.ItemInputBytes > int64(b.MaxItems) {
		return 0, fmt.Errorf("the input is %d bytes; %s batches requests of exactly %d bytes (batch.item_input_bytes in %s): give one item, as a request to a server, or up to max_items %d of them back to back to run as one batch",
			n, m.Name, b.ItemInputBytes, filepath.Join(dir, abi.ManifestFile), b.MaxItems)
	}
	return uint32(int64(n) / b.ItemInputBytes), nil
}

// print writes the report's timing breakdown for a person.
func (rep *runReport) print(w io.Writer) {
	printWarnings(w, rep.Warnings)
	runs := "1 run"
	if rep.Runs > 1 {
		runs = fmt.Sprintf("%d runs on one instance", rep.Runs)
	}
	mode := ", checked (--checked=false times the server's default, in place)"
	if !rep.Checked {
		mode = ""
	}
	batch := ""
	switch {
	case rep.Items == 1:
		batch = " (1 item of a batch)"
	case rep.Items > 1:
		batch = fmt.Sprintf(" (%d items, one batch)", rep.Items)
	}
	fmt.Fprintf(w, "%s (%s): chain [%s], %s in%s, %s out, %s on the host device%s\n", visible(rep.Function), visible(rep.Bundle),
		visible(strings.Join(rep.Chain, " ")), humanBytes(int64(rep.InputBytes)), batch, humanBytes(rep.OutputBytes), runs, mode)
	t := rep.Timing
	phases := []struct {
		name string
		s    stats
	}{{"copy-in + zero", t.CopyIn}, {"kernels", t.Kernels}, {"copy-out", t.CopyOut}, {"run (wall)", t.Total}}
	fmt.Fprintf(w, "  %-27s %9s\n", "load (library + constants)", fmtUs(t.Load))
	fmt.Fprintf(w, "  %-27s %9s\n", "instance creation", fmtUs(t.Instance))
	if rep.Runs == 1 {
		for _, p := range phases {
			fmt.Fprintf(w, "  %-27s %9s\n", p.name, fmtUs(p.s.Min))
		}
		return
	}
	fmt.Fprintf(w, "  %-27s %9s %9s %9s\n", "per run", "min", "median", "p99")
	for _, p := range phases {
		fmt.Fprintf(w, "  %-27s %9s %9s %9s\n", p.name, fmtUs(p.s.Min), fmtUs(p.s.Median), fmtUs(p.s.P99))
	}
}

// fmtUs renders microseconds with three significant digits or so.
func fmtUs(v float64) string {
	switch {
	case v < 1:
		return fmt.Sprintf("%.0fns", v*1e3)
	case v < 1e3:
		return fmt.Sprintf("%.1fµs", v)
	case v < 1e6:
		return fmt.Sprintf("%.2fms", v/1e3)
	}
	return fmt.Sprintf("%.2fs", v/1e6)
}
