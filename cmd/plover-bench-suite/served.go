package main

import (
	"bytes"
	"context"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/plover-run/plover/bench"
)

// served is one request to a real server: client latency, Server-Timing
// and what the server logged about the load, in ms.
type served struct {
	ProcessStartMs float64                   `json:"process_start_ms,omitempty"` // exec to listening
	ClientMs       float64                   `json:"client_ms"`
	Timing         [bench.NumMetrics]float64 `json:"server_timing_ms"` // by bench.MetricNames
	Start          string                    `json:"start"`            // X-Plover-Start
	Log            *coldStart                `json:"cold_start_log,omitempty"`
	out            []byte                    // the response body, kept for the first request only
}

func (s *served) st(i int) float64 { return s.Timing[i] }

// run is copy in + kernels + copy out: the chain as the device ran it.
func (s *served) run() float64 { return s.st(bench.CopyIn) + s.st(bench.Kernels) + s.st(bench.CopyOut) }

// loadKernel is dlopen + symbol resolution as the server measured it: the
// cold start log's program_ms.
func (s *served) loadKernel() float64 {
	if s.Log == nil {
		return math.NaN()
	}
	return s.Log.ProgramMs
}

// constsInstance is the rest of Server-Timing's load: constants onto the
// device and the first instance's buffers (the server times them as one).
func (s *served) constsInstance() float64 {
	if s.Log == nil {
		return math.NaN()
	}
	return s.st(bench.Load) - s.Log.FetchMs - s.Log.ProgramMs
}

func (s *served) fetch() float64 {
	if s.Log == nil {
		return math.NaN()
	}
	return s.Log.FetchMs
}

// platform is what PyPlover calls platform overhead: everything in the
// client's latency but loading the kernel and constants and running the
// chain (fetch and unpack, store lookup, instance, routing, HTTP, loopback).
func (s *served) platform() float64 {
	if s.Log == nil {
		return s.ClientMs - s.st(bench.Load) - s.run()
	}
	return s.ClientMs - s.loadKernel() - s.constsInstance() - s.run()
}

// engine is Server-Timing's total less its parts: resolve, queue slot,
// counters, anything in Engine.Invoke that is not load or the device call.
func (s *served) engine() float64 {
	return s.st(bench.Total) - s.st(bench.Load) - s.st(bench.Queue) - s.st(bench.Sched) - s.run()
}

// http is the client's latency less the server's total: request parsing,
// the handler, response writing, the loopback and the client.
func (s *served) http() float64 { return s.ClientMs - s.st(bench.Total) }

type functionResult struct {
	Name       string    `json:"name"`
	Title      string    `json:"title"`
	Bundle     string    `json:"bundle"`
	InputNote  string    `json:"input"`
	InputBytes int       `json:"input_bytes"`
	Skipped    string    `json:"skipped,omitempty"`
	Cold       []*served `json:"cold,omitempty"`
	Warm       []*served `json:"warm,omitempty"`
	// Hot is every sequential request to an idle instance.
	Hot          []*served     `json:"-"`
	HotRun       *bench.Result `json:"hot,omitempty"`
	Check        string        `json:"served_output_check,omitempty"`
	Direct       *directResult `json:"direct,omitempty"`
	DirectCheck  string        `json:"direct_output_check,omitempty"`
	DirectOK     bool          `json:"-"`
	StartupHotMs float64       `json:"hot_server_process_start_ms,omitempty"`
	// ColdRetries counts cold trials repeated because the bundle was
	// already in the node cache when the request came.
	ColdRetries int `json:"cold_retries,omitempty"`
	w           *workload
}

// measureServed runs the cold, warm and hot phases for one function, each
// against fresh plover serve processes, and the latency sweep if sw is set.
//
//	cold: the bundle only in the store. Each trial starts a fresh process
//	      over an empty data directory, then publishes the bundle straight
//	      to its store with plover deploy --store (no server involved), then
//	      sends the first request. (A starting server fetches the bundles of
//	      functions with min_instances; publishing after the start keeps the
//	      trial cold whatever the manifest says.)
//	warm: the bundle in the node cache, no instance: a fresh process over
//	      the data directory the last cold trial left.
//	hot:  sequential requests to the idle instance of one process.
func measureServed(ctx context.Context, o *options, fr *functionResult, sw *sweepResult) error {
	w := fr.w
	work, err := os.MkdirTemp("", "plover-bench-"+w.Name+"-*")
	if err != nil {
		return err
	}
	defer removeAll(work)
	data := filepath.Join(work, "data")
	logf("%s: %d cold starts (fresh plover serve and data directory each)", w.Name, o.trials)
	for i := 0; i < o.trials; i++ {
		for attempt := 1; ; attempt++ {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			removeAll(data)
			s, err := oneStart(ctx, o, w, data, true)
			if err != nil {
				return fmt.Errorf("cold start %d: %w", i+1, err)
			}
			// The request must have fetched the bundle; if something else
			// got it into the node cache first, this was not a cold start.
			if s.Log != nil && !s.Log.Fetched && attempt < 3 {
				fr.ColdRetries++
				continue
			}
			fr.Cold = append(fr.Cold, s)
			break
		}
	}
	logf("%s: %d warm starts (fresh plover serve over the filled node cache)", w.Name, o.trials)
	for i := 0; i < o.trials; i++ {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		s, err := oneStart(ctx, o, w, data, false)
		if err != nil {
			return fmt.Errorf("warm start %d: %w", i+1, err)
		}
		fr.Warm = append(fr.Warm, s)
	}

	srv, err := startServer(o.plover, data, o.device, o.isolation)
	if err != nil {
		return err
	}
	defer srv.stop()
	fr.StartupHotMs = ms(srv.startup)
	if _, err := request(ctx, srv.url, w, 1); err != nil { // loads the version
		return err
	}
	logf("%s: hot, sequential, up to %d requests or %v", w.Name, o.hotRequests, o.hot)
	var mu sync.Mutex
	hot := make([]*served, 0, min(o.hotRequests, 1<<20))
	res, err := bench.Run(ctx, bench.Config{Server: srv.url, Function: w.Name, Input: w.Input, Concurrency: 1,
		Duration: o.hot, Requests: o.hotRequests, Timeout: time.Minute,
		Observe: func(s *bench.Sample) {
			sv := &served{ClientMs: ms(s.Latency), Start: startName(s.Start)}
			for i, d := range s.Timing.Dur {
				sv.Timing[i] = ms(d)
			}
			mu.Lock()
			if len(hot) == 0 {
				sv.out = bytes.Clone(s.Body)
			}
			hot = append(hot, sv)
			mu.Unlock()
		}})
	if err != nil {
		return err
	}
	if len(res.Errors) > 0 || len(hot) == 0 {
		return fmt.Errorf("hot requests failed: %+v", res.Errors)
	}
	fr.Hot, fr.HotRun = hot, res
	check, ok := w.check(hot[0].out)
	fr.Check = check
	if !ok {
		return fmt.Errorf("the served output is wrong: %s", check)
	}
	if sw != nil {
		if err := runSweep(ctx, o, srv.url, w, sw); err != nil {
			return err
		}
	}
	return srv.stop()
}

// oneStart starts a server over data, deploys the bundle to its store if
// asked, sends one request and stops the server.
func oneStart(ctx context.Context, o *options, w *workload, data string, deploy bool) (*served, error) {
	srv, err := startServer(o.plover, data, o.device, o.isolation)
	if err != nil {
		return nil, err
	}
	defer srv.stop()
	if deploy {
		if err := deployToStore(ctx, o.plover, w.Dir, data); err != nil {
			return nil, err
		}
	}
	s, err := request(ctx, srv.url, w, 1)
	if err != nil {
		return nil, err
	}
	s.ProcessStartMs = ms(srv.startup)
	if c, ok := srv.coldStart(w.Name, 0); ok {
		s.Log = &c
	}
	if check, ok := w.check(s.out); !ok {
		return nil, fmt.Errorf("the served output is wrong: %s", check)
	}
	s.out = nil
	return s, srv.stop()
}

// request sends n sequential requests and returns the first one's data.
func request(ctx context.Context, url string, w *workload, n int64) (*served, error) {
	var first *served
	res, err := bench.Run(ctx, bench.Config{Server: url, Function: w.Name, Input: w.Input, Concurrency: 1,
		Requests: n, Duration: time.Minute, Timeout: time.Minute,
		Observe: func(s *bench.Sample) {
			if first != nil {
				return
			}
			first = &served{ClientMs: ms(s.Latency), Start: startName(s.Start), out: bytes.Clone(s.Body)}
			for i, d := range s.Timing.Dur {
				first.Timing[i] = ms(d)
			}
			if !s.Timing.Complete() {
				first.Start += " (incomplete Server-Timing)"
			}
		}})
	if err != nil {
		return nil, err
	}
	if first == nil {
		return nil, fmt.Errorf("request failed: %+v", res.Errors)
	}
	return first, nil
}

func startName(s int) string {
	switch s {
	case bench.Cold:
		return "cold"
	case bench.Warm:
		return "warm"
	case bench.Hot:
		return "hot"
	}
	return "none"
}
