package engine

import (
	"context"
	"sort"
	"time"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/api"
	"github.com/plover-run/plover/device"
	"github.com/plover-run/plover/errdefs"
)

func (c *Control) info(f *function, rv api.Version, versions int) api.FunctionInfo {
	e := c.e
	fi := api.FunctionInfo{Name: f.name, Version: rv.ID, SHA256: rv.SHA256, Size: rv.Size, Created: rv.Created, Versions: versions}
	fi.Requests, fi.ClientErrors, fi.Errors = f.stats.requests.Load(), f.stats.clientErrors.Load(), f.stats.errors.Load()
	fi.Cold, fi.Warm, fi.Hot = f.stats.cold.Load(), f.stats.warm.Load(), f.stats.hot.Load()
	v := e.tab.currentOf(f)
	fi.MeanUs = f.stats.meanUs()
	fi.Share, fi.Priority = rv.Share, rv.Priority
	if fi.Share <= 0 {
		fi.Share = 1
	}
	if fi.Priority == "" {
		fi.Priority = "default"
	}
	fi.Kind, fi.Steps, fi.Target = rv.Kind, rv.Steps, rv.Target
	if fi.Kind == "" {
		fi.Kind = abi.KindFunction
	}
	fi.DeviceSeconds, fi.DeviceFraction = e.deviceTime(f.name)
	fi.IOSeconds = e.ioSeconds(f.name)
	if v != nil && v.rec.ID == rv.ID {
		if rf := v.warmRefusal(); rf != nil {
			fi.WarmRefused = rf.Msg // the client's text: no paths of the node
		}
	}
	var cur []*version
	if v != nil && v.rec.ID == rv.ID && v.loaded.Load() {
		fi.Loaded, fi.Manifest = true, v.manifest
		fi.Busy, fi.Idle, fi.Memory = v.usage()
		fi.Workers = v.processes()
		cur = append(cur, v)
	}
	// Versions pipelines pinned that are not current run too: their
	// instances, memory, queues and workers are the function's.
	side := e.tab.side(f)
	for _, sv := range side {
		b, i, m := sv.usage()
		fi.Busy, fi.Idle, fi.Memory = fi.Busy+b, fi.Idle+i, fi.Memory+m
		fi.Workers = append(fi.Workers, sv.processes()...)
	}
	fi.Queue = queueDepth(append(cur, side...))
	return fi
}

// Function describes one function from its record and this node's state.
func (c *Control) Function(ctx context.Context, name string) (api.FunctionInfo, error) {
	e := c.e
	if !abi.ValidName(name) {
		return api.FunctionInfo{}, notFound(name, nil, "")
	}
	rec, err := e.tab.record(ctx, name)
	if err != nil {
		return api.FunctionInfo{}, err
	}
	return c.recordInfo(rec)
}

func (c *Control) recordInfo(rec *api.Record) (api.FunctionInfo, error) {
	e := c.e
	cv, err := rec.CurrentVersion()
	if err != nil {
		return api.FunctionInfo{}, errorf(errdefs.KindInternal, err, "function %s: corrupt record", rec.Name)
	}
	f := e.tab.function(rec.Name)
	if f == nil {
		f = &function{name: rec.Name}
	}
	return c.info(f, cv, len(rec.Versions)), nil
}

// storeCallBound bounds the store's part of a control call (a listing,
// a record's read or write, gc's deletes), past any deadline of its
// caller's: the control routes' contexts have none (httpapi's callCtx),
// and minio-go none on a body's read, so a store that stalled after its
// headers held each call, and its goroutine, for as long as the server
// ran. Generous: gc lists and deletes a whole store. A var for tests.
var storeCallBound = 10 * time.Minute

// storeCtx is ctx ended at storeCallBound at the latest.
func storeCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, storeCallBound)
}

// uploadBound is the bound of a store step that uploads n bytes:
// storeCallBound plus the time they take at uploadFloor, so that a large
// bundle over a slow link is not cut while a stalled upload still ends.
func uploadBound(n int64) time.Duration {
	return storeCallBound + time.Duration(n/uploadFloor)*time.Second
}

// uploadFloor is the slowest upload to the store a deploy waits out,
// bytes a second.
const uploadFloor = 1 << 20

// Functions lists every function in the store.
func (c *Control) Functions(ctx context.Context) ([]api.FunctionInfo, error) {
	e := c.e
	ctx, cancel := storeCtx(ctx)
	defer cancel()
	recs, err := e.tab.reg.List(ctx)
	if err != nil {
		return nil, unavailable(err, "list functions: store unavailable")
	}
	out := make([]api.FunctionInfo, 0, len(recs))
	for _, r := range recs {
		fi, err := c.recordInfo(r)
		if err != nil {
			return nil, err
		}
		out = append(out, fi)
	}
	sortInfos(out)
	return out, nil
}

// Health reports every device; the node is healthy when all are.
func (e *Engine) Health() (bool, []api.DeviceHealth) {
	ok := true
	out := make([]api.DeviceHealth, 0, len(e.cfg.Devices))
	for _, d := range e.cfg.Devices {
		mi := d.MemInfo()
		h := api.DeviceHealth{Name: d.Name(), Target: d.Target(), Healthy: true, MemTotal: mi.Total, MemFree: mi.Free, MemUsed: mi.Used}
		if p, ok := d.(device.HostPinning); ok {
			pi := p.Pinning()
			h.PinnedBytes, h.PinnedLimit, h.PinRefusals = pi.Bytes, pi.Limit, pi.Refused
		}
		if err := d.Health(); err != nil {
			h.Healthy, h.Error, ok = false, err.Error(), false
		}
		out = append(out, h)
	}
	return ok, out
}

// sortInfos orders function infos by name.
func sortInfos(in []api.FunctionInfo) {
	sort.Slice(in, func(i, j int) bool { return in[i].Name < in[j].Name })
}
