package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"google.golang.org/grpc"

	"github.com/plover-run/plover/bundle"
	"github.com/plover-run/plover/device"
	"github.com/plover-run/plover/engine"
	"github.com/plover-run/plover/evict"
	"github.com/plover-run/plover/frontdoor"
	"github.com/plover-run/plover/gate"
	"github.com/plover-run/plover/grpcapi"
	"github.com/plover-run/plover/httpapi"
	"github.com/plover-run/plover/ioshare"
	"github.com/plover-run/plover/netguard"
	"github.com/plover-run/plover/objectstore"
	"github.com/plover-run/plover/pipeline"
	"github.com/plover-run/plover/registry"
	"github.com/plover-run/plover/repository"
	"github.com/plover-run/plover/reqmetrics"
	"github.com/plover-run/plover/sched"
	"github.com/plover-run/plover/tracing"
	"github.com/plover-run/plover/worker"
	"github.com/plover-run/plover/worker/contain"
)

// defaultTimeout is plover serve's --timeout unless given: the deadline of
// a request (queue and run), which clients are told of by name.
const defaultTimeout = 30 * time.Second

// defaultMaxTimeout is plover serve's --max-timeout: the longest deadline a
// client may ask for.
const defaultMaxTimeout = 10 * time.Minute

// defaultDataDir is --data when neither the flag nor $PLOVER_DATA gives
// one. It is resolved when serve starts, not as the flag's default, so that
// help and the generated reference read the same on every machine.
func defaultDataDir() string {
	if d := os.Getenv("XDG_DATA_HOME"); d != "" {
		return filepath.Join(d, "plover")
	}
	if h, err := os.UserHomeDir(); err == nil {
		return filepath.Join(h, ".local", "share", "plover")
	}
	return filepath.Join(os.TempDir(), "plover")
}

type serveFlags struct {
	cpus                                             float64 // the CPUs the runtime chose (serverProcs), not a flag; 0: not read, GOMAXPROCS's
	listen, data, device, store, logFormat, logLevel string
	isolation, workerUser, ioShares, workerScope     string
	memoryGroups                                     string
	checked                                          bool
	standby, standbyMax                              int
	workerMaxMemMB, maxPinnedMB                      int64
	workerMaxPids                                    int
	mps, hostDevice, pidNamespaces                   bool
	minInstances, maxInstances, maxQueue, maxBodyMB  int
	idleTTL, timeout, maxTimeout                     time.Duration
	memLimitMB, cacheMB                              int64
	poll                                             time.Duration
	grace, readTimeout, writeTimeout                 time.Duration
	s3                                               objectstore.S3Options
	authFile, tlsCert, tlsKey, metricsListen         string
	grpcListen                                       string
	insecureNoAuth                                   bool
	console                                          bool
	origins                                          originsFlag
	maxConns, maxConnsPerClient                      int
	maxBodyMemMB                                     int64
	maxPipeMemMB                                     int64
	maxSpoolMB                                       int64
	sched, schedPolicy, evictPolicy                  string
	deviceRuns, floodRuns, sharedRuns, ioSlots       int
	copyPieceKiB                                     int
	reserveHold                                      time.Duration
	cpuWeights                                       bool
	lightBoost                                       float64
	lightSlice                                       time.Duration
	cgroupRoot                                       string
	repository, repositoryName                       string
	repositoryPoll, repositorySettle                 time.Duration
}

// originsFlag is --origin: repeatable, each value one origin or several
// separated by commas (an origin has none), so that PLOVER_ORIGIN can name
// several. Each is checked and kept as browsers write it (ParseOrigin).
type originsFlag []string

func (o *originsFlag) String() string { return strings.Join(*o, ",") }

// Type is what --help shows for the flag's value (pflag asks it).
func (o *originsFlag) Type() string { return "URL" }

func (o *originsFlag) Set(s string) error {
	for _, v := range strings.Split(s, ",") {
		n, err := httpapi.ParseOrigin(strings.TrimSpace(v))
		if err != nil {
			return err
		}
		*o = append(*o, n)
	}
	return nil
}

func serveCmd() *command {
	var f serveFlags
	return &command{
		nargs: 0,
		name:  "serve", summary: "run a Plover server",
		usage: "[flags]",
		example: "  plover serve                                  # 127.0.0.1:8080, data under ~/.local/share/plover\n" +
			"  plover serve --listen 127.0.0.1:9000 --data /tmp/plover --device host",
		flags: func(fs *flag.FlagSet) {
			fs.StringVar(&f.listen, "listen", "127.0.0.1:8080", "address to listen on; port 0 picks a free one")
			fs.StringVar(&f.data, "data", "", "data directory: store (unless --store) and node bundle cache (default $XDG_DATA_HOME/plover, else ~/.local/share/plover)")
			fs.StringVar(&f.device, "device", "auto", "device: auto (a GPU if one works, else host) | host | cuda")
			fs.BoolVar(&f.checked, "checked", false, "host device: checked mode, as plover run has by default: an access past the end of a request's in, tmp or out fails the request naming the entry and the buffer (guard pages; a copy in and out per request)")
			fs.StringVar(&f.isolation, "isolation", "process", "where functions run: process (a worker process per function version) | none (in the server: one trusted tenant)")
			fs.StringVar(&f.memoryGroups, "memory-groups", "auto", "a memory cgroup per worker process (--isolation process), backing max_host_memory_mb over its whole process tree where cgroups can be written: auto (the host device's workers only: what a CUDA worker's driver memory adds to its group is not yet measured, and a false kill of a GPU function is worse than the gap) | on (every worker's, CUDA's too: for a GPU run to compare) | off (none: each worker's own resident memory alone is checked)")
			fs.StringVar(&f.workerScope, "worker-scope", "function", "which functions share a worker process (--isolation process): function (each function version a worker of its own) | tenant (a tenant's functions, those one token deployed, share one worker per device, a load into it being no process start; never two tenants in one; not with MPS)")
			fs.IntVar(&f.standby, "standby-workers", -1, "idle worker processes kept started per device, device open, for fast cold starts (--isolation process); -1: 8 on the host device (about 2 MiB each), 1 on a GPU (each holds a CUDA context); 0: none; at most 256")
			fs.IntVar(&f.standbyMax, "standby-max", 0, "the most idle workers the pool grows to per device while cold starts come in bursts: as many as loads took in the busiest second of the last minute (0: 16 on the host device, 4 on a GPU; none when --standby-workers is 0; at most 256)")
			fs.Int64Var(&f.workerMaxMemMB, "worker-max-memory", 0, "resident memory in MiB a worker may hold when its manifest sets no max_host_memory_mb, the server's request slots it maps not counted; past it the worker is killed (0: no limit)")
			fs.IntVar(&f.workerMaxPids, "worker-max-pids", defaultWorkerMaxPids, "processes and threads a worker and all it starts may have at once (--isolation process); past it their fork and thread creation fail, and the server and other functions are untouched: a pids cgroup per worker where cgroups can be written, else RLIMIT_NPROC, which bounds all workers of one uid together (0: no bound; at most 4194304; the default is 512, or the worker's own threads and 256 on a machine of over 240 CPUs). Each instance holds a thread of its worker: a function may have this less the worker's own threads (one per CPU, and 16)")
			fs.Int64Var(&f.maxPinnedMB, "max-pinned-memory", 2048, "host memory in MiB a GPU's request slots may keep pinned (page-locked whole for their worker's life, whatever a request touches); past it no more pool slots are made and a body is read into ordinary memory, then copied into its instance's own slot (0: no bound)")
			fs.BoolVar(&f.hostDevice, "host-device", true, "with GPUs, also open the host device, so host-target bundles (a pipeline's CPU steps) run beside cuda ones; each bundle runs on the device its manifest's target names")
			fs.BoolVar(&f.mps, "mps", false, "CUDA: start each function's worker with its MPS limits (gpu_share, its memory budget); on by itself when an MPS control daemon runs")
			fs.BoolVar(&f.pidNamespaces, "pid-namespaces", true, "give each worker a PID namespace of its own (--isolation process; needs CAP_SYS_ADMIN, and not with MPS), so that whatever a function starts, a daemon that left its process group included, ends with its worker; false, or where it cannot be had: workers and the server are child subreapers, and the server ends what a worker leaves (the log says which)")
			fs.StringVar(&f.workerUser, "worker-user", "nobody", "user workers run as when the server runs as root (a name or UID:GID)")
			fs.StringVar(&f.store, "store", "", "object store URL: file:///path or s3://bucket[/prefix] (default file://DATA/store)")
			s3Flags(fs, &f.s3)
			fs.IntVar(&f.minInstances, "min-instances", 0, "instances kept warm per function when its manifest sets no min_instances (at most the function's max_instances, else --max-instances)")
			fs.IntVar(&f.maxInstances, "max-instances", 8, "instances per function when its manifest sets no max_instances (more than --device-runs, so a function keeps runs queued for the device scheduler); at most 1024, and what one worker holds under --worker-max-pids")
			fs.IntVar(&f.maxQueue, "max-queue", 64, "requests waiting per function when its manifest sets no max_queue; more get 429 (at most 1048576)")
			fs.DurationVar(&f.idleTTL, "idle-ttl", 5*time.Minute, "release an instance idle this long; unload a function with none left (manifest idle_ttl overrides; negative: never; under 10ms is refused)")
			fs.DurationVar(&f.timeout, "timeout", defaultTimeout, "request deadline (queue + run) when the client asks for none (X-Plover-Timeout-Ms, timeout_ms, a gRPC deadline)")
			fs.DurationVar(&f.maxTimeout, "max-timeout", defaultMaxTimeout, "the longest deadline a client may ask for: a longer one is cut to it (at least --timeout)")
			fs.IntVar(&f.maxBodyMB, "max-body", 256, "largest request body in MiB (inputs and bundles)")
			fs.Int64Var(&f.memLimitMB, "memory-limit", 0, "device memory budget in MiB (0: the device's memory; on the host device its RAM or 7/8 of the server's cgroup memory limit, whichever is less)")
			fs.Int64Var(&f.cacheMB, "cache-limit", 10240, "node bundle cache size in MiB; bundles not in use are evicted LRU (0: no limit)")
			fs.DurationVar(&f.poll, "poll", 2*time.Second, "how often to re-read function records for deploys and rollbacks made elsewhere (0: never; else at least 100ms)")
			fs.DurationVar(&f.grace, "grace", 10*time.Second, "on SIGTERM/SIGINT, how long in-flight and queued requests may finish; then those not yet running are refused (503), the rest cut (0: at once)")
			fs.DurationVar(&f.readTimeout, "read-timeout", 60*time.Second, "how long a client may take to send a request: HTTP headers and body (408 past it), a gRPC connection's handshake (closed past it) and a call's message after its headers (the call is cancelled)")
			fs.DurationVar(&f.writeTimeout, "write-timeout", 60*time.Second, "how long an answer may take to be written once made: an HTTP response, and a gRPC answer written from its function's slot (the connection is closed past it)")
			fs.StringVar(&f.authFile, "auth-file", "", "bearer tokens with scopes (NAME SCOPES SHA256 [FUNCTIONS] per line; plover token new makes one); re-read on SIGHUP")
			fs.BoolVar(&f.console, "console", true, "serve the web console at /ui/ (its files need no token; its API calls carry the user's)")
			fs.Var(&f.origins, "origin", "a further origin (http[s]://HOST[:PORT]) whose pages the server takes as its own, as a browser's Origin names it: the proxy's, behind a plain-HTTP proxy that rewrites Host (repeatable, or comma-separated; X-Forwarded-Host is never trusted)")
			fs.BoolVar(&f.insecureNoAuth, "insecure-no-auth", false, "listen on a non-loopback address without --auth-file: anyone who reaches the port can deploy native code")
			fs.StringVar(&f.tlsCert, "tls-cert", "", "PEM certificate (chain) for HTTPS, with --tls-key; re-read on SIGHUP")
			fs.StringVar(&f.tlsKey, "tls-key", "", "PEM private key for --tls-cert")
			fs.StringVar(&f.grpcListen, "grpc-listen", "", "also serve the Open Inference Protocol over gRPC (inference.GRPCInferenceService) on this address (8001 is the usual port); same tokens, TLS, connection cap and metrics as --listen (off by default)")
			fs.StringVar(&f.metricsListen, "metrics-listen", "", "also serve GET /metrics, without authentication, on this address (for a scraper on a private network)")
			fs.IntVar(&f.maxConns, "max-conns", 0, "open connections at most; more are closed at once (0: derived from the descriptor limit; at most that limit less 1024)")
			fs.IntVar(&f.maxConnsPerClient, "max-conns-per-client", 0, "open connections at most from one client address, so one client cannot hold every slot (0: half of --max-conns; behind a proxy, every connection is the proxy's: raise it)")
			fs.Int64Var(&f.maxBodyMemMB, "max-body-memory", 1024, "MiB of request bodies (and gRPC inference messages) held in memory at once; past it requests wait up to 5 s, then get 503 (0: no limit)")
			fs.Int64Var(&f.maxSpoolMB, "max-spool", 0, "MiB of deploys' uploads on the node's disk at once (DATA/spool), taken as they arrive, a token's at most all but --max-body (several together may hold all of it): an upload past it waits up to --timeout, then gets 503; at least --max-body (0: 4 times --max-body, at least 1024)")
			fs.Int64Var(&f.maxPipeMemMB, "max-pipeline-memory", 1024, "MiB of pipeline steps' outputs held in memory at once: each pipeline request holds the most its steps' outputs take at once (by their out_bytes) while it runs; past it requests wait up to 5 s, then get 503; a request needing all of it or more runs alone, once no other holds any, waiting out of line so that it holds up no other (0: no limit)")
			fs.StringVar(&f.schedPolicy, "sched-policy", sched.DefaultPolicy, "the order in which queued runs get the device, one of the registered policies: "+strings.Join(sched.Policies(), ", ")+" (wfq: weighted fair by device time within priority classes; fifo: as they came, shares and priorities ignored)")
			fs.StringVar(&f.evictPolicy, "evict", evict.Default, "what goes first when a device is short of memory, one of the registered policies: "+strings.Join(evict.Names(), ", ")+" (idle instances before programs; lru: least recently used first; largest: the most memory first)")
			fs.StringVar(&f.sched, "sched", "fair", "how runs share a device: fair (by manifest share and priority, with slots kept for functions between requests) | fair-no-reserve (every slot to whoever waits) | off (as they come: for comparison)")
			fs.BoolVar(&f.cpuWeights, "cpu-weights", true, "give each worker a CPU weight that follows its function's share and priority (--isolation process): a cgroup of its own where cgroups can be written, else a nice level per thread (/healthz says which)")
			fs.Float64Var(&f.lightBoost, "light-boost", worker.LightBoost, "with --cpu-weights, a worker that used under half its weight's part of the CPUs in the last 250 ms runs at this many times its weight until it uses three quarters of it, so that a light function's runs beside a flood start at once rather than after the flood's slices; 1: off")
			fs.DurationVar(&f.lightSlice, "light-slice", worker.LightSlice, "with --cpu-weights by nice levels and the light boost, on Linux 6.12 or later: a boosted worker's threads and the server's run with this EEVDF slice (the kernel's default is 0.7 ms times 1 + log2 of the CPUs, at most 8), so that a light function's wakeups beside a flood run at once rather than after a flood's thread ends its slice; 0: off (100us to 100ms, and shorter than the kernel's default: the log at start says where it is not in force)")
			fs.StringVar(&f.cgroupRoot, "cgroup-root", "/sys/fs/cgroup", "where the cgroup hierarchy is mounted (for --cpu-weights, --worker-max-pids and the workers' memory groups)")
			fs.IntVar(&f.deviceRuns, "device-runs", 0, "runs on a device at once, the rest queue in the server (0: twice the host device's CPUs, or 4 per GPU; at most 4096)")
			fs.DurationVar(&f.reserveHold, "reserve-hold", sched.DefaultRecent, "how long after a light function's last run (one at a time) the slots kept for light functions stay kept from floods, on every device and in the server's I/O; a function called less often finds the floods in every slot (shorter: floods lose less after a light function's last request)")
			fs.IntVar(&f.sharedRuns, "shared-runs", 0, "while two or more functions want a device, the runs floods may have on it together (on every device; a light function's runs in its kept slots not counted), the rest queued in the order of their shares: on the host device, runs past its CPUs are split by the OS, not by share (0: the host device's CPUs and one; every run on a GPU)")
			fs.IntVar(&f.floodRuns, "flood-runs", 0, "while a light function (one request at a time) is about, the runs other functions may have on a device together, below --device-runs less the slots kept for light ones: on a GPU, whose copies and kernels in flight are not preempted, a light run waits behind each (0: all but the kept slots)")
			fs.IntVar(&f.copyPieceKiB, "copy-piece", 0, "KiB: on a CUDA device each run's copies between host and device are issued as async pieces of at most this size, back to back on its stream (on an H200 it shortened a light function's tail beside large-body floods only together with --flood-runs 1: README); ignored on the host device (0: whole copies)")
			fs.StringVar(&f.ioShares, "io-shares", "auto", "read request bodies and write answers a piece at a time in their functions' turns, by the same shares as device runs, each piece at its function's CPU weight: on | off (as they come; the device runs still scheduled) | auto (on where the server's threads can be weighed as the workers': by nice level where the workers' weights are nice levels, by moving a piece's thread into a CPU group at its function's weight under cgroup v1; off under cgroup v2, where on keeps the server's weight, or without CPU weights)")
			fs.IntVar(&f.ioSlots, "io-slots", 0, "pieces of functions' bytes the server reads or writes at once (256 KiB each), the rest waiting in their clients' sockets for their functions' turns, one kept for light functions (none with --sched fair-no-reserve; 0: the CPUs; --sched off moves bytes as they come)")
			fs.StringVar(&f.repository, "repository", "", "serve the model repository DIR (Triton's --model-repository, KServe's /mnt/models): DIR/NAME/ is a bundle directory or holds version folders DIR/NAME/1/, DIR/NAME/2/ (the highest current), or DIR is one bundle; each is deployed as plover deploy would, and /v2/repository/index, load and unload serve it")
			fs.StringVar(&f.repositoryName, "repository-name", "", "when --repository is one bundle directory, the function's name (KServe's model name); default: its manifest's")
			fs.DurationVar(&f.repositoryPoll, "repository-poll", 0, "scan --repository again this often (at least 100ms): a new version folder becomes current, a changed bundle is redeployed, a removed folder's function is removed (0: at start, and again only while a folder settles or a deploy or delete is retried, or when an index sees an unloaded model loaded on another node; each scan acts on every folder)")
			fs.DurationVar(&f.repositorySettle, "repository-settle", 2*time.Second, "a --repository folder loads once none of its files changed for this long (and, with --repository-poll, two scans saw it the same): a folder being copied is never loaded half-copied")
			fs.StringVar(&f.logFormat, "log-format", "text", "log format: text | json")
			fs.StringVar(&f.logLevel, "log-level", "info", "log level: debug | info | warn | error")
		},
		run: func(fs *flag.FlagSet, args []string, env *Env) error {
			return serve(&f, env)
		},
	}
}

func newLogger(format, level string, env *Env) (*slog.Logger, error) {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("--log-level %q: want debug, info, warn or error", level)
	}
	opts := &slog.HandlerOptions{Level: lv}
	switch format {
	case "text":
		return slog.New(slog.NewTextHandler(env.Stderr, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(env.Stderr, opts)), nil
	}
	return nil, fmt.Errorf("--log-format %q: want text or json", format)
}

func serve(f *serveFlags, env *Env) error {
	sc, evictor, err := schedFlags(f, env)
	if err != nil {
		return err
	}
	if err := checkServeFlags(f, env); err != nil {
		return err
	}
	if f.data == "" {
		f.data = defaultDataDir()
	}
	log, err := newLogger(f.logFormat, f.logLevel, env)
	if err != nil {
		return err
	}
	f.cpus = serverProcs(log)
	ctx, force := stopSignals()
	// SIGHUP reloads tokens and certificate; caught from the start, so one
	// sent while the server starts does not kill it.
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	n, err := openNode(ctx, f, sc, evictor, log)
	if err == nil && ctx.Err() != nil {
		n.close()
		err = ctx.Err()
	}
	if err != nil {
		if ctx.Err() != nil {
			// A stop signal while the node opened (an S3 store slow to
			// answer, a GPU's driver starting): nothing was served, so
			// nothing was cut, and the stop is what the operator asked
			// for, not a failure to start. No listener opens.
			log.Info("stopped by a signal while starting: nothing was served", "during", err)
			return nil
		}
		return err
	}
	// Until the transports serve, a failure (a --listen address in use, a
	// certificate that does not load) closes the node: its workers'
	// groups outlive the process else.
	serving := false
	defer func() {
		if !serving {
			n.close()
		}
	}()
	reg := prometheus.NewRegistry()
	reg.MustRegister(n.eng.Collector(), collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	front, err := newFrontDoor(f, log, reg)
	if err != nil {
		return err
	}
	// Reloads go on through the drain, to serve's return: a SIGHUP then
	// (a certificate's renewal, a log rotation) must not end the process
	// under its in-flight requests, as the signal's default would.
	life, endLife := context.WithCancel(context.Background())
	defer endLife()
	go front.reloadOnHUP(life, hup)
	// Traces, when OpenTelemetry's environment asks for them.
	tr, err := tracing.FromEnv(ctx, Version, log)
	if err != nil {
		return fmt.Errorf("tracing: %w", err)
	}
	if tr != nil {
		log.Info("tracing requests (OpenTelemetry)", "exporter", tr.Where)
		defer flushSpans(tr, log)
	}
	t, err := startTransports(ctx, f, n, front, newDoor(f, n, front, reg, tr, log), reg, log)
	if err != nil {
		return err
	}
	bg, stopBackground := context.WithCancel(ctx)
	defer stopBackground()
	serving = true // the drain closes the node from here, or leaves it to the exit
	n.background(bg, f, t, log)
	select {
	case err := <-t.errc:
		// A transport's accept loop ended (its listener failed): the
		// other's calls, and the requests this one had begun, drain as
		// for a signal, and the node closes, rather than the process
		// ending under them with its workers' groups left behind.
		if err == nil {
			err = errors.New("its listener closed")
		}
		log.Error("a server stopped accepting: draining the rest", "error", err)
		stopBackground()
		if derr := n.drain(force, f, t, log); derr != nil {
			log.Warn("the drain after the failure", "error", derr)
		}
		return fmt.Errorf("server stopped: %w", err)
	case <-ctx.Done():
	}
	return n.drain(force, f, t, log)
}

// stopSignals is ended by the first SIGINT or SIGTERM (the drain begins)
// and force by the second (an operator's second Ctrl-C: the drain ends at
// once, as at the end of --grace). One channel takes both, so that no
// second signal falls between two registrations.
func stopSignals() (stop, force context.Context) {
	stop, stopped := context.WithCancel(context.Background())
	force, forced := context.WithCancel(context.Background())
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	go func() {
		<-sigs
		stopped()
		<-sigs
		forced()
		// A third takes the signals' default: the process ends, whatever
		// the cleanup after the drain is waiting for.
		signal.Stop(sigs)
	}()
	return stop, force
}

// schedFlags checks the flags that shape the devices' schedulers and
// eviction, and assembles them.
func schedFlags(f *serveFlags, env *Env) (engine.SchedConfig, evict.Evictor, error) {
	sc := engine.SchedConfig{MaxRuns: f.deviceRuns, FloodRuns: f.floodRuns, SharedRuns: f.sharedRuns, ReserveHold: f.reserveHold, Policy: f.schedPolicy, IO: ioshare.Config{Slots: f.ioSlots}}
	if _, err := sched.NewPolicy(f.schedPolicy, 0); err != nil {
		return sc, nil, usagef(env, "serve", "--sched-policy: %v", err)
	}
	evictor, err := evict.Lookup(f.evictPolicy)
	if err != nil {
		return sc, nil, usagef(env, "serve", "--evict: %v", err)
	}
	switch f.sched {
	case "fair":
	case "fair-no-reserve":
		sc.NoReserve = true
	case "off":
		sc.Off = true
	default:
		return sc, nil, usagef(env, "serve", "--sched %q: want fair, fair-no-reserve or off", f.sched)
	}
	if f.deviceRuns < 0 {
		return sc, nil, usagef(env, "serve", "--device-runs %d: want 0 (the device default) or more", f.deviceRuns)
	}
	if f.sharedRuns < 0 {
		return sc, nil, usagef(env, "serve", "--shared-runs %d: want 0 (the device's default) or more", f.sharedRuns)
	}
	if f.floodRuns < 0 {
		return sc, nil, usagef(env, "serve", "--flood-runs %d: want 0 (all runs but the reserve) or more", f.floodRuns)
	}
	if f.reserveHold <= 0 {
		return sc, nil, usagef(env, "serve", "--reserve-hold %v: want a positive duration", f.reserveHold)
	}
	if f.lightSlice != 0 && (f.lightSlice < 100*time.Microsecond || f.lightSlice > 100*time.Millisecond) {
		return sc, nil, usagef(env, "serve", "--light-slice %v: want 0 (off) or 100us to 100ms (the kernel's bounds)", f.lightSlice)
	}
	if f.ioSlots < 0 {
		return sc, nil, usagef(env, "serve", "--io-slots %d: want 0 (the CPUs) or more", f.ioSlots)
	}
	switch f.ioShares {
	case "auto", "on", "off":
	default:
		return sc, nil, usagef(env, "serve", "--io-shares %q: want auto, on or off", f.ioShares)
	}
	return sc, evictor, nil
}

// node is what plover serve runs requests on: its store, devices (with
// their CPU groups) and the engine over them.
type node struct {
	store objectstore.Store
	devs  []device.Device
	cpu   *worker.CPUGroups
	pids  *worker.PidGroups
	mem   *worker.MemGroups
	eng   *engine.Engine
	repo  *repository.Repository // nil: no --repository

	// repoDone is closed once the repository's scans ended (at the
	// shutdown), so that the engine closes under no deploy.
	repoDone chan struct{}
	// dataLock holds --data for this server (lockData) until close.
	dataLock *os.File
}

// openNode opens the store, the bundle cache and spool, and the devices,
// and starts the engine over them.
func openNode(ctx context.Context, f *serveFlags, sc engine.SchedConfig, evictor evict.Evictor, log *slog.Logger) (_ *node, err error) {
	if err := repositoryFlags(f); err != nil {
		return nil, err
	}
	n := &node{}
	defer func() {
		if err != nil {
			n.close() // as far as it got: the workers' groups outlive the process else
		}
	}()
	cache, spool, err := n.openStorage(ctx, f, log)
	if err != nil {
		return nil, err
	}
	// Before the devices open: a leftover worker may hold a GPU's memory.
	if k, err := contain.EndLeftovers(serverRecord(f.data)); err != nil {
		log.Warn("cannot end what an earlier server of this data directory left running", "error", err)
	} else if k > 0 {
		log.Warn("ended processes an earlier server of this data directory left running (workers, or what they started)", "processes", k)
	}
	// Decided before the devices open: under MPS the server opens its GPUs
	// bare (no CUDA context), so that it is none of the MPS server's
	// clients (mpsWanted).
	mps := mpsWanted(f)
	devs, err := openDevices(f.device, f.memLimitMB<<20, mps, log)
	if err != nil {
		return nil, err
	}
	setCopyPiece(devs, f.copyPieceKiB, log)
	devs = withHost(devs, f.hostDevice, f.memLimitMB<<20, log)
	n.devs = devs // closed by close should isolate fail; its own devices replace them
	if err := ctx.Err(); err != nil {
		return nil, err // a stop signal came while the store or the devices opened
	}
	if n.devs, n.cpu, n.pids, n.mem, err = isolate(f, devs, mps, log); err != nil {
		n.devs = devs
		return nil, err
	}
	ioShares(f, n.cpu, &sc.IO, log)
	maxBundle := int64(f.maxBodyMB) << 20
	bound, why := workerInstances(f)
	if why != "" {
		why = "plover serve " + why
	}
	n.eng, err = engine.New(engine.Config{
		Store: n.store, Cache: cache, Devices: n.devs,
		MinInstances: f.minInstances, MaxInstances: f.maxInstances, MaxQueue: f.maxQueue, IdleTTL: f.idleTTL,
		WorkerInstances: bound, WorkerInstancesWhy: why,
		Timeout: f.timeout, MaxTimeout: f.maxTimeout, MaxBundleBytes: maxBundle, Log: log, SpoolDir: spool, Sched: sc, Evictor: evictor,
		SpoolBytes:   spoolBudget(f.maxSpoolMB, maxBundle),
		NamedTenants: f.authFile != "",
	})
	if err != nil {
		return nil, err
	}
	// The light workers' boost counts the server's time on a function's
	// bytes and never boosts a flood: its worker alone reads light for a
	// flood of large bodies.
	n.cpu.Consult(n.eng)
	if f.repository != "" {
		n.repo, err = repository.New(repository.Config{Dir: f.repository, Name: f.repositoryName, Poll: f.repositoryPoll,
			Settle: f.repositorySettle, MaxBundleBytes: maxBundle, StateFile: filepath.Join(f.data, "repository-unloaded.json"), Log: log}, n.eng.Control())
		if err != nil {
			return nil, err
		}
		n.repoDone = make(chan struct{})
	}
	return n, nil
}

// close closes what openNode opened, as far as it got: the engine, the
// devices (their workers) and the workers' groups.
func (n *node) close() {
	if n.eng != nil {
		n.eng.Close()
	}
	for _, d := range n.devs {
		d.Close()
	}
	n.cpu.Close()
	n.pids.Close()
	n.mem.Close()
	if n.dataLock != nil {
		n.dataLock.Close() // last: the workers and their stages are gone
	}
}

// openStorage opens the store (n.store), the node's bundle cache and the
// spool deploys upload to.
func (n *node) openStorage(ctx context.Context, f *serveFlags, log *slog.Logger) (*bundle.Cache, string, error) {
	lock, err := lockData(f.data)
	if err != nil {
		return nil, "", err
	}
	n.dataLock = lock
	storeURL := f.store
	if storeURL == "" {
		storeURL = "file://" + filepath.Join(f.data, "store")
	}
	store, err := openStore(ctx, storeURL, f.s3)
	if err != nil {
		return nil, "", err
	}
	n.store = store
	if fs, ok := store.(*objectstore.FS); ok {
		// Half-written objects of a process that died mid-write.
		if left, err := fs.CleanTemp(registry.BundleGrace); err != nil {
			log.Warn("cannot clean the store's temporary files", "error", err)
		} else if len(left) > 0 {
			log.Info("removed temporary files a crash left in the store", "files", len(left))
		}
	}
	cache, err := bundle.NewCache(filepath.Join(f.data, "cache"), 0, f.cacheMB<<20)
	if err != nil {
		return nil, "", err
	}
	// Uploaded bundles are written here as they arrive (not to /tmp, which
	// may be a small tmpfs in memory).
	// A crash may have left uploads there: nothing in it outlives a deploy.
	spool := filepath.Join(f.data, "spool")
	if err := os.RemoveAll(spool); err != nil {
		return nil, "", fmt.Errorf("--data: %w", err)
	}
	if err := os.MkdirAll(spool, 0o700); err != nil {
		return nil, "", fmt.Errorf("--data: %w", err)
	}
	return cache, spool, nil
}

// flushSpans exports the spans a stopping server still holds.
func flushSpans(tr *tracing.Tracer, log *slog.Logger) {
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := tr.Shutdown(sctx); err != nil {
		log.Warn("the last spans were not exported", "error", err)
	}
}

// newDoor is the one front door of both transports: one gate, one set of
// request metrics, one request path and one request timeout, so a token's
// limits and a function's counts hold however its clients connect.
func newDoor(f *serveFlags, n *node, front *frontDoor, reg *prometheus.Registry, tr *tracing.Tracer, log *slog.Logger) *frontdoor.Door {
	var tokens gate.Tokens
	if front.tokens != nil {
		tokens = front.tokens
	}
	run, met := pipeline.New(n.eng, reg), reqmetrics.New(reg)
	boundPipelines(run, f.maxPipeMemMB, reg)
	n.eng.Forgets(run, met) // a deleted function's series go, and its label's slot
	g := gate.New(tokens, reg)
	front.gate.Store(g)
	return frontdoor.New(frontdoor.Config{Runner: run, Gate: g, Metrics: met, Tracer: tr, Log: log})
}

// transports are the servers plover serve answers on: HTTP, and gRPC
// when --grpc-listen is set; errc receives the error a server stops with.
type transports struct {
	srv *httpapi.Server
	gs  *grpc.Server // nil: no --grpc-listen
	// shakes are gs's connections in their handshake, for the drain.
	shakes grpcapi.Handshakes
	errc   chan error
}

// startTransports serves door over HTTP, gRPC (--grpc-listen) and the
// unauthenticated metrics address (--metrics-listen).
func startTransports(ctx context.Context, f *serveFlags, n *node, front *frontDoor, door *frontdoor.Door, reg *prometheus.Registry, log *slog.Logger) (*transports, error) {
	opts := httpapi.Options{MaxBodyBytes: f.maxBodyMB << 20, MaxConns: front.guard.Max, Log: log, Version: Version, Registry: reg, BodyBudget: front.budget,
		ReadTimeout: f.readTimeout, WriteTimeout: f.writeTimeout, NoConsole: !f.console, Origins: f.origins,
		RefuseQueued: n.eng.RefuseQueued}
	if f.isolation == "process" {
		opts.CPUWeights = func() (string, string) { return n.cpu.Mechanism(), n.cpu.OffReason() } // nil: "off"
	}
	if n.repo != nil { // not a nil *Repository in the interface
		opts.Repository = n.repo
	}
	t := &transports{srv: httpapi.New(door, n.eng.Control(), opts), errc: make(chan error, 2)}
	if n.repo != nil {
		t.srv.SetStarting(true) // until the repository is deployed (serveRepository)
	}
	ln, scheme, err := front.listen(ctx)
	if err != nil {
		return nil, err
	}
	if f.grpcListen != "" {
		if err := t.startGRPC(ctx, f, front, door, log); err != nil {
			return nil, err
		}
	}
	if f.metricsListen != "" {
		mln, err := front.listenMetrics()
		if err != nil {
			return nil, err
		}
		log.Info("metrics without authentication", "addr", "http://"+mln.Addr().String()+"/metrics")
		go func() {
			if err := t.srv.ServeMetrics(mln); err != nil {
				log.Error("the --metrics-listen server stopped", "error", err)
			}
		}()
	}
	names := ""
	for i, d := range n.devs {
		if i > 0 {
			names += ", "
		}
		names += d.Name()
	}
	log.Info("plover serving", "addr", scheme+"://"+ln.Addr().String(), "auth", front.authSummary(), "device", names, "store", n.store.String(), "data", f.data, "version", Version)
	go func() { t.errc <- t.srv.Serve(ln) }()
	return t, nil
}

// startGRPC serves the Open Inference Protocol over gRPC on --grpc-listen.
func (t *transports) startGRPC(ctx context.Context, f *serveFlags, front *frontDoor, door *frontdoor.Door, log *slog.Logger) error {
	gln, tlsConf, err := front.listenGRPC(ctx)
	if err != nil {
		return err
	}
	g := grpcapi.New(door, grpcapi.Options{Log: log, Version: Version, TLS: tlsConf,
		MaxMessageBytes: f.maxBodyMB << 20, BodyBudget: front.budget, Ready: t.srv.Ready, ReadTimeout: f.readTimeout, WriteTimeout: f.writeTimeout})
	t.gs = g.GRPC()
	gscheme := "grpc"
	if tlsConf != nil {
		gscheme = "grpcs"
	}
	log.Info("serving the Open Inference Protocol over gRPC", "addr", gscheme+"://"+gln.Addr().String())
	go func() {
		// gRPC-Go's accept loop recovers nothing.
		// Nearest the sockets, the connections a large call puts in its
		// function's I/O turns (grpcapi.Server.Listener).
		ln := netguard.Recovered(t.shakes.Listener(g.Listener(gln)), func(v any) { door.Panicked("grpc", "", "", v) })
		if err := t.gs.Serve(ln); err != nil {
			t.errc <- fmt.Errorf("--grpc-listen: %w", err)
		}
	}()
	return nil
}

// repositoryFlags refuses --repository-* settings that would be ignored or
// mean nothing.
func repositoryFlags(f *serveFlags) error {
	switch {
	case f.repositoryPoll < 0 || f.repositoryPoll > 0 && f.repositoryPoll < leastPoll:
		return fmt.Errorf("--repository-poll %v: a period of 0 (scan once) or %v or more: each scan reads every folder", f.repositoryPoll, leastPoll)
	case f.repositorySettle <= 0:
		return fmt.Errorf("--repository-settle %v: a folder must be still for some time before it loads", f.repositorySettle)
	case f.repository != "":
		return nil
	case f.repositoryName != "":
		return errors.New("--repository-name: names the function of a --repository that is one bundle directory; give --repository too")
	case f.repositoryPoll != 0:
		return errors.New("--repository-poll: rescans a --repository; give --repository too")
	}
	return nil
}

// background starts the node's own work until ctx ends: watching the store
// (--poll), reaping idle instances, pre-warming, and the model repository.
func (n *node) background(ctx context.Context, f *serveFlags, t *transports, log *slog.Logger) {
	if f.poll > 0 {
		go n.eng.Watch(ctx, f.poll)
	}
	if n.repo != nil {
		go n.serveRepository(ctx, f, t, log)
	}
	reapEvery := time.Second // manifests may set their own idle_ttl
	if f.idleTTL > 0 {
		reapEvery = min(f.idleTTL/4, reapEvery)
	}
	go n.eng.ReapEvery(ctx, reapEvery)
	go func() {
		if err := n.eng.Prewarm(ctx); err != nil {
			log.Warn("some functions could not be pre-warmed", "error", err)
		}
	}()
}

// serveRepository deploys the model repository until ctx ends: the server
// answers from the start (the index shows LOADING), but /readyz and
// ServerReady say ready only once the folders found at start are deployed
// (or failed: the index says why; a failure that may pass is tried again
// later), so that a load balancer or KServe sends no request for a model
// still being deployed.
func (n *node) serveRepository(ctx context.Context, f *serveFlags, t *transports, log *slog.Logger) {
	go func() {
		select {
		case <-n.repo.Started():
			t.srv.SetStarting(false) // a drain's SetReady(false) still wins
			log.Info("model repository deployed: ready", "dir", f.repository)
		case <-ctx.Done():
		}
	}()
	n.repo.Run(ctx)
	close(n.repoDone)
}

// s3Flags registers the S3 settings every --store command takes.
// Credentials come only from the environment (AWS_ACCESS_KEY_ID,
// AWS_SECRET_ACCESS_KEY): flags would show them in ps.
func s3Flags(fs *flag.FlagSet, o *objectstore.S3Options) {
	fs.StringVar(&o.Endpoint, "s3-endpoint", "", "S3 endpoint host[:port] or URL (default $PLOVER_S3_ENDPOINT, else AWS)")
	fs.StringVar(&o.Region, "s3-region", "", "S3 region (default $AWS_REGION)")
	fs.BoolVar(&o.Insecure, "s3-insecure", false, "plain HTTP to the S3 endpoint (a local MinIO)")
}

func openStore(ctx context.Context, url string, o objectstore.S3Options) (objectstore.Store, error) {
	s, err := objectstore.Open(ctx, url, o)
	if err != nil {
		return nil, fmt.Errorf("--store: %w", err)
	}
	return s, nil
}

// serverProcs gives the server twice the Go processors the runtime chose
// (its CPUs, or its container's CPU limit) unless GOMAXPROCS says how
// many. A thread moving a piece of a flood's bytes at the flood's CPU
// weight holds its processor while the kernel runs other work first, and
// a request of a function that has been quiet then waited for one: beside
// 8 clients of 4 MB vecadd on 2 cores, a CNN at 8 requests a second had a
// p50 of 4.2-5.5 ms with 2 processors and 1.9-2.3 ms with 4 (BENCHMARKS.md,
// "A lead for the sparse function").
// It returns the CPUs the runtime chose (a pod's CPU limit, where NumCPU
// is the node's), or GOMAXPROCS where it is set: what the light workers'
// boost counts a worker's part of.
func serverProcs(log *slog.Logger) (cpus float64) {
	n := runtime.GOMAXPROCS(0)
	if os.Getenv("GOMAXPROCS") != "" {
		// Said either way, so that an operator sees which applies (the
		// runtime ignores a GOMAXPROCS it cannot parse: its own choice).
		log.Info("the server's Go processors: as GOMAXPROCS says", "procs", n)
		return float64(n)
	}
	runtime.GOMAXPROCS(2 * n)
	log.Info("the server's Go processors: twice the CPUs it may use (GOMAXPROCS sets them)", "procs", 2*n, "cpus", n)
	return float64(n)
}
