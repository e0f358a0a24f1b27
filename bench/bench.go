// Package bench is Plover's load generator: it sends a function's input to
// a server's invoke endpoint in a closed loop (N workers, each sending its
// next request when the previous one returns) or an open loop (requests
// scheduled at a fixed rate, latency measured from the scheduled send time),
// and summarises client-side latency, errors, the server's Server-Timing
// breakdown and the X-Plover-Start counts.
//
// A server that sheds load answers 429 or 503 with a Retry-After. In the
// closed loop the connection that got one waits that long (to the run's end
// at most) before its next request: sending again at once would hammer a
// server that asked for room and fill the report with refusals made in
// microseconds. The open loop does not wait: its load is the rate it was
// given, whatever the answers, and a wait would only turn the refusals
// into late or unsent requests. Either way such answers are counted as
// shed, apart from (and among) the errors.
//
// The request path allocates nothing: each worker reuses one fasthttp
// Request and Response over a kept-alive connection, and every statistic is
// recorded into fixed-size, lock-free histograms and counters.
package bench

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"math"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/plover-run/plover/apierr"
)

// Defaults for Config fields left zero.
const (
	DefaultDuration = 10 * time.Second
	DefaultRequests = 100000
	DefaultTimeout  = 30 * time.Second
	// DefaultOpenConcurrency bounds the requests in flight in an open loop.
	DefaultOpenConcurrency = 64
	// LateSlack is how far behind its scheduled time an open-loop request
	// may start before it counts as late: more than timer jitter, much less
	// than the queueing it is there to reveal.
	LateSlack = time.Millisecond
	// MaxWakeLag is how much of an open-loop worker's own wake-up delay is
	// forgiven when its connection was idle at the due time: Go's timers
	// wake up to ≈1 ms late when the process is idle, which is the
	// client's doing, not the server's. Any more counts as latency.
	MaxWakeLag = 2 * time.Millisecond
)

// Config describes one run. A run stops at whichever of Duration and
// Requests comes first, or when ctx is done.
type Config struct {
	// Server is the base URL, e.g. http://127.0.0.1:8080.
	Server string
	// GRPC, when set, sends the requests over the Open Inference
	// Protocol's gRPC ModelInfer instead of HTTP invoke:
	// grpc://host:port, or grpcs://host:port for TLS (with TLS). Server
	// then only names the run in the report.
	GRPC string
	// Token, when set, is sent as Authorization: Bearer; TLS configures
	// https servers (nil: the system roots).
	Token    string
	TLS      *tls.Config
	Function string
	Input    []byte
	// Concurrency is the number of workers, each with its own connection:
	// the closed loop's load, the open loop's bound on requests in flight.
	// 0: 1 in a closed loop, DefaultOpenConcurrency in an open one.
	Concurrency int
	// Rate > 0 selects an open loop at Rate requests per second.
	Rate     float64
	Duration time.Duration
	Requests int64
	// Timeout bounds each request.
	Timeout time.Duration
	// Warmup is how many requests are sent, one after another on one
	// connection, before the run starts: untimed and in no count but
	// their own. A first request's cold start (the function's load, the
	// connection's setup) is otherwise in the figures, and of a short run
	// it is the p99.
	Warmup int64
	// Progress, if set, is called about every interval from its own
	// goroutine with the requests completed so far and the elapsed time.
	Progress func(done int64, elapsed time.Duration)
	// ProgressInterval defaults to 200ms.
	ProgressInterval time.Duration
	// Observe, if set, is called by the worker that received it with every
	// 2xx response, for callers that need per-request data (the benchmark
	// suite derives per-request overheads from it). It must return quickly
	// and keep nothing: the Sample and its Body are reused.
	Observe func(s *Sample)
}

// Sample is one successful response.
type Sample struct {
	Latency time.Duration
	Start   int // Hot, Warm or Cold; -1 without X-Plover-Start
	// Timing is valid when Timing.Complete().
	Timing ServerTiming
	Body   []byte
}

func (c *Config) fill() error {
	if c.Function == "" {
		return errors.New("bench: no function")
	}
	if c.Rate < 0 || math.IsNaN(c.Rate) || math.IsInf(c.Rate, 0) {
		return fmt.Errorf("bench: rate %v: want a positive number of requests per second", c.Rate)
	}
	if c.Warmup < 0 {
		return fmt.Errorf("bench: warmup %d: want 0 or more requests", c.Warmup)
	}
	if c.Concurrency < 0 || c.Concurrency > 10000 {
		return fmt.Errorf("bench: concurrency %d: want 1..10000", c.Concurrency)
	}
	if c.Concurrency == 0 {
		c.Concurrency = 1
		if c.Rate > 0 {
			c.Concurrency = DefaultOpenConcurrency
		}
	}
	if c.Duration <= 0 {
		c.Duration = DefaultDuration
	}
	if c.Requests <= 0 {
		c.Requests = DefaultRequests
	}
	if c.Timeout <= 0 {
		c.Timeout = DefaultTimeout
	}
	if c.ProgressInterval <= 0 {
		c.ProgressInterval = 200 * time.Millisecond
	}
	return nil
}

// run is the shared state of one run's workers.
type run struct {
	cfg      Config
	client   *fasthttp.HostClient // HTTP, or
	grpc     *grpcTarget          // gRPC
	uri      string
	start    time.Time
	deadline time.Time
	interval float64 // open loop: nanoseconds between scheduled sends

	next      atomic.Int64 // the next ticket: request k of the run
	attempted atomic.Int64 // tickets that were sent
	done      atomic.Int64 // requests that ended (response or error)
	ok        atomic.Int64
	lastEnd   atomic.Int64 // ns after start of the latest end
	lastExit  atomic.Int64 // ns after start at which the latest worker stopped
	late      atomic.Int64
	maxLag    atomic.Int64
	slept     atomic.Int64 // open-loop requests whose worker waited for them
	wakeLag   atomic.Int64 // sum over those of how late the timer woke
	maxWake   atomic.Int64
	noServer  atomic.Int64 // transport errors while answered == 0
	answered  atomic.Int64 // requests that got a response, any status
	shed      atomic.Int64 // 429/503 answers with a Retry-After
	shedWait  atomic.Int64 // ns the closed loop's workers waited for them, summed

	// Before the start, from one goroutine: the warmup's requests tried,
	// and those of them that got no 2xx answer.
	warmSent, warmFailed int64

	status    [600]atomic.Int64 // by HTTP status; 0: no response
	other     atomic.Int64      // statuses outside 100..599
	latency   Histogram         // 2xx only, client side
	server    [NumMetrics]Histogram
	timed     atomic.Int64 // 2xx responses with a complete Server-Timing
	starts    [3]atomic.Int64
	startNone atomic.Int64

	stopOnce sync.Once
	stopped  string
	stopAt   time.Time
	cancel   context.CancelFunc
	// halted is closed when the run stops for any reason: a worker waiting
	// out a Retry-After holds no ticket, so it need not sleep on once
	// another worker has taken the last request.
	halted chan struct{}

	errMu    sync.Mutex
	firstErr error
	errBody  map[int]string // the first error body for each status
}

// Run performs one load run against cfg.Server. It returns an error only
// when the run could not start or the server never answered; HTTP errors
// are counted in the Result.
func Run(ctx context.Context, cfg Config) (*Result, error) {
	if err := cfg.fill(); err != nil {
		return nil, err
	}
	r, err := newRun(ctx, cfg)
	if err != nil {
		return nil, err
	}
	r.warmUp(ctx)
	r.loop(ctx)
	res := r.result()
	// Only a server that never answered is "no response": one that
	// answered with errors is there, and its errors are in res.
	if r.answered.Load() == 0 && r.status[0].Load() > 0 {
		return res, fmt.Errorf("no response from %s: %w", cfg.Server, r.firstErr)
	}
	return res, nil
}

// newRun makes a run's client for cfg's transport.
func newRun(ctx context.Context, cfg Config) (*run, error) {
	r := &run{cfg: cfg, errBody: map[int]string{}, halted: make(chan struct{})}
	if cfg.Rate > 0 {
		r.interval = 1e9 / cfg.Rate
	}
	if cfg.GRPC != "" {
		g, err := newGRPCTarget(ctx, &cfg)
		if err != nil {
			return nil, err
		}
		r.grpc = g
		r.cfg.Server = cfg.GRPC
		return r, nil
	}
	u, err := url.Parse(cfg.Server)
	if err != nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https") {
		return nil, fmt.Errorf("bench: server %q: want http://host:port", cfg.Server)
	}
	base := strings.TrimRight(cfg.Server, "/")
	r.uri = base + "/v1/functions/" + url.PathEscape(cfg.Function) + "/invoke"
	r.client = &fasthttp.HostClient{
		Addr:      hostPort(u),
		IsTLS:     u.Scheme == "https",
		TLSConfig: cfg.TLS,
		// One connection per worker, kept alive for the whole run.
		MaxConns:            cfg.Concurrency,
		MaxConnWaitTimeout:  cfg.Timeout,
		MaxIdleConnDuration: time.Hour,
		ReadTimeout:         cfg.Timeout,
		WriteTimeout:        cfg.Timeout,
		// A non-idempotent POST must not be silently re-sent: each
		// request is counted once.
		MaxIdemponentCallAttempts: 1,
		NoDefaultUserAgentHeader:  true,
	}
	return r, nil
}

// loop runs the workers until they have all stopped, and records why the
// run ended.
func (r *run) loop(parent context.Context) {
	var ctx context.Context
	ctx, r.cancel = context.WithCancel(parent)
	defer r.cancel()

	r.start = time.Now()
	r.deadline = r.start.Add(r.cfg.Duration)
	// An interrupt is recorded as it comes: taken once the requests in
	// flight had drained, its time counted the drain as due in an open
	// loop, and whatever had stopped the run meanwhile was said instead.
	unhook := context.AfterFunc(parent, func() { r.stop("interrupted") })
	var wg sync.WaitGroup
	for range r.cfg.Concurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r.worker(ctx)
			atomicMax(&r.lastExit, int64(time.Since(r.start)))
		}()
	}
	finishProgress := r.progress()
	wg.Wait()
	finishProgress()
	if r.client != nil {
		r.client.CloseIdleConnections()
	}
	if !unhook() {
		// The interrupt came; its stop may still be under way, and
		// stopOnce waits for it.
		r.stop("interrupted")
	}
	r.stop(r.bound())
}

// progress calls cfg.Progress every ProgressInterval from a goroutine of
// its own until the returned func, which calls it a last time.
func (r *run) progress() (finish func()) {
	p := r.cfg.Progress
	if p == nil {
		return func() {}
	}
	done := make(chan struct{})
	go func() {
		t := time.NewTicker(r.cfg.ProgressInterval)
		defer t.Stop()
		for {
			select {
			case <-t.C:
				p(r.done.Load(), time.Since(r.start))
			case <-done:
				return
			}
		}
	}()
	return func() {
		close(done)
		p(r.done.Load(), time.Since(r.start))
	}
}

// bound is the limit that ended a run nothing cut short. An open loop's
// workers take tickets ahead of the schedule, so the first past a bound
// is taken before the bound is reached: the schedule says which one ends
// it. A closed loop's workers each say when they reach one; that none did
// means none had a connection to send on (gRPC).
func (r *run) bound() string {
	if r.interval == 0 {
		return "errors"
	}
	if r.cfg.Requests <= r.dueWithin(r.cfg.Duration) {
		return "requests"
	}
	return "duration"
}

func hostPort(u *url.URL) string {
	if u.Port() != "" {
		return u.Host
	}
	if u.Scheme == "https" {
		return u.Host + ":443"
	}
	return u.Host + ":80"
}

// stop records why the run ended, and when: the first reason given
// stands. Only "errors" and "interrupted" cut other workers short: at the
// request or time limit, tickets already taken are still due and are
// sent.
func (r *run) stop(why string) {
	r.stopOnce.Do(func() {
		r.stopped, r.stopAt = why, time.Now()
		close(r.halted)
	})
	if why == "errors" {
		r.cancel()
	}
}

// noServerLimit is how many transport errors with no response yet end a run:
// a server that is not there should fail the run in milliseconds, not
// after --requests connection attempts.
const noServerLimit = 20

var (
	hdrServerTiming = []byte("Server-Timing")
	hdrStart        = []byte("X-Plover-Start")
	hdrRetryAfter   = []byte("Retry-After")
)

// sender sends one request and describes its response; each worker has
// its own (its own connection).
type sender interface {
	send(ctx context.Context) (*reply, error)
	close()
}

// reply is what record reads of a response, whatever the transport.
type reply struct {
	code   int    // the HTTP status (gRPC: its class's)
	start  []byte // X-Plover-Start
	timing []byte // Server-Timing
	body   []byte // the output, or the error's body
	errMsg string // gRPC: the status message
	// retryAfter is the wait a 429 or 503 asked for (HTTP only: gRPC
	// statuses carry no Retry-After); 0 for none.
	retryAfter time.Duration
}

// httpSender is one worker's HTTP invoke.
type httpSender struct {
	r    *run
	req  *fasthttp.Request
	resp *fasthttp.Response
	rep  reply
}

func (r *run) newHTTPSender() *httpSender {
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	req.Header.SetMethod(fasthttp.MethodPost)
	req.SetRequestURI(r.uri)
	req.Header.SetContentType("application/octet-stream")
	if r.cfg.Token != "" {
		req.Header.Set("Authorization", "Bearer "+r.cfg.Token)
	}
	// The input is shared by all workers and never written: no copy.
	req.SetBodyRaw(r.cfg.Input)
	return &httpSender{r: r, req: req, resp: resp}
}

func (h *httpSender) send(context.Context) (*reply, error) {
	if err := h.r.client.DoTimeout(h.req, h.resp, h.r.cfg.Timeout); err != nil {
		return nil, err
	}
	h.rep = reply{code: h.resp.StatusCode(), start: h.resp.Header.PeekBytes(hdrStart),
		timing: h.resp.Header.PeekBytes(hdrServerTiming), body: h.resp.Body()}
	if shedding(h.rep.code) {
		// Off the 2xx path, which allocates nothing: the conversion
		// allocates.
		if v := h.resp.Header.PeekBytes(hdrRetryAfter); len(v) > 0 {
			h.rep.retryAfter = apierr.RetryAfter(string(v), time.Now())
		}
	}
	return &h.rep, nil
}

// shedding says whether an answer with this status may be a server
// shedding load: 429 (busy, rate_limited) or 503 (unavailable, or a proxy
// in front), the statuses Retry-After comes with.
func shedding(code int) bool { return code == 429 || code == 503 }

func (h *httpSender) close() {
	fasthttp.ReleaseRequest(h.req)
	fasthttp.ReleaseResponse(h.resp)
}

// newSender is a sender on a connection of its own.
func (r *run) newSender() (sender, error) {
	if r.grpc == nil {
		return r.newHTTPSender(), nil
	}
	g, err := r.grpc.sender()
	if err != nil {
		return nil, err
	}
	return g, nil
}

// warmUp sends cfg.Warmup requests before the clock starts, one after
// another, counting only those tried and those that failed (all of them
// where no connection could be made). Over HTTP its connection goes back
// to the run's pool, for a worker to take.
func (r *run) warmUp(ctx context.Context) {
	if r.cfg.Warmup == 0 {
		return
	}
	snd, err := r.newSender()
	if err != nil {
		r.warmSent, r.warmFailed = r.cfg.Warmup, r.cfg.Warmup
		return
	}
	defer snd.close()
	for ; r.warmSent < r.cfg.Warmup && ctx.Err() == nil; r.warmSent++ {
		if rep, err := snd.send(ctx); err != nil || rep.code < 200 || rep.code > 299 {
			r.warmFailed++
		}
	}
}

func (r *run) worker(ctx context.Context) {
	snd, err := r.newSender()
	if err != nil {
		r.record(err, nil, 0, nil)
		return
	}
	defer snd.close()

	var timer *time.Timer
	if r.interval > 0 {
		timer = time.NewTimer(time.Hour)
		timer.Stop()
		defer timer.Stop()
	}
	var st Sample
	var backoff *time.Timer
	defer func() {
		if backoff != nil {
			backoff.Stop()
		}
	}()
	for ctx.Err() == nil {
		k := r.next.Add(1) - 1
		if k >= r.cfg.Requests {
			if r.interval == 0 {
				// The open loop's tickets run ahead of its schedule: the
				// run's end says which bound it reached (bound).
				r.stop("requests")
			}
			return
		}
		var t0 time.Time
		if r.interval > 0 {
			var ok bool
			if t0, ok = r.due(ctx, k, timer); !ok {
				return
			}
		} else {
			t0 = time.Now()
			if t0.After(r.deadline) {
				r.stop("duration")
				return
			}
		}
		r.attempted.Add(1)
		rep, err := snd.send(ctx)
		end := time.Now()
		r.record(err, rep, end.Sub(t0), &st)
		atomicMax(&r.lastEnd, int64(end.Sub(r.start)))
		if err == nil && rep.retryAfter > 0 && r.interval == 0 {
			if backoff == nil {
				backoff = time.NewTimer(time.Hour)
			}
			if !r.waitRetryAfter(ctx, backoff, rep.retryAfter) {
				return
			}
		}
	}
}

// due waits for open-loop request k's time and returns when its latency
// counts from; false when the worker is to send no more (the run's
// duration is over, or ctx ended). It records no stop: a worker takes its
// ticket up to Concurrency intervals ahead of the schedule, and a stop
// said then would be taken for the run's end, an interrupt coming later
// unsaid.
//
// Request k is due at start + k/rate whether or not earlier ones have
// returned, and its latency counts from then, so a slow server cannot hide
// its queue by slowing the sender (coordinated omission): a request that
// waits for a free connection has that wait in its latency.
func (r *run) due(ctx context.Context, k int64, timer *time.Timer) (time.Time, bool) {
	due := r.start.Add(r.offset(k))
	if !due.Before(r.deadline) {
		return time.Time{}, false
	}
	slept := false
	if wait := time.Until(due); wait > 0 {
		timer.Reset(wait)
		select {
		case <-timer.C:
		case <-ctx.Done():
			timer.Stop()
			return time.Time{}, false
		}
		slept = true
		r.slept.Add(1)
	}
	now := time.Now()
	grace := LateSlack
	if slept {
		grace += MaxWakeLag
	}
	if now.After(r.deadline.Add(grace)) {
		// Due in time but no connection came free before the end:
		// counted as unsent rather than stretching the run.
		return time.Time{}, false
	}
	lag := now.Sub(due)
	t0 := due
	if slept {
		// The connection was free when the request fell due; only this
		// process's timer woke late (Go timers wake up to ≈1 ms late in
		// an idle process). That delay is the client's, so up to
		// MaxWakeLag of it is not latency.
		r.wakeLag.Add(int64(lag))
		atomicMax(&r.maxWake, int64(lag))
		t0 = due.Add(min(lag, MaxWakeLag))
		lag -= min(lag, MaxWakeLag)
	}
	if lag > LateSlack {
		r.late.Add(1)
		atomicMax(&r.maxLag, int64(lag))
	}
	return t0, true
}

// waitRetryAfter waits out a shed answer's Retry-After before the
// worker's next request: d, but never past the run's deadline (a server
// asking for an hour ends this worker's sending, it does not stretch the
// run). The wait is not latency (the next request's clock starts when it
// is sent) but it is in the elapsed time, so throughput counts it: a wait
// that runs to the deadline keeps its worker until then, and Elapsed runs
// to the last worker's stop (lastExit), not only to the last answer. It
// returns false when the worker is to send no more: the run stopped or was
// cancelled meanwhile, or its duration ran out.
func (r *run) waitRetryAfter(ctx context.Context, t *time.Timer, d time.Duration) bool {
	left := time.Until(r.deadline)
	if left <= 0 {
		r.stop("duration")
		return false
	}
	t.Reset(min(d, left))
	t0 := time.Now()
	defer func() { r.shedWait.Add(int64(time.Since(t0))) }()
	select {
	case <-t.C:
		if d >= left {
			// Said here rather than left to the loop's clock check, which
			// a timer firing on the deadline's very nanosecond would pass.
			r.stop("duration")
			return false
		}
		return true
	case <-ctx.Done():
	case <-r.halted:
	}
	t.Stop()
	return false
}

// offset is when open-loop request k is due, relative to the start, to
// the nearest nanosecond: truncated, k/rate a hair below the duration
// (k·555,555.5̅ ns at 1800/s) fell inside it, one request more than rate
// × duration.
func (r *run) offset(k int64) time.Duration {
	return time.Duration(math.Round(float64(k) * r.interval))
}

// dueWithin is the number of open-loop requests due before window ends.
func (r *run) dueWithin(window time.Duration) int64 {
	k := int64(math.Ceil(float64(window) / r.interval))
	for k > 0 && r.offset(k-1) >= window {
		k--
	}
	for r.offset(k) < window {
		k++
	}
	return k
}

func atomicMax(a *atomic.Int64, v int64) {
	for {
		m := a.Load()
		if v <= m || a.CompareAndSwap(m, v) {
			return
		}
	}
}

func (r *run) record(err error, rep *reply, lat time.Duration, s *Sample) {
	r.done.Add(1)
	if err != nil {
		r.status[0].Add(1)
		r.errMu.Lock()
		if r.firstErr == nil {
			r.firstErr = err
		}
		r.errMu.Unlock()
		if r.answered.Load() == 0 && r.noServer.Add(1) >= noServerLimit {
			r.stop("errors")
		}
		return
	}
	r.answered.Add(1)
	code := rep.code
	if code >= 100 && code < len(r.status) {
		r.status[code].Add(1)
	} else {
		r.other.Add(1)
	}
	if code < 200 || code > 299 {
		if rep.retryAfter > 0 {
			r.shed.Add(1)
		}
		r.errMu.Lock()
		if _, seen := r.errBody[code]; !seen {
			if rep.errMsg != "" {
				r.errBody[code] = rep.errMsg
			} else {
				r.errBody[code] = errorMessage(rep.body)
			}
		}
		r.errMu.Unlock()
		return
	}
	r.ok.Add(1)
	r.latency.Record(lat)
	switch h := rep.start; {
	case string(h) == "hot": // compiles to a comparison, no conversion
		s.Start = Hot
	case string(h) == "warm":
		s.Start = Warm
	case string(h) == "cold":
		s.Start = Cold
	default:
		s.Start = -1
	}
	if s.Start >= 0 {
		r.starts[s.Start].Add(1)
	} else {
		r.startNone.Add(1)
	}
	st := &s.Timing
	if ParseServerTiming(rep.timing, st) {
		r.timed.Add(1)
		for i := range st.Dur {
			// An optional metric this response did not carry (an older
			// server) is not a zero: its summary counts the ones that did.
			if st.Has&(1<<i) != 0 {
				r.server[i].Record(st.Dur[i])
			}
		}
	}
	if r.cfg.Observe != nil {
		s.Latency, s.Body = lat, rep.body
		r.cfg.Observe(s)
		s.Body = nil
	}
}

// Start kinds, as X-Plover-Start names them.
const (
	Hot = iota
	Warm
	Cold
)
