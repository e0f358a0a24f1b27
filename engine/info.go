package engine

import (
	"context"
	"errors"
	"time"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/device"
	"github.com/plover-run/plover/registry"
)

// FunctionInfo is what GET /v1/functions shows about a function.
type FunctionInfo struct {
	Name     string        `json:"name"`
	Version  string        `json:"version"`
	SHA256   string        `json:"sha256"`
	Size     int64         `json:"bundle_bytes"`
	Created  time.Time     `json:"created"`
	Versions int           `json:"versions"`
	Loaded   bool          `json:"loaded"`
	Manifest *abi.Manifest `json:"manifest,omitempty"`
	Busy     int           `json:"instances_busy"`
	Idle     int           `json:"instances_idle"`
	Queue    int           `json:"queue_depth"`
	Memory   int64         `json:"device_memory_bytes"`
	MeanUs   int64         `json:"mean_latency_us"`
	Requests int64         `json:"requests"`
	Errors   int64         `json:"errors"`
	Cold     int64         `json:"cold_starts"`
	Warm     int64         `json:"warm_starts"`
	Hot      int64         `json:"hot_starts"`
	// Workers are the processes the current version runs in (with
	// --isolation process): one per device it is loaded on.
	Workers []WorkerInfo `json:"workers,omitempty"`
	// Unchanged: a deploy found the bundle equal to the current version
	// and created none.
	Unchanged bool `json:"unchanged,omitempty"`
}

func (e *Engine) info(f *function, rv registry.Version, versions int) FunctionInfo {
	fi := FunctionInfo{Name: f.name, Version: rv.ID, SHA256: rv.SHA256, Size: rv.Size, Created: rv.Created, Versions: versions}
	fi.Requests, fi.Errors = f.stats.requests.Load(), f.stats.errors.Load()
	fi.Cold, fi.Warm, fi.Hot = f.stats.cold.Load(), f.stats.warm.Load(), f.stats.hot.Load()
	e.mu.Lock()
	v := f.cur
	e.mu.Unlock()
	if ok := fi.Requests - fi.Errors; ok > 0 {
		fi.MeanUs = f.stats.latencyNs.Load() / ok / 1000
	}
	if v != nil && v.rec.ID == rv.ID && v.loaded.Load() {
		fi.Loaded, fi.Manifest = true, v.manifest
		fi.Busy, fi.Idle, fi.Memory = v.usage()
		fi.Queue = v.queued()
		fi.Workers = v.processes()
	}
	return fi
}

// WorkerInfo is a process a function's current version runs in, on one
// device.
type WorkerInfo struct {
	Device string `json:"device"`
	device.ProcessStats
}

// processReporter is a program living in a process of its own.
type processReporter interface{ Process() device.ProcessStats }

// processes reports the processes v's programs live in (none in process).
func (v *version) processes() []WorkerInfo {
	v.mu.Lock()
	ps := append([]*placement(nil), v.placements...)
	v.mu.Unlock()
	var out []WorkerInfo
	for _, p := range ps {
		if r, ok := p.prog.(processReporter); ok {
			out = append(out, WorkerInfo{Device: p.dev.Name(), ProcessStats: r.Process()})
		}
	}
	return out
}

// Function describes one function from its record and this node's state.
func (c *Control) Function(ctx context.Context, name string) (FunctionInfo, error) {
	e := c.e
	if !abi.ValidName(name) {
		return FunctionInfo{}, errorf(KindNotFound, nil, "function %q not found", name)
	}
	rec, err := e.reg.Get(ctx, name)
	if errors.Is(err, registry.ErrNoFunction) {
		return FunctionInfo{}, errorf(KindNotFound, err, "function %q not found", name)
	}
	if err != nil {
		return FunctionInfo{}, unavailable(err, "function %s: store unavailable", name)
	}
	return e.recordInfo(rec)
}

func (e *Engine) recordInfo(rec *registry.Record) (FunctionInfo, error) {
	cv, err := rec.CurrentVersion()
	if err != nil {
		return FunctionInfo{}, errorf(KindInternal, err, "function %s: corrupt record", rec.Name)
	}
	e.mu.Lock()
	f := e.funcs[rec.Name]
	e.mu.Unlock()
	if f == nil {
		f = &function{name: rec.Name}
	}
	return e.info(f, cv, len(rec.Versions)), nil
}

// Functions lists every function in the store.
func (c *Control) Functions(ctx context.Context) ([]FunctionInfo, error) {
	e := c.e
	recs, err := e.reg.List(ctx)
	if err != nil {
		return nil, unavailable(err, "list functions: store unavailable")
	}
	out := make([]FunctionInfo, 0, len(recs))
	for _, r := range recs {
		fi, err := e.recordInfo(r)
		if err != nil {
			return nil, err
		}
		out = append(out, fi)
	}
	sortInfos(out)
	return out, nil
}

// DeviceHealth is one device's state for /healthz.
type DeviceHealth struct {
	Name     string `json:"name"`
	Target   string `json:"target"`
	Healthy  bool   `json:"healthy"`
	Error    string `json:"error,omitempty"`
	MemTotal int64  `json:"mem_total_bytes"`
	MemFree  int64  `json:"mem_free_bytes"`
	MemUsed  int64  `json:"mem_used_bytes"`
}

// Health reports every device; the node is healthy when all are.
func (e *Engine) Health() (bool, []DeviceHealth) {
	ok := true
	out := make([]DeviceHealth, 0, len(e.cfg.Devices))
	for _, d := range e.cfg.Devices {
		mi := d.MemInfo()
		h := DeviceHealth{Name: d.Name(), Target: d.Target(), Healthy: true, MemTotal: mi.Total, MemFree: mi.Free, MemUsed: mi.Used}
		if err := d.Health(); err != nil {
			h.Healthy, h.Error, ok = false, err.Error(), false
		}
		out = append(out, h)
	}
	return ok, out
}

// Current is a function's current version, resolved on this node without
// loading it: what the Open Inference Protocol's metadata and inference
// describe.
func (e *Engine) Current(ctx context.Context, name string) (registry.Version, error) {
	_, v, err := e.resolve(ctx, name)
	if err != nil {
		return registry.Version{}, err
	}
	defer v.unref()
	return v.rec, nil
}
