package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/api"
	"github.com/plover-run/plover/bundle"
	"github.com/plover-run/plover/fileutil"
	"github.com/plover-run/plover/loader"
	"github.com/plover-run/plover/pipedef"
	"github.com/plover-run/plover/registry"
)

// checkDir validates a bundle directory before anything is uploaded: the
// manifest, then the check the server repeats (loader.CheckBundle; no code
// runs).
func checkDir(dir string) (*abi.Manifest, error) {
	m, err := bundle.ReadManifest(dir)
	if err != nil {
		return nil, err
	}
	if m.IsPipeline() {
		return m, nil // no library; the server checks its steps against the store
	}
	if m.Constants != "" {
		if _, err := os.Stat(filepath.Join(dir, m.Constants)); err != nil {
			return nil, constantsError(dir, m, err)
		}
	}
	info, err := loader.CheckBundle(dir, m, m.Target)
	if err != nil {
		return nil, err
	}
	if err := info.CheckHooks(filepath.Join(dir, m.Library)); err != nil { // deploy's alone: see CheckHooks
		return nil, err
	}
	return m, nil
}

// constantsError says that the constants file dir's manifest names cannot
// be read, as the manifest's other checks do: the manifest's path, the
// field, the file's path and why.
func constantsError(dir string, m *abi.Manifest, err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		err = pe.Err // the path is said once, below
	}
	return fmt.Errorf("%s: constants: %s: %w", filepath.Join(dir, abi.ManifestFile), filepath.Join(dir, m.Constants), err)
}

// checkSteps is, for a deploy or rollback straight to the store, what a
// server checks of a pipeline's steps (pipedef.Check); tokens do not apply:
// store credentials are admin credentials.
func checkSteps(reg registry.Registry, name string, steps []abi.Step) error {
	notFound := func(err error) bool { return errors.Is(err, registry.ErrNoFunction) }
	if err := pipedef.Check(context.Background(), name, steps, reg.Get, notFound); err != nil {
		return fmt.Errorf("pipeline %s: %w", name, err)
	}
	return nil
}

// checkDirect is, for a deploy straight to the store, what a default
// server checks at deploy beyond checkDir: a pipeline's steps
// (checkSteps) and the pipelines running it (pipedef.CheckUsers; with
// force, what would fail comes back as warnings), and a host function's max_host_memory_mb against its
// constants (loader.FitsHostMemory), which a server applies where its
// workers enforce the field (the default) and no server sees here.
func checkDirect(reg registry.Registry, dir string, m *abi.Manifest, force bool) (warnings []string, err error) {
	if m.IsPipeline() {
		if err := checkSteps(reg, m.Name, m.Steps); err != nil {
			return nil, err
		}
		w, err := checkUsers(reg, "deploy", m.Name, m.Steps, force)
		if w != "" {
			warnings = []string{w}
		}
		return warnings, err
	}
	var size int64
	if m.Constants != "" {
		fi, err := os.Stat(filepath.Join(dir, m.Constants))
		if err != nil {
			return nil, constantsError(dir, m, err)
		}
		size = fi.Size()
	}
	if err := loader.FitsHostMemory(m, size, false); err != nil {
		return nil, fmt.Errorf("%s: %w", filepath.Join(dir, abi.ManifestFile), err)
	}
	return nil, nil
}

// checkUsers is, for a change straight to the store (op: a deploy, a
// rollback), the server's check of the pipelines running name
// (pipedef.CheckUsers): with land, what would fail them comes back as a
// warning and the change goes on, else as the refusal.
func checkUsers(reg registry.Registry, op, name string, steps []abi.Step, land bool) (warning string, err error) {
	how := "deployed with force"
	if op != "deploy" {
		how = "rolled back"
	}
	recs, err := reg.List(context.Background())
	if err != nil {
		err = fmt.Errorf("%s %s: the pipelines that may run it were not checked: %w", op, name, err)
		if land {
			return err.Error(), nil
		}
		return "", err
	}
	var ue *pipedef.UsersError
	if err := pipedef.CheckUsers(context.Background(), recs, name, steps, "", false); errors.As(err, &ue) {
		if land {
			return ue.Landed(how), nil
		}
		return "", fmt.Errorf("%s %s: %w: redeploy the pipelines named first, or deploy with --force and let their requests fail", op, name, err)
	}
	return "", nil
}

func deployCmd() *command {
	var ep endpoint
	var force, asJSON bool
	return &command{
		nargs: 1,
		name:  "deploy", summary: "check, pack and upload a bundle directory (plover.json, library, constants)",
		usage: "DIR [--server URL | --store URL] [--force]",
		long:  storeNote,
		example: "  make samples && plover deploy build/samples/vecadd-host\n" +
			"  plover deploy build/samples/vecadd-host --store s3://plover-bundles   # no server needed",
		flags: func(fs *flag.FlagSet) {
			ep.storeFlags(fs, "upload straight to this store (file://... or s3://bucket[/prefix]); servers pick it up within their --poll interval")
			fs.BoolVar(&force, "force", false, "deploy a new version even when the bundle equals the current one, or when it makes pipelines that run this one pass their limits (409 otherwise)")
			fs.BoolVar(&asJSON, "json", false, `print {"name","version","sha256","bytes","created"} instead`)
		},
		run: func(fs *flag.FlagSet, args []string, env *Env) error {
			if !ep.direct() {
				if err := serverRuns(ep.client(), args[0]); err != nil {
					return err
				}
			}
			dir, err := resolveBundle(args[0], "", env) // a source dir: its build/<target>
			if err != nil {
				return err
			}
			if dir != args[0] {
				fmt.Fprintf(env.Stderr, "deploying %s, built from %s\n", dir, args[0])
			}
			m, err := checkDir(dir)
			if err != nil {
				return err
			}
			b, sha, _, err := bundle.PackBytes(dir)
			if err != nil {
				return err
			}
			body, done := withProgress(bytes.NewReader(b), int64(len(b)), "uploading "+m.Name, env)
			var id string
			var warnings []string
			created := true
			if ep.direct() {
				reg, err := ep.registry()
				if err != nil {
					return err
				}
				warnings, err = checkDirect(reg, dir, m, force)
				if err != nil {
					done()
					return err
				}
				v, c, err := reg.Publish(context.Background(), m, body, sha, int64(len(b)), force)
				done()
				if err != nil {
					return err
				}
				id, created = v.ID, c
			} else {
				path := "/v1/functions/" + m.Name
				if force {
					path += "?force=true"
				}
				var fi api.FunctionInfo
				err := ep.client().upload(path, bundle.MediaType, body, int64(len(b)), uploadIdle, &fi)
				done()
				if err != nil {
					return err
				}
				id, created, warnings = fi.Version, !fi.Unchanged, fi.Warnings
			}
			printWarnings(env.Stderr, warnings)
			if asJSON {
				return printJSON(env.Stdout, map[string]any{"name": m.Name, "version": id, "sha256": sha, "bytes": len(b), "created": created})
			}
			// A deploy to a store names it: $PLOVER_STORE, exported for a
			// server, takes a deploy there without --store on the line.
			to, in := "", ""
			if ep.direct() {
				to, in = " to store "+ep.store, " in store "+ep.store
			}
			if !created {
				fmt.Fprintf(env.Stdout, "%s is unchanged%s: version %s already has these bytes (sha256 %s); --force deploys them as a new version\n", m.Name, in, id, sha[:12])
				return nil
			}
			fmt.Fprintf(env.Stdout, "deployed %s version %s (sha256 %s, %s)%s\n", m.Name, id, sha[:12], humanBytes(int64(len(b))), to)
			return nil
		},
	}
}

// serverRuns asks the server which targets its devices run (GET /healthz,
// open without a token) before anything is built or uploaded: a bundle for
// another target is refused there, after a rebuild (nvcc, seconds) and an
// upload for nothing. A server that cannot say (unreachable, unhealthy,
// older) is left to answer the deploy itself, as it checks again anyway.
func serverRuns(c *client, dir string) error {
	m, err := bundle.ReadManifest(dir)
	if err != nil || m.IsPipeline() {
		return nil // reported with the rest of the bundle's checks
	}
	q := *c
	q.http = &http.Client{Timeout: 5 * time.Second, Transport: c.http.Transport}
	var h struct {
		Devices []api.DeviceHealth `json:"devices"`
	}
	if err := q.getJSON("/healthz", &h); err != nil {
		return nil
	}
	var targets []string
	for _, d := range h.Devices {
		if d.Target == "" {
			return nil // a server that does not say
		}
		if !slices.Contains(targets, d.Target) {
			targets = append(targets, d.Target)
		}
	}
	if len(targets) == 0 {
		return nil
	}
	if err := abi.RunsOn(m.Target, targets); err != nil {
		return fmt.Errorf("%s: the server at %s would refuse it (422 invalid: %w); its /healthz lists its devices, so nothing was built or uploaded%s", dir, c.base, err, otherBuild(dir, m, targets[0]))
	}
	return nil
}

// otherBuild is what to do where dir is a function's source directory,
// whose plover.json names another target than the server's t (plover
// init's "host", say, against a GPU node): deploy its build for t, or
// build one. "" for a built bundle.
func otherBuild(dir string, m *abi.Manifest, t string) string {
	if m.Build == nil {
		return ""
	}
	built := filepath.Join(dir, BuildDir, t)
	if _, err := os.Stat(filepath.Join(built, abi.ManifestFile)); err == nil {
		return fmt.Sprintf("; its %s build is there: plover deploy %s", t, shellQuote(built))
	}
	return fmt.Sprintf("; build it for this server: plover build %s --target %s, then plover deploy %s (or set \"target\": %q in its plover.json, which plover deploy %s follows)",
		shellQuote(dir), t, shellQuote(built), t, shellQuote(dir))
}

func humanBytes(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}

func invokeCmd() *command {
	var ep endpoint
	var in, out string
	var asJSON, timing bool
	var timeout time.Duration
	return &command{
		nargs: 1,
		named: true,
		name:  "invoke", summary: "run a function on input bytes and write its output bytes",
		complete: ep.completeFunctions,
		usage:    "NAME [--in FILE|-] [--out FILE|-] [--timeout DURATION] [--json] [--timing]",
		example: "  plover invoke vecadd --in build/samples/vecadd-input.bin --out /tmp/sum.bin --timing\n" +
			"  plover invoke vecadd --in build/samples/vecadd-input.bin --json | head -c 300\n" +
			"  plover invoke cnn --in digit.bin --out scores.bin --timeout 2s   # give up after 2 s, not the server's " + defaultTimeout.String(),
		flags: func(fs *flag.FlagSet) {
			ep.serverFlag(fs)
			fs.StringVar(&in, "in", "-", "input file, - for stdin")
			fs.StringVar(&out, "out", "-", "output file, - for stdout. FILE must be writable before the request is sent, and gets the output only once it is whole: it goes to a temporary file beside FILE (readable by its owner alone), renamed over it where that is the same as writing it (FILE ours, one link, no set-id bit or extended attributes), else copied into it; a failed invoke, or one interrupted (^C, SIGTERM, SIGHUP) before the whole answer came, leaves FILE as it was; one interrupted after that gives FILE the whole output, says so, and exits as the signal's status (130 for ^C). A device, a pipe, /dev/stdout or /dev/fd/N (or a file that is stdout) is written through, at its position")
			fs.BoolVar(&asJSON, "json", false, "send a JSON request and print the JSON response (base64 output, start kind, timings)")
			fs.BoolVar(&timing, "timing", false, "print the start kind and the server's timing breakdown to stderr")
			fs.DurationVar(&timeout, "timeout", 0, "the request's deadline, queue and run (sent as X-Plover-Timeout-Ms; the server's --max-timeout, "+defaultMaxTimeout.String()+" by default, caps it); plover invoke also stops waiting "+invokeGrace.String()+" after it (0: the server's --timeout, "+defaultTimeout.String()+" by default, and plover invoke waits up to "+requestTimeout.String()+")")
		},
		run: func(fs *flag.FlagSet, args []string, env *Env) error {
			if timeout < 0 || timeout > 0 && timeout < time.Millisecond {
				return usagef(env, "invoke", "--timeout %v: want a duration of 1ms or more (or 0: the server's deadline)", timeout)
			}
			// Before stdin is read: a terminal's user typed the input
			// for nothing.
			if !asJSON && out == "-" && env.StdoutIsTerminal {
				return usagef(env, "invoke", "the output is binary and stdout is a terminal: write it with --out FILE, or ask for --json")
			}
			input, err := readInput(in, env)
			if err != nil {
				return err
			}
			return invoke(ep.client(), args[0], input, out, invokeOptions{asJSON: asJSON, timing: timing, timeout: timeout}, env)
		},
	}
}

// invokeGrace is how long plover invoke waits past its --timeout for the
// server's answer (a 504 saying why) before it gives up itself (a
// variable for tests).
var invokeGrace = 2 * time.Second

// invokeWait is how long plover invoke waits for its answer: --timeout and
// invokeGrace, or requestTimeout without --timeout (the server's deadline,
// which the CLI does not know).
func invokeWait(timeout time.Duration) time.Duration {
	if timeout > 0 {
		return timeout + invokeGrace
	}
	return requestTimeout
}

type invokeOptions struct {
	asJSON, timing bool
	timeout        time.Duration // 0: the server's
}

func readInput(path string, env *Env) ([]byte, error) {
	if path == "-" {
		if env.StdinIsTerminal {
			fmt.Fprintln(env.Stderr, "reading the input from stdin (Ctrl-D to end)")
		}
		return io.ReadAll(env.Stdin)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("--in: %w", err)
	}
	return b, nil
}

func invoke(c *client, name string, input []byte, out string, o invokeOptions, env *Env) (err error) {
	asJSON := o.asJSON
	ct, body := "application/octet-stream", input
	if asJSON {
		ct = "application/json"
		body, _ = json.Marshal(map[string][]byte{"input": input}) // []byte marshals as base64
	}
	hdr := http.Header{}
	if o.timeout > 0 {
		ms := (o.timeout + time.Millisecond - 1) / time.Millisecond
		hdr.Set("X-Plover-Timeout-Ms", strconv.FormatInt(int64(ms), 10))
	}
	sigs := catchSignals()
	defer sigs.release() // after the deferred abort
	defer func() { err = sigs.status(err) }()
	// Opened before the request: a file that cannot be written fails the
	// invoke before the function runs for nothing.
	var w io.Writer = env.Stdout
	var of *outFile
	if out != "-" {
		var err error
		if of, err = createOut(out, env); err != nil {
			return err
		}
		defer of.abort()
		w = of
	}
	sigs.pending(of)
	sig := sigs.ctx
	if sig.Err() != nil { // while FILE was opened (a FIFO waiting for its reader)
		return errors.New("interrupted before the request was sent")
	}
	// The wait is the context's alone: the client's requestTimeout would
	// end a --timeout longer than it (a server with a raised --max-timeout).
	wait := invokeWait(o.timeout)
	ctx, cancel := context.WithTimeout(sig, wait)
	defer cancel()
	c = c.bounded(wait)
	resp, err := c.doRequest(ctx, http.MethodPost, "/v1/functions/"+name+"/invoke", ct, bytes.NewReader(body), int64(len(body)), hdr)
	if sig.Err() != nil {
		return errors.New("interrupted before the answer came: the function may have run")
	}
	if err != nil {
		return invokeTimeoutError(ctx, name, o.timeout, err)
	}
	defer resp.Body.Close()
	if o.timing {
		// Its error unchecked: a stderr whose reader has gone fails no
		// invoke whose output goes elsewhere (outSignals.pending).
		fmt.Fprintf(env.Stderr, "start=%s version=%s\nServer-Timing: %s\n", resp.Header.Get("X-Plover-Start"), resp.Header.Get("X-Plover-Version"), resp.Header.Get("Server-Timing"))
	}
	fw := &fileutil.Writer{W: w}
	if n, err := io.Copy(fw, resp.Body); err != nil {
		whole := of != nil && of.whole()
		switch {
		case ctx.Err() != nil && sig.Err() == nil && fw.Err == nil:
			return invokeCutError(name, o.timeout, n, out, whole)
		case fw.Err != nil && out == "-":
			return fmt.Errorf("writing the output to stdout: %w", fw.Err)
		case fw.Err != nil && whole:
			return fmt.Errorf("--out %s: writing the output: %w (the file is left as it was)", out, fw.Err)
		case fw.Err != nil:
			return fmt.Errorf("--out %s: writing the output: %w", out, fw.Err)
		}
		left := ""
		if whole {
			left = fmt.Sprintf(" (--out %s left as it was)", out)
		}
		if sig.Err() != nil {
			return fmt.Errorf("interrupted while the answer came%s", left)
		}
		return fmt.Errorf("reading the response: %w%s", err, left)
	}
	if of != nil {
		return sigs.commit(of)
	}
	return nil
}

// invokeCutError says that the answer stopped coming at the end of
// invoke's wait: n bytes of it had come, and where they went. (It said
// "no answer within --timeout" of an answer cut midway.)
func invokeCutError(name string, timeout time.Duration, n int64, out string, whole bool) error {
	limit := fmt.Sprintf("%v, the longest plover invoke waits without --timeout", requestTimeout)
	if timeout > 0 {
		limit = fmt.Sprintf("--timeout %v (and %v more for the server's own answer)", timeout, invokeGrace)
	}
	where := fmt.Sprintf("--out %s left as it was", out)
	switch {
	case out == "-":
		where = "written to stdout"
	case !whole:
		where = "written to --out " + out
	}
	return fmt.Errorf("%s: the answer was cut at %s: %d bytes of it had come (%s); gave up waiting", name, limit, n, where)
}

// invokeTimeoutError says in plain words that a request passed its
// --timeout: the server's 504, or no answer at all within the grace.
func invokeTimeoutError(ctx context.Context, name string, timeout time.Duration, err error) error {
	var ae *apiError
	switch {
	case errors.As(err, &ae) && ae.Status == http.StatusGatewayTimeout:
		limit := "the server's --timeout (" + defaultTimeout.String() + " unless plover serve was given another)"
		if timeout > 0 {
			limit = fmt.Sprintf("--timeout %v (or the server's --max-timeout, if shorter)", timeout)
		}
		return fmt.Errorf("%s did not finish within %s: the server stopped waiting (504 %s: %s); raise --timeout if the function needs longer, or look for a kernel that does not end (plover run DIR --timeout shows it on your machine)",
			name, limit, ae.Code, ae.Message)
	case timeout > 0 && ctx.Err() != nil:
		return fmt.Errorf("%s: no answer within --timeout %v (and %v more for the server's own answer): gave up waiting; the server may still be running the request", name, timeout, invokeGrace)
	}
	return err
}

func lsCmd() *command {
	var ep endpoint
	var asJSON bool
	var output string
	return &command{
		nargs: 0,
		name:  "ls", summary: "list deployed functions",
		usage: "[-o wide|json] [--json]",
		example: "  plover ls            # one line a function, within 100 columns for names up to 24 characters\n" +
			"  plover ls -o wide    # and share, priority, device time, memory, starts, worker processes\n" +
			"  plover ls -o json    # the server's JSON (as --json)",
		shorthands: map[string]string{"output": "o"},
		flags: func(fs *flag.FlagSet) {
			ep.serverFlag(fs)
			fs.BoolVar(&asJSON, "json", false, "print the server's JSON (as -o json)")
			fs.StringVar(&output, "output", "", "wide: every column (share, priority, device time, memory, starts, worker processes); json: the server's JSON")
		},
		run: func(fs *flag.FlagSet, args []string, env *Env) error {
			switch output {
			case "", "wide":
			case "json":
				asJSON = true
			default:
				return usagef(env, "ls", "-o %q: want wide or json (or nothing: the short table)", output)
			}
			var resp struct {
				Functions []api.FunctionInfo `json:"functions"`
			}
			if err := ep.client().getJSON("/v1/functions", &resp); err != nil {
				return err
			}
			if asJSON {
				return printJSON(env.Stdout, resp)
			}
			return writeLs(env.Stdout, resp.Functions, output == "wide", time.Now())
		},
	}
}

// writeLs prints plover ls's table: the short one fits 100 columns for
// names up to 24 characters; wide has every column. 4XX/5XX are the
// failed requests, client errors apart from the function's or the
// server's, as /metrics counts them by code.
func writeLs(w io.Writer, fns []api.FunctionInfo, wide bool, now time.Time) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	if !wide {
		fmt.Fprintln(tw, "NAME\tVERSION\tON\tBUSY/IDLE\tQUEUE\tREQUESTS\t4XX/5XX\tMEAN\tAGE")
		for _, f := range fns {
			on := f.Target
			if f.Kind == abi.KindPipeline {
				on = "pipeline" // its steps: -o wide
			} else if on == "" {
				on = "-"
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%d/%d\t%d\t%d\t%d/%d\t%s\t%s\n", f.Name, shortID(f.Version), on, f.Busy, f.Idle, f.Queue,
				f.Requests, f.ClientErrors, f.Errors, mean(f), age(now, f.Created))
		}
		return tw.Flush()
	}
	fmt.Fprintln(tw, "NAME\tVERSION\tRUNS ON\tLOADED\tSHARE\tDEVICE (TIME NOW)\tIO\tBUSY/IDLE\tQUEUE\tMEMORY\tREQUESTS\t4XX/5XX\tMEAN\tCOLD/WARM/HOT\tWORKER (PID PSS/RSS THREADS)\tDEPLOYED")
	for _, f := range fns {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%v\t%s %s\t%s %.0f%%\t%s\t%d/%d\t%d\t%s\t%d\t%d/%d\t%s\t%d/%d/%d\t%s\t%s\n", f.Name, shortID(f.Version), runsOn(f), f.Loaded,
			strconv.FormatFloat(f.Share, 'g', -1, 64), f.Priority, roundDuration(time.Duration(f.DeviceSeconds*1e9)), 100*f.DeviceFraction,
			roundDuration(time.Duration(f.IOSeconds*1e9)),
			f.Busy, f.Idle, f.Queue, humanBytes(f.Memory), f.Requests, f.ClientErrors, f.Errors, mean(f),
			f.Cold, f.Warm, f.Hot, workers(f.Workers), f.Created.Local().Format(time.DateTime))
	}
	return tw.Flush()
}

// mean is f's mean latency, or "-" when no request succeeded (a mean of
// none, not 0).
func mean(f api.FunctionInfo) string {
	if f.Requests-f.ClientErrors-f.Errors <= 0 {
		return "-"
	}
	return roundDuration(time.Duration(f.MeanUs) * time.Microsecond)
}

// roundDuration keeps three significant digits of d (1.23ms, 45.7s), whole
// seconds from a minute (1m9s), whole minutes from an hour (2h5m).
func roundDuration(d time.Duration) string {
	switch {
	case d <= 0:
		return "0"
	case d >= time.Hour:
		return strings.TrimSuffix(d.Round(time.Minute).String(), "0s")
	case d >= time.Minute:
		return d.Round(time.Second).String()
	}
	unit := time.Duration(1)
	for v := d; v >= 1000; v /= 10 {
		unit *= 10
	}
	return d.Round(unit).String()
}

// age says how long ago t was, in the largest whole unit: 40s, 12m, 5h, 3d
// (kubectl's AGE: the short table has no room for "ago").
func age(now, t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	d := now.Sub(t)
	switch {
	case d < time.Minute:
		return fmt.Sprintf("%ds", max(0, int(d/time.Second)))
	case d < time.Hour:
		return fmt.Sprintf("%dm", int(d/time.Minute))
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh", int(d/time.Hour))
	}
	return fmt.Sprintf("%dd", int(d/(24*time.Hour)))
}

// runsOn is where plover ls says a function runs: its device kind, or for
// a pipeline its steps ("pipeline: normalize > cnn > top1").
func runsOn(f api.FunctionInfo) string {
	if f.Kind == abi.KindPipeline {
		names := make([]string, len(f.Steps))
		for i, s := range f.Steps {
			names[i] = s.String()
		}
		return "pipeline: " + strings.Join(names, " > ")
	}
	if f.Target == "" {
		return "-" // deployed before records kept the target
	}
	return f.Target
}

func shortID(id string) string {
	if i := strings.IndexByte(id, '-'); i > 0 {
		return id[:i]
	}
	return id
}

func rmCmd() *command {
	var ep endpoint
	var asJSON, force bool
	return &command{
		nargs: 1,
		named: true,
		name:  "rm", summary: "delete a function or pipeline (its in-flight requests finish first)",
		complete: ep.completeFunctions,
		usage:    "NAME [--force]",
		example:  "  plover rm vecadd\n  plover rm cnn --force   # even though pipelines run it: their requests then fail at its step",
		flags: func(fs *flag.FlagSet) {
			ep.serverFlag(fs)
			fs.BoolVar(&force, "force", false, "delete a function even if pipelines name it as a step (409 otherwise)")
			fs.BoolVar(&asJSON, "json", false, `print {"deleted": NAME} instead`)
		},
		run: func(fs *flag.FlagSet, args []string, env *Env) error {
			path := "/v1/functions/" + args[0]
			if force {
				path += "?force=true"
			}
			if err := ep.client().sendJSON(http.MethodDelete, path, "", nil, nil); err != nil {
				return err
			}
			if asJSON {
				return printJSON(env.Stdout, map[string]string{"deleted": args[0]})
			}
			fmt.Fprintf(env.Stdout, "deleted %s\n", args[0])
			return nil
		},
	}
}

// workers renders a function's worker processes for plover ls: "-" when it
// runs in the server (--isolation none) or is not loaded.
func workers(ws []api.WorkerInfo) string {
	if len(ws) == 0 {
		return "-"
	}
	var b strings.Builder
	for i, w := range ws {
		if i > 0 {
			b.WriteString(", ")
		}
		// PSS first: what the worker costs the machine (its share of the
		// pages it shares with other workers); RSS counts those whole.
		pss := "-" // unreadable unless the server is root
		if w.PSSBytes > 0 {
			pss = humanBytes(w.PSSBytes)
		}
		fmt.Fprintf(&b, "%d %s/%s %d", w.PID, pss, humanBytes(w.RSSBytes), w.Threads)
	}
	return b.String()
}
