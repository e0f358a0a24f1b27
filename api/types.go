// Package api holds the types Plover puts on the wire: what the server's
// management routes return and what the CLI and other clients decode.
// openapi.yaml in this directory describes the same shapes for clients in
// other languages (openapi_test.go checks it against a running server).
//
// The server (httpapi, engine, registry) and the CLI's client commands
// import this package instead of each other: only plover serve links the
// engine.
package api

import (
	"fmt"
	"strings"
	"time"

	"github.com/plover-run/plover/abi"
)

// FunctionInfo is what GET /v1/functions shows about a function.
type FunctionInfo struct {
	Name     string    `json:"name"`
	Version  string    `json:"version"`
	SHA256   string    `json:"sha256"`
	Size     int64     `json:"bundle_bytes"`
	Created  time.Time `json:"created"`
	Versions int       `json:"versions"`
	// Kind is "function" or "pipeline"; a pipeline lists its Steps, runs
	// nothing of its own and so has no instances, memory or workers.
	Kind  string     `json:"kind"`
	Steps []abi.Step `json:"steps,omitempty"`
	// Target is the device kind the function runs on ("host", "cuda");
	// empty for a pipeline and for versions deployed before it was kept.
	Target   string        `json:"target,omitempty"`
	Loaded   bool          `json:"loaded"`
	Manifest *abi.Manifest `json:"manifest,omitempty"`
	Busy     int           `json:"instances_busy"`
	Idle     int           `json:"instances_idle"`
	Queue    int           `json:"queue_depth"`
	Memory   int64         `json:"device_memory_bytes"`
	// MeanUs is the mean time of the successful requests (0: none).
	MeanUs int64 `json:"mean_latency_us"`
	// Requests is the function's invokes on this node that ended (one
	// still running is not counted yet, as in plover_requests_total), but
	// for those its full queue refused before their bodies were read: the
	// successful,
	// ClientErrors (answered 4xx: the request's fault, such as 422
	// invalid_input, 413 or 415; a full queue's 429; a client that left)
	// and Errors (5xx: the function's or the server's failure).
	Requests     int64 `json:"requests"`
	ClientErrors int64 `json:"client_errors"`
	Errors       int64 `json:"errors"`
	Cold         int64 `json:"cold_starts"`
	Warm         int64 `json:"warm_starts"`
	Hot          int64 `json:"hot_starts"`
	// Share and Priority are the current version's (manifest share and
	// priority, with their defaults).
	Share    float64 `json:"share"`
	Priority string  `json:"priority"`
	// DeviceSeconds is the device time the function's runs were charged on
	// this node since the node first ran it (what per-second billing
	// counts): each run's use as its device measured it, at most its part
	// of a GPU while it held its slot (on the host: its slot time times the
	// slots) and at least its slot time over the device's slots (a run the
	// scheduler expired at its deadline: its whole slot time), and a host
	// worker's CPU used beside its runs; not the time runs held slots.
	DeviceSeconds float64 `json:"device_seconds"`
	// DeviceFraction is the function's part of the device time all
	// functions used on this node recently (decayed over 10 s).
	DeviceFraction float64 `json:"device_fraction"`
	// IOSeconds is the server's time on the function's bytes on this node
	// (reading its bodies, decoding, writing its answers: non-blocking
	// system calls once a socket is ready, so CPU time but for
	// preemption), since the node first served it: counted beside device
	// time in its share.
	IOSeconds float64 `json:"io_seconds"`
	// Workers are the processes the current version runs in (with
	// --isolation process): one per device it is loaded on.
	Workers []WorkerInfo `json:"workers,omitempty"`
	// WarmRefused says why this node does not keep the current version's
	// min_instances warm and will not try again: a refusal no retry mends
	// (its bundle or library refused, its bundle alone past the node's
	// --cache-limit, no device here of its target or large enough for
	// it). A new version is tried afresh. Absent otherwise.
	WarmRefused string `json:"warm_refused,omitempty"`
	// Unchanged: a deploy found the bundle equal to the current version
	// and created none.
	Unchanged bool `json:"unchanged,omitempty"`
	// Warnings are what a deploy or rollback that landed says its caller
	// should know: forced (or rolled back) past the pipelines running it,
	// which of them will fail.
	Warnings []string `json:"warnings,omitempty"`
}

// WorkerInfo is a process a function's current version runs in, on one
// device.
type WorkerInfo struct {
	Device   string `json:"device"`
	PID      int    `json:"pid"`
	RSSBytes int64  `json:"resident_bytes"`
	// PSSBytes is its proportional share of resident memory: pages it
	// shares with other workers (the plover binary, libraries) count
	// divided among them, so the sum over workers is what they cost.
	// Absent unless the server runs as root: workers are not dumpable, and
	// a server of their own uid cannot read their memory maps.
	PSSBytes int64 `json:"pss_bytes,omitempty"`
	Threads  int   `json:"threads"`
	// Programs is how many functions' programs the process holds, when
	// more than one (a tenant's worker, --worker-scope tenant): its memory
	// and threads are then all of theirs together, not this function's.
	Programs int `json:"programs,omitempty"`
}

// LogLine is one line a function's worker process wrote to its stdout or
// stderr, as GET /v1/functions/{name}/logs sends it: one JSON object a line
// (application/x-ndjson).
type LogLine struct {
	Time   time.Time `json:"time"`   // when the server read it (the worker's output is line-buffered)
	Stream string    `json:"stream"` // "stdout" or "stderr"
	PID    int       `json:"pid"`    // the worker process's
	Line   string    `json:"line"`   // without its newline; invalid UTF-8 replaced
	// Truncated is how many bytes of a longer line were cut: the server
	// keeps a line's first LogLineMax bytes.
	Truncated int `json:"truncated,omitempty"`
	// Dropped, on a followed stream, is how many lines before this one the
	// reader missed because it read more slowly than the function printed.
	Dropped int64 `json:"dropped,omitempty"`
}

// LogLineMax is the longest line the server keeps whole (bytes).
const LogLineMax = 4096

// DeviceHealth is one device's state for /healthz.
type DeviceHealth struct {
	Name     string `json:"name"`
	Target   string `json:"target"`
	Healthy  bool   `json:"healthy"`
	Error    string `json:"error,omitempty"`
	MemTotal int64  `json:"mem_total_bytes"`
	MemFree  int64  `json:"mem_free_bytes"`
	MemUsed  int64  `json:"mem_used_bytes"`
	// Host memory pinned for the device's request slots (a GPU's
	// workers), the bound on it, and the pins its driver refused.
	PinnedBytes int64 `json:"pinned_host_bytes,omitempty"`
	PinnedLimit int64 `json:"pinned_host_limit_bytes,omitempty"`
	PinRefusals int64 `json:"pin_refusals,omitempty"`
}

// Version is one immutable deploy of a function. The store's function
// records hold the same shape (package registry).
type Version struct {
	ID      string    `json:"id"`
	SHA256  string    `json:"sha256"`
	Size    int64     `json:"size"`
	Created time.Time `json:"created"`
	// Unpacked is the bytes of the bundle's files, as the server that took
	// the deploy unpacked them: what a node's bundle cache holds of it,
	// which its packed Size may be a thousandth of (0 in records written
	// before it, and by plover deploy --store).
	Unpacked int64 `json:"unpacked_bytes,omitempty"`
	// MinInstances copies the manifest's min_instances so that a starting
	// server can tell which functions to pre-warm without fetching every
	// bundle in the store.
	MinInstances int `json:"min_instances,omitempty"`
	// MaxInputBytes copies the manifest's max_input_bytes, so that a front
	// door can refuse a body no version could take before reading it, and
	// before the bundle is fetched (0 in records written before it).
	MaxInputBytes int64 `json:"max_input_bytes,omitempty"`
	// OutBytes copies the most output bytes one request gets (the
	// manifest's out_bytes; a batching function's item_output_bytes), so
	// that a pipeline can bound what its steps' outputs hold before they
	// are loaded (0 in records written before it).
	OutBytes int64 `json:"out_bytes,omitempty"`
	// Tensors copies the manifest's tensor declaration, so that /v2 model
	// metadata needs no bundle fetch.
	Tensors *abi.Tensors `json:"tensors,omitempty"`
	// Share and Priority copy the manifest's, so that a function's listing
	// shows them before it is loaded ("default" priority is left out).
	Share    float64 `json:"share,omitempty"`
	Priority string  `json:"priority,omitempty"`
	// Target copies the manifest's: the device the function runs on.
	Target string `json:"target,omitempty"`
	// Kind and Steps copy a pipeline's ("kind": "pipeline"), so that nodes
	// run it and deploys check what names it without fetching its bundle.
	Kind  string     `json:"kind,omitempty"`
	Steps []abi.Step `json:"steps,omitempty"`
	// Label is the model repository's name for the version: its version
	// folder ("2"), which /v2/models/NAME/versions/2 names. Empty for a
	// plover deploy.
	Label string `json:"label,omitempty"`
	// Over is, for a version a model repository deployed while a version
	// made otherwise was current (a plover deploy, a rollback to an
	// unlabelled version), that version: the repository does not delete
	// a function with such a version when its folder goes (its other
	// versions may be someone else's), but leaves it to its owner. Kept
	// when the label is taken off.
	Over string `json:"over,omitempty"`
	// Tenant is whose function the version is: the name of the token
	// that deployed it (never the token itself); empty without an auth
	// file, or for a model repository's version: the one tenant then.
	// Shown only to a token that covers every function (admin, or
	// functions "*"): token names are tenants' (httpapi's versions).
	// With --worker-scope tenant a tenant's functions share worker
	// processes, and never a process with another tenant's.
	Tenant string `json:"tenant,omitempty"`
}

// RepositoryModel is an entry of the model repository's index (POST
// /v2/repository/index, Triton's shape): a model's version folder and its
// state, READY, UNAVAILABLE or LOADING, with the reason when not READY.
// Version is empty for a folder with no version to show (settling,
// unreadable, unloaded).
type RepositoryModel struct {
	Name    string `json:"name"`
	Version string `json:"version,omitempty"`
	State   string `json:"state"`
	Reason  string `json:"reason,omitempty"`
}

// IsPipeline reports whether the version is a pipeline's.
func (v Version) IsPipeline() bool { return v.Kind == abi.KindPipeline }

// Record is a function's versions and which one is current: its entry in
// the store and what GET /v1/functions/{name}/versions returns.
type Record struct {
	Name     string    `json:"name"`
	Current  string    `json:"current"`
	Versions []Version `json:"versions"`
}

// Matches reports whether ref names v: its id, or a prefix of it of 8 or
// more characters (what plover versions prints).
func (v Version) Matches(ref string) bool {
	return ref == v.ID || (len(ref) >= 8 && strings.HasPrefix(v.ID, ref))
}

// Names reports whether ref names v by its id (Matches) or by its label
// (a model repository's version folder).
func (v Version) Names(ref string) bool {
	return v.Matches(ref) || (v.Label != "" && ref == v.Label)
}

// Find returns the version ref names and how many versions it matches: 1,
// or 0 for none, or more for a prefix too short to tell them apart (the
// first is returned). An id or prefix (Version.Matches) comes first; else
// a label names the latest version with it (a version folder changed and
// deployed again).
func (r *Record) Find(ref string) (Version, int) {
	if v, n := r.findID(ref); n > 0 {
		return v, n
	}
	for i := len(r.Versions) - 1; i >= 0; i-- {
		if v := r.Versions[i]; v.Label != "" && v.Label == ref {
			return v, 1
		}
	}
	return Version{}, 0
}

// findID is Find by id or prefix alone.
func (r *Record) findID(ref string) (Version, int) {
	var found Version
	n := 0
	for _, v := range r.Versions {
		if v.Matches(ref) {
			if n == 0 {
				found = v
			}
			n++
		}
	}
	return found, n
}

// CurrentVersion returns the version Current names.
func (r *Record) CurrentVersion() (Version, error) {
	for _, v := range r.Versions {
		if v.ID == r.Current {
			return v, nil
		}
	}
	return Version{}, fmt.Errorf("function %s: record names current version %q, which it does not list", r.Name, r.Current)
}
