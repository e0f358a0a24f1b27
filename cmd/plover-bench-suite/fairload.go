package main

// The fairness bench's loads: closed and open loops of the victim, the
// floods' own plover bench processes, and the server's counts read around
// them.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/plover-run/plover/api"
	"github.com/plover-run/plover/bench"
)

// ioSplit floods vecadd-a and vecadd-b together, ca and cb clients, and
// reads the server's I/O time each was charged meanwhile.
func ioSplit(ctx context.Context, url string, inA, inB []byte, ca, cb int, d time.Duration) (fairIO, error) {
	before, err := twoCounts(url, "vecadd-a", "vecadd-b", ioSeconds)
	if err != nil {
		return fairIO{}, fmt.Errorf("I/O split: before: %w", err)
	}
	sctx, stop := context.WithCancel(ctx)
	seen := make(chan contended, 1)
	go func() { seen <- contention(sctx, url, "vecadd-a", "vecadd-b", contentionEvery) }()
	var wg sync.WaitGroup
	var la, lb fairLoad
	var ea, eb error
	wg.Add(2)
	go func() { defer wg.Done(); la, ea = closed(ctx, url, "vecadd-a", inA, ca, d) }()
	go func() { defer wg.Done(); lb, eb = closed(ctx, url, "vecadd-b", inB, cb, d) }()
	wg.Wait()
	stop()
	c := <-seen
	if ea != nil || eb != nil {
		return fairIO{}, fmt.Errorf("I/O split: %v %v", ea, eb)
	}
	r := fairIO{Throughput: [2]int64{int64(la.Throughput), int64(lb.Throughput)}, Errors: [2]int64{la.Errors, lb.Errors}, Why: [2]string{la.CommonError, lb.CommonError}, BothWaiting: c.Both, IOAWaiting: c.IOA, Clients: [2]int{ca, cb}}
	after, err := twoCounts(url, "vecadd-a", "vecadd-b", ioSeconds)
	if err != nil {
		return fairIO{}, fmt.Errorf("I/O split: after: %w", err)
	}
	if ia, ib := after[0]-before[0], after[1]-before[1]; ia+ib > 0 {
		r.IOA = ia / (ia + ib)
	}
	if ba, bb := la.Throughput*float64(len(inA)), lb.Throughput*float64(len(inB)); ba+bb > 0 {
		r.BytesA = ba / (ba + bb)
	}
	return r, nil
}

// closed runs a closed loop and summarises it.
func closed(ctx context.Context, url, fn string, in []byte, clients int, d time.Duration) (fairLoad, error) {
	return closedAs(ctx, url, "", fn, in, clients, d)
}

// closedAs is closed with a bearer token ("": none).
func closedAs(ctx context.Context, url, token, fn string, in []byte, clients int, d time.Duration) (fairLoad, error) {
	return loop(ctx, bench.Config{Server: url, Token: token, Function: fn, Input: in, Concurrency: clients, Duration: d})
}

// sparseLoop runs an open loop of rate requests a second and summarises it.
func sparseLoop(ctx context.Context, url, fn string, in []byte, rate float64, d time.Duration) (fairLoad, error) {
	return loop(ctx, bench.Config{Server: url, Function: fn, Input: in, Rate: rate, Duration: d})
}

// loop runs cfg (its server, function, input, clients or rate, and
// duration) and summarises it, with each request's time outside the
// server.
func loop(ctx context.Context, cfg bench.Config) (fairLoad, error) {
	var mu sync.Mutex
	var outside, lat []float64
	observe := func(s *bench.Sample) {
		mu.Lock()
		defer mu.Unlock()
		if s.Timing.Complete() {
			outside = append(outside, float64(s.Latency-s.Timing.Dur[bench.Total])/1e6)
		}
		if cfg.Rate > 0 {
			lat = append(lat, ms(s.Latency))
		}
	}
	cfg.Requests, cfg.Timeout, cfg.Observe = 100_000_000, time.Minute, observe
	r, err := bench.Run(ctx, cfg)
	if err != nil {
		return fairLoad{}, fmt.Errorf("%s: %w", cfg.Function, err)
	}
	l := loadOf(r)
	l.OutsideP50, l.OutsideP99 = quantile(outside, 0.5), quantile(outside, 0.99)
	l.Lat = lat
	if o := r.Open; o != nil {
		l.Late, l.Unsent, l.WakeLagMax = o.Late, o.Unsent, o.WakeLagMaxMs
	}
	return l, nil
}

// loadOf is a bench run's fairLoad.
func loadOf(r *bench.Result) fairLoad {
	l := fairLoad{P50: r.Latency.P50, P99: r.Latency.P99, Max: r.Latency.Max, Throughput: r.Throughput, SchedP50: r.Timing.Sched.P50, Server: r.Timing}
	var most int64
	for _, e := range r.Errors {
		l.Errors += e.Count
		if e.Count > most {
			// One line: a body that is not JSON is kept as it came.
			most, l.CommonError = e.Count, fmt.Sprintf("status %d: %s", e.Status, strings.Join(strings.Fields(e.Message), " "))
		}
	}
	return l
}

// flood floods fn at url from a process of its own (plover bench), as a
// tenant's clients on other machines would: its clients in this program
// would share the victim's client's Go runtime (its processors, its
// collector, busy with 4 MB bodies), and the victim's latency would
// measure them too. A grpc:// url floods through gRPC ModelInfer. It runs
// for d unless ctx ends first, which interrupts it (it reports what it
// did).
func flood(ctx context.Context, plover, url, fn string, in []byte, clients int, d time.Duration) (fairLoad, error) {
	f, err := os.CreateTemp("", "plover-fair-flood-")
	if err != nil {
		return fairLoad{}, err
	}
	defer os.Remove(f.Name())
	_, err = f.Write(in)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fairLoad{}, err
	}
	cmd := exec.CommandContext(ctx, plover, floodArgs(url, fn, f.Name(), clients, d)...)
	cmd.Cancel = func() error { return cmd.Process.Signal(os.Interrupt) }
	cmd.WaitDelay = 30 * time.Second
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	var r bench.Result
	if jerr := json.Unmarshal(out, &r); jerr != nil {
		return fairLoad{}, fmt.Errorf("flood %s: %v (%v) %s", fn, jerr, err, bytes.TrimSpace(stderr.Bytes()))
	}
	return loadOf(&r), nil
}

// floodArgs are flood's plover bench arguments: a grpc:// or grpcs://
// url is called through gRPC ModelInfer (plover bench --grpc), any other
// over HTTP.
func floodArgs(url, fn, in string, clients int, d time.Duration) []string {
	to := []string{"--server", url}
	if strings.HasPrefix(url, "grpc://") || strings.HasPrefix(url, "grpcs://") {
		to = []string{"--grpc", url}
	}
	return append(append([]string{"bench", fn}, to...), "--in", in, "--concurrency", strconv.Itoa(clients),
		"--duration", d.String(), "--requests", "100000000", "--timeout", "1m", "--json")
}

// beside runs the victim at one client while the neighbour is flooded;
// the flood starts first and runs past the victim's end.
func beside(ctx context.Context, plover, url, victim string, vin []byte, nb string, nin []byte, clients int, d time.Duration) (fairLoad, fairLoad, error) {
	return besideFlood(ctx, plover, url, nb, nin, clients, d, func() (fairLoad, error) { return closed(ctx, url, victim, vin, 1, d) })
}

// besideFlood runs victim while nb is flooded at url by clients for d and
// more: the flood starts first and runs past the victim's end.
func besideFlood(ctx context.Context, plover, url, nb string, nin []byte, clients int, d time.Duration, victim func() (fairLoad, error)) (fairLoad, fairLoad, error) {
	fctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var fl fairLoad
	var ferr error
	done := make(chan struct{})
	go func() {
		defer close(done)
		fl, ferr = flood(fctx, plover, url, nb, nin, clients, d+2*time.Second)
	}()
	select {
	case <-time.After(time.Second): // the flood at its pace
	case <-done:
		return fairLoad{}, fairLoad{}, fmt.Errorf("flood %s ended early: %v", nb, ferr)
	}
	v, err := victim()
	cancel()
	<-done
	if err == nil {
		err = ferr
	}
	return v, fl, err
}

// deviceSeconds is a function's device time on the server so far.
func deviceSeconds(fi api.FunctionInfo) float64 { return fi.DeviceSeconds }

// ioSeconds is the server's CPU time on a function's bytes so far.
func ioSeconds(fi api.FunctionInfo) float64 { return fi.IOSeconds }

// twoCounts is count of functions a and b (GET /v1/functions/{fn}). A
// read that fails is an error, not a zero: taken as one, a split
// between two reads covered the server's lifetime, or went negative.
func twoCounts(url, a, b string, count func(api.FunctionInfo) float64) ([2]float64, error) {
	var v [2]float64
	for i, fn := range []string{a, b} {
		var fi api.FunctionInfo
		if err := getJSON(http.DefaultClient, url+"/v1/functions/"+fn, &fi); err != nil {
			return v, fmt.Errorf("%s's counts: %w", fn, err)
		}
		v[i] = count(fi)
	}
	return v, nil
}

// contentionEvery is how often contention reads /metrics.
const contentionEvery = 50 * time.Millisecond

// contended is what contention read of two flows' I/O: Both, the part of
// its readings in which both had a piece waiting for its I/O turn
// (plover_io_pieces{state="waiting"}), and IOA, a's part of the I/O time
// both were charged (plover_io_seconds_total) between two readings in a
// row that both showed that: about what the turns gave while they
// decided (io_seconds is charged as pieces end, and both may not have
// waited all the interval).
// Both is NaN where no reading was made, IOA 0 where no such pair was.
type contended struct{ Both, IOA float64 }

// contention reads url's /metrics every interval until ctx ends, for
// functions a and b. The shares decide the server's I/O only while both
// flows wait for a turn; a split read while one flow waits alone, or
// while each moves a piece in a slot of its own with none waiting, says
// what the flows asked for, not what the turns gave.
func contention(ctx context.Context, url, a, b string, interval time.Duration) contended {
	var n, both int
	var ioA, ioB float64
	prev := struct {
		both   bool
		ia, ib float64
	}{}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			c := contended{Both: math.NaN()}
			if n > 0 {
				c.Both = float64(both) / float64(n)
			}
			if ioA+ioB > 0 {
				c.IOA = ioA / (ioA + ioB)
			}
			return c
		case <-t.C:
		}
		text, err := getText(ctx, url+"/metrics")
		if err != nil {
			prev.both = false // the pair is broken
			continue
		}
		n++
		now := metricValue(text, "plover_io_pieces", a, "waiting") > 0 && metricValue(text, "plover_io_pieces", b, "waiting") > 0
		ia, ib := metricValue(text, "plover_io_seconds_total", a, ""), metricValue(text, "plover_io_seconds_total", b, "")
		if now {
			both++
			if prev.both {
				ioA += ia - prev.ia
				ioB += ib - prev.ib
			}
		}
		prev.both, prev.ia, prev.ib = now, ia, ib
	}
}

// metricValue is the sample of metric name for function fn (and state,
// where not "") in a /metrics text, 0 where absent.
func metricValue(text, name, fn, state string) float64 {
	for _, line := range strings.Split(text, "\n") {
		n, rest, ok := strings.Cut(line, "{")
		if !ok || n != name || !strings.Contains(rest, `function="`+fn+`"`) || state != "" && !strings.Contains(rest, `state="`+state+`"`) {
			continue
		}
		_, v, _ := strings.Cut(rest, "} ")
		f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
		if err == nil {
			return f
		}
	}
	return 0
}

// getText is GET url's body.
func getText(ctx context.Context, url string) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return "", err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err == nil && resp.StatusCode != http.StatusOK {
		err = fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return string(b), err
}

// warmUp loads each function of inputs on srv and makes its instances
// before anything is timed. A function whose every request failed stops
// the mode with the server's word: every figure would be a failure count
// (the first MPS run on a GPU, 2026-12-04, measured nothing for a minute
// and said nothing of why).
func warmUp(ctx context.Context, srv *server, mode string, inputs map[string][]byte) error {
	for name, in := range inputs {
		l, err := closed(ctx, srv.url, name, in, 4, 500*time.Millisecond)
		if err != nil {
			return err
		}
		if l.Throughput == 0 && l.Errors > 0 {
			// The server's log says how its workers ended, the function's
			// output what they said before (a worker's own error, a Go
			// runtime's or a driver's message on its stderr).
			return fmt.Errorf("mode %s: every request to %s failed as the server warmed up (%d; %s); the server's log ends:\n%s\n%s's output ends:\n%s",
				mode, name, l.Errors, l.CommonError, srv.logTail(), name, functionOutput(ctx, srv.url, name, 10))
		}
	}
	return nil
}

// functionOutput is the last n lines of function fn's kept output (GET
// /v1/functions/{fn}/logs), "stderr pid 42: text" a line, or why it could
// not be read.
func functionOutput(ctx context.Context, url, fn string, n int) string {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	body, err := getText(ctx, url+"/v1/functions/"+fn+"/logs")
	if err != nil {
		return fmt.Sprintf("(cannot read it: %v: %.200s)", err, strings.TrimSpace(body))
	}
	var lines []string
	for _, raw := range strings.Split(strings.TrimSpace(body), "\n") {
		var l api.LogLine
		if err := json.Unmarshal([]byte(raw), &l); err != nil {
			lines = append(lines, fmt.Sprintf("(unreadable: %v: %.200s)", err, raw))
			continue
		}
		lines = append(lines, fmt.Sprintf("%s pid %d: %s", l.Stream, l.PID, l.Line))
	}
	if body == "" {
		return "(none kept)"
	}
	return strings.Join(lines[max(len(lines)-n, 0):], "\n")
}

// shareSplit floods spin-a (share 3) and spin-b (share 1) with clients
// each at once: the part of the work each got done and of the device time
// each was billed (none without the scheduler: NaN).
func shareSplit(ctx context.Context, o *options, url, mode string, spinIn []byte, clients int) (fairShares, error) {
	logf("  spin-a (share 3) and spin-b (share 1), %d clients each", clients)
	before, err := twoCounts(url, "spin-a", "spin-b", deviceSeconds)
	if err != nil {
		return fairShares{}, fmt.Errorf("shares: before: %w", err)
	}
	var wg sync.WaitGroup
	var la, lb fairLoad
	var ea, eb error
	wg.Add(2)
	go func() { defer wg.Done(); la, ea = closed(ctx, url, "spin-a", spinIn, clients, o.fairTime) }()
	go func() { defer wg.Done(); lb, eb = closed(ctx, url, "spin-b", spinIn, clients, o.fairTime) }()
	wg.Wait()
	if ea != nil || eb != nil {
		return fairShares{}, fmt.Errorf("shares: %v %v", ea, eb)
	}
	sh := fairShares{Clients: clients, Throughput: [2]int64{int64(la.Throughput), int64(lb.Throughput)}, Errors: [2]int64{la.Errors, lb.Errors}}
	if la.Throughput+lb.Throughput > 0 {
		sh.WorkA = la.Throughput / (la.Throughput + lb.Throughput)
	}
	after, err := twoCounts(url, "spin-a", "spin-b", deviceSeconds)
	if err != nil {
		return fairShares{}, fmt.Errorf("shares: after: %w", err)
	}
	da, db := after[0]-before[0], after[1]-before[1]
	sh.BilledA = math.NaN() // no scheduler, no device time
	if strings.HasPrefix(mode, "fair") && da+db > 0 {
		sh.BilledA = da / (da + db)
	}
	return sh, nil
}
