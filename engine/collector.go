package engine

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/plover-run/plover/device"
)

// Collector exports the engine's state for Prometheus: starts, instances,
// queue depth, memory and evictions, read when scraped (nothing is updated
// on the request path for these).
func (e *Engine) Collector() prometheus.Collector { return engineCollector{e} }

type engineCollector struct{ e *Engine }

var (
	descStarts = prometheus.NewDesc("plover_starts_total",
		"Requests by how they found an instance: cold (version loaded for it), warm (new instance), hot (idle instance).",
		[]string{"function", "kind"}, nil)
	descInstances = prometheus.NewDesc("plover_instances",
		"Instances of the function by state: its current version's, and those of versions pipelines pinned.", []string{"function", "state"}, nil)
	descQueue = prometheus.NewDesc("plover_queue_depth",
		"Requests waiting for an instance, a batch or their turn on the device.", []string{"function"}, nil)
	descFuncMem = prometheus.NewDesc("plover_function_device_memory_bytes",
		"Device memory held by the function: constants plus instance buffers.", []string{"function"}, nil)
	descDeviceSeconds = prometheus.NewDesc("plover_device_seconds_total",
		"Device time the function's runs were charged, on every device of the node: each run's use as its device measured it, at most its part of the device while it held its slot (the device's time split evenly among the runs in flight; that part itself where the device measures nothing) and at least its slot time divided by the device's slots. Not the time runs held slots.", []string{"function"}, nil)
	descIOSeconds = prometheus.NewDesc("plover_io_seconds_total",
		"The server's time on the function's bytes (reading request bodies past what comes with the headers and the HTTP library's buffer, about 12 KiB, decoding, writing answers of 64 KiB or more: non-blocking system calls once a socket is ready, so CPU time but for preemption), charged to its share beside device time.", []string{"function"}, nil)
	descIOPieces = prometheus.NewDesc("plover_io_pieces",
		"The function's pieces of bytes the server moves now (moving: in their turn), that blocked on their clients past their turns, their slots given to the next piece (stalled: a chunked or TLS upload that paused), or that wait for their turn (waiting); a body that waits for its client holds none.", []string{"function", "state"}, nil)
	descBodies = prometheus.NewDesc("plover_bodies_reading",
		"The function's request bodies the server is reading now that did not all come with their headers (8 KiB), by where they land: in a slot of its worker, or in the server's memory (none lent, not yet, or given back: a body that paused in a slot).", []string{"function", "into"}, nil)
	descEvictions = prometheus.NewDesc("plover_evictions_total",
		"Idle instances and functions released to make room on a device.", []string{"what"}, nil)
	descDevMem = prometheus.NewDesc("plover_device_memory_bytes",
		"Device memory as Plover accounts it.", []string{"device", "kind"}, nil)
	descPinned = prometheus.NewDesc("plover_pinned_host_bytes",
		"Host memory pinned for the device's request slots (a GPU's workers: page-locked whole while their worker lives).", []string{"device"}, nil)
	descPinnedLimit = prometheus.NewDesc("plover_pinned_host_limit_bytes",
		"What the device's pool slots may bring plover_pinned_host_bytes to (no series: no bound).", []string{"device"}, nil)
	descPinRefusals = prometheus.NewDesc("plover_pin_refusals_total",
		"Request slots the device's driver refused to pin: requests on them are staged through their instance's buffers.", []string{"device"}, nil)
	descHealthy = prometheus.NewDesc("plover_device_healthy",
		"1 while the device can run requests.", []string{"device"}, nil)
	descCache = prometheus.NewDesc("plover_bundle_cache_bytes",
		"Unpacked bundles in the node cache.", nil, nil)
	descBatchSize = prometheus.NewDesc("plover_batch_size",
		"Requests per chain run of a batching function (manifest \"batch\"); buckets are powers of two.", []string{"function"}, nil)
	// No pid label: every new worker would start a new series.
	descWorkerRSS = prometheus.NewDesc("plover_worker_resident_bytes",
		"Resident memory of the worker process running the function on a device (a background sample: every second while read, else every 10 s; a tenant's worker shared by several functions is counted under each: do not sum across them).", []string{"function", "device"}, nil)
	descWorkerPSS = prometheus.NewDesc("plover_worker_pss_bytes",
		"Proportional set size of the worker process running the function on a device: its resident memory with pages shared among workers divided among them (a background sample: every 10 s while read, else every minute; a tenant's shared worker is counted under each of its functions).", []string{"function", "device"}, nil)
	descWorkerThreads = prometheus.NewDesc("plover_worker_threads",
		"Threads of the worker process running the function on a device (a background sample: every second while read, else every 10 s; a tenant's shared worker is counted under each of its functions).", []string{"function", "device"}, nil)
)

func (c engineCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descStarts, descDeviceSeconds, descIOSeconds, descIOPieces, descBodies, descInstances, descQueue, descFuncMem, descEvictions, descDevMem, descPinned, descPinnedLimit, descPinRefusals, descHealthy, descCache, descWorkerRSS, descWorkerPSS, descWorkerThreads, descBatchSize} {
		ch <- d
	}
}

func (c engineCollector) Collect(ch chan<- prometheus.Metric) {
	e := c.e
	for _, fv := range e.tab.current() {
		f, v := fv.f, fv.v
		st := &f.stats
		for _, k := range []struct {
			kind string
			n    int64
		}{{"cold", st.cold.Load()}, {"warm", st.warm.Load()}, {"hot", st.hot.Load()}} {
			ch <- prometheus.MustNewConstMetric(descStarts, prometheus.CounterValue, float64(k.n), f.name, k.kind)
		}
		if e.scheds != nil { // --sched off accounts no device time
			secs, _ := e.deviceTime(f.name)
			ch <- prometheus.MustNewConstMetric(descDeviceSeconds, prometheus.CounterValue, secs, f.name)
		}
		ch <- prometheus.MustNewConstMetric(descIOSeconds, prometheus.CounterValue, e.ioSeconds(f.name), f.name)
		if fl := e.io.Lookup(f.name); fl != nil {
			moving, stalled, waiting := fl.Pieces()
			ch <- prometheus.MustNewConstMetric(descIOPieces, prometheus.GaugeValue, float64(moving), f.name, "moving")
			ch <- prometheus.MustNewConstMetric(descIOPieces, prometheus.GaugeValue, float64(stalled), f.name, "stalled")
			ch <- prometheus.MustNewConstMetric(descIOPieces, prometheus.GaugeValue, float64(waiting), f.name, "waiting")
			inSlot, inMemory := fl.Bodies()
			ch <- prometheus.MustNewConstMetric(descBodies, prometheus.GaugeValue, float64(inSlot), f.name, "slot")
			ch <- prometheus.MustNewConstMetric(descBodies, prometheus.GaugeValue, float64(inMemory), f.name, "memory")
		}
		busy, idle, mem := v.usage()
		// Pinned versions that are not current (pipeline steps) add to the
		// function's figures; their workers are in plover ls, not here (one
		// series per function and device).
		side := e.tab.side(f)
		for _, sv := range side {
			b, i, m := sv.usage()
			busy, idle, mem = busy+b, idle+i, mem+m
		}
		queued := queueDepth(append(side, v))
		ch <- prometheus.MustNewConstMetric(descInstances, prometheus.GaugeValue, float64(busy), f.name, "busy")
		ch <- prometheus.MustNewConstMetric(descInstances, prometheus.GaugeValue, float64(idle), f.name, "idle")
		ch <- prometheus.MustNewConstMetric(descQueue, prometheus.GaugeValue, float64(queued), f.name)
		ch <- prometheus.MustNewConstMetric(descFuncMem, prometheus.GaugeValue, float64(mem), f.name)
		if f.batches.sum.Load() > 0 || v.batcher() != nil { // batched once, or batches now
			ch <- f.batches.histogram(f.name)
		}
		for _, w := range v.processes() {
			ch <- prometheus.MustNewConstMetric(descWorkerRSS, prometheus.GaugeValue, float64(w.RSSBytes), f.name, w.Device)
			if w.PSSBytes > 0 { // unreadable unless the server is root (workers are not dumpable)
				ch <- prometheus.MustNewConstMetric(descWorkerPSS, prometheus.GaugeValue, float64(w.PSSBytes), f.name, w.Device)
			}
			ch <- prometheus.MustNewConstMetric(descWorkerThreads, prometheus.GaugeValue, float64(w.Threads), f.name, w.Device)
		}
	}
	ch <- prometheus.MustNewConstMetric(descEvictions, prometheus.CounterValue, float64(e.evictions.instances.Load()), "instance")
	ch <- prometheus.MustNewConstMetric(descEvictions, prometheus.CounterValue, float64(e.evictions.functions.Load()), "function")
	for _, d := range e.cfg.Devices {
		mi := d.MemInfo()
		ch <- prometheus.MustNewConstMetric(descDevMem, prometheus.GaugeValue, float64(mi.Total), d.Name(), "total")
		ch <- prometheus.MustNewConstMetric(descDevMem, prometheus.GaugeValue, float64(mi.Free), d.Name(), "free")
		ch <- prometheus.MustNewConstMetric(descDevMem, prometheus.GaugeValue, float64(mi.Used), d.Name(), "used")
		if p, ok := d.(device.HostPinning); ok && device.PinsHost(d.Target()) {
			pi := p.Pinning()
			ch <- prometheus.MustNewConstMetric(descPinned, prometheus.GaugeValue, float64(pi.Bytes), d.Name())
			if pi.Limit > 0 {
				ch <- prometheus.MustNewConstMetric(descPinnedLimit, prometheus.GaugeValue, float64(pi.Limit), d.Name())
			}
			ch <- prometheus.MustNewConstMetric(descPinRefusals, prometheus.CounterValue, float64(pi.Refused), d.Name())
		}
		healthy := 1.0
		if d.Health() != nil {
			healthy = 0
		}
		ch <- prometheus.MustNewConstMetric(descHealthy, prometheus.GaugeValue, healthy, d.Name())
	}
	ch <- prometheus.MustNewConstMetric(descCache, prometheus.GaugeValue, float64(e.cfg.Cache.Stats().Bytes))
}

// histogram is the batch sizes as a Prometheus histogram.
func (s *batchSizes) histogram(function string) prometheus.Metric {
	buckets := make(map[float64]uint64, len(s.counts))
	var cum uint64
	for k := range s.counts {
		cum += s.counts[k].Load()
		buckets[float64(uint(1)<<k)] = cum
	}
	return prometheus.MustNewConstHistogram(descBatchSize, cum, float64(s.sum.Load()), buckets, function)
}
