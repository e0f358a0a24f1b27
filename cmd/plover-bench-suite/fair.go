package main

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/plover-run/plover/bench"
	"github.com/plover-run/plover/device"
	"github.com/plover-run/plover/sched"
)

// The device-sharing benchmark (--fair, make bench-fair): a victim at one
// client, alone and beside a neighbour flooded by --fair-clients, on one
// server per scheduling mode, every mode in the same run. Each mode's
// figures are ratios to its own victim alone.

// fairLoad is one closed loop of the benchmark.
type fairLoad struct {
	P50, P99    float64 // ms
	Throughput  float64
	Errors      int64
	CommonError string  `json:",omitempty"` // the most common failure's status and its first message
	SchedP50    float64 // the Server-Timing sched wait, ms
	// Server is the Server-Timing breakdown (ms): where a victim's time
	// went, the device's copies and kernels apart from the rest.
	Server bench.ServerSummary
	// OutsideP50 and OutsideP99 are each request's latency less its
	// server's total (ms): the network, the HTTP stacks and the client.
	OutsideP50, OutsideP99 float64
	Max                    float64 // the slowest 2xx answer, ms
	// The open loop's (the sparse victim's): its 2xx latencies (ms), for
	// the rounds to pool; the requests sent late, and those due but never
	// sent (in no latency figure); the longest wake-up lag of the client's
	// timer (ms), of which bench forgives up to MaxWakeLag a request.
	Lat          []float64 `json:",omitempty"`
	Late, Unsent int64
	WakeLagMax   float64
}

// fairMode is one scheduling mode's measurements.
type fairMode struct {
	Mode        string              `json:"mode"` // fair, off (--sched off), none (and --cpu-weights=false)
	Alone       fairLoad            `json:"victim_alone"`
	Beside      map[string]fairLoad `json:"victim_beside"` // by neighbour
	Neighbours  map[string]fairLoad `json:"neighbours"`    // the floods, during the victim's run
	Alone4      fairLoad            `json:"victim_alone_4_clients"`
	Shares      []fairShares        `json:"shares"` // at each count of clients per flood
	LatAlone    fairLoad            `json:"latency_alone"`
	LatBeside   fairLoad            `json:"latency_beside_batch"`
	BatchBeside fairLoad            `json:"batch_flood"`
	FloodAlone  fairLoad            `json:"vecadd_flood_alone"` // 8 clients of 4 MB, nobody else
	IO          fairIO              `json:"io_split"`
}

// fairIO is vecadd-a (share 3, 4 MB bodies) against vecadd-b (share 1,
// 1 MB bodies), a flooded by the benchmark's clients and b by ioSplitClients
// times as many, so that both ask for about the same bytes: the part of
// the server's I/O time (io_seconds) and of the bytes moved each got.
// With equal clients b asked for a quarter of a's bytes, and the split
// followed what each asked for (0.80 to a in every mode, scheduled or
// not): a share decides only between flows that both want more.
type fairIO struct {
	IOA, BytesA float64 // fractions: a's of both
	// BothWaiting is the part of the run's /metrics readings in which a
	// and b both had a piece waiting for its turn, and IOAWaiting a's
	// part of their I/O time between two such readings in a row
	// (contention; 0: no such pair).
	BothWaiting float64
	IOAWaiting  float64
	Throughput  [2]int64 // served/s a, b
	Errors      [2]int64 // failed requests a, b
	// Why are a's and b's most common failures (fairLoad.CommonError).
	Why     [2]string `json:",omitzero"`
	Clients [2]int    // a's and b's closed-loop clients
}

// fairShares is spin-a (share 3) against spin-b (share 1), each flooded by
// Clients: the part of the device time each was billed, and the part of
// the work each got done (requests served: the same chain).
type fairShares struct {
	Clients    int      `json:"clients"`
	BilledA    float64  `json:"billed_a_fraction"`
	WorkA      float64  `json:"work_a_fraction"`
	Throughput [2]int64 `json:"throughput"`
	Errors     [2]int64 `json:"errors"` // failed requests a, b
}

type fairRun struct {
	Clients int         `json:"flood_clients"`
	Time    float64     `json:"seconds_per_load"`
	Modes   []*fairMode `json:"modes"`
	// Rounds are the victim alone and beside the 4 MB flood, mode by
	// mode in each round (fairRoundModes), the modes interleaved so that
	// a noisy stretch of the machine falls on all of them.
	Rounds     [][]fairVictim `json:"rounds"`
	RoundModes []string       `json:"round_modes"`
	// Sparse are the sparse victim's rounds (fairsparse.go), a target
	// after another in each, SparseTargets' order; SparseBurns what the
	// echo floors spin, vecadd's and the CNN's (ms).
	Sparse        [][]fairVictim `json:"sparse_rounds,omitempty"`
	SparseTargets []string       `json:"sparse_targets,omitempty"`
	SparseBurns   [2]float64     `json:"sparse_floor_burns_ms"`
	// NoPod says why the fair-nice modes ran in this program's cgroup,
	// not a pod's of their own (pod.go); "" where they did.
	NoPod string `json:"no_pod,omitempty"`
}

// fairVictim is one round of one mode (or, in the sparse rounds, a floor):
// the victim alone and beside the vecadd flood, and the flood's throughput
// meanwhile.
type fairVictim struct {
	Mode   string   `json:"mode"`
	Alone  fairLoad `json:"alone"`
	Beside fairLoad `json:"beside"`
	Flood  float64  `json:"flood_served_per_s"`
	// FloodErrors are the flood's failed requests.
	FloodErrors int64 `json:"flood_errors"`
}

// fairRoundModes are the modes the rounds compare: the light workers'
// boost on and off, with cgroups and with nice levels, the floods' runs
// bounded while the victim is about, and the runs' copies in pieces.
var fairRoundModes = []string{"fair", "fair-noboost", "fair-flood1", "fair-piece", "fair-flood1-piece", "fair-tenant", "fair-tenant-piece", "fair-nice", "fair-nice-noboost", "fair-nice-noslice", "fair-nice-root"}

// fairOptIn are the modes that run only where --fair-modes names them:
// questions of a GPU (one CUDA context for the victim and the floods).
var fairOptIn = []string{"fair-tenant", "fair-tenant-piece"}

// chosenModes is modes less those --fair-modes leaves out (empty: all but
// fairOptIn's).
func chosenModes(o *options, modes []string) []string {
	if len(o.fairModes) == 0 {
		return slices.DeleteFunc(slices.Clone(modes), func(m string) bool { return slices.Contains(fairOptIn, m) })
	}
	return slices.DeleteFunc(slices.Clone(modes), func(m string) bool { return !slices.Contains(o.fairModes, m) })
}

// fairBundle is a sample deployed under another name, with a manifest
// change (a share, a priority).
type fairBundle struct {
	name, from string
	set        map[string]any
}

func runFair(ctx context.Context, o *options, res *results) error {
	cnn, err := cnnWorkload(o.repo, o.samples, o.suffix)
	if err != nil {
		return err
	}
	vec, err := vecaddWorkload(o.samples, o.suffix)
	if err != nil {
		return err
	}
	spinIn := make([]byte, 1024)
	for i := range spinIn {
		spinIn[i] = byte(i*7 + 1)
	}
	data, err := os.MkdirTemp("", "plover-fair-bench-")
	if err != nil {
		return err
	}
	defer removeAll(data)
	dir := func(s string) string { return filepath.Join(o.samples, s+"-"+o.suffix) }
	bundles := []fairBundle{
		{"cnn", dir("cnn"), nil},
		{"vecadd", dir("vecadd"), nil},
		{"spin", dir("spin"), nil},
		{"spin-a", dir("spin"), map[string]any{"share": 3}},
		{"spin-b", dir("spin"), map[string]any{"share": 1}},
		{"cnn-latency", dir("cnn"), map[string]any{"priority": "latency"}},
		{"spin-batch", dir("spin"), map[string]any{"priority": "batch"}},
		{"vecadd-a", dir("vecadd"), map[string]any{"share": 3}},
		{"vecadd-b", dir("vecadd"), map[string]any{"share": 1}},
	}
	for _, b := range bundles {
		src := b.from
		if b.set != nil {
			if src, err = renamedBundle(data, b); err != nil {
				return err
			}
		}
		if err := deployToStore(ctx, o.plover, src, data); err != nil {
			return fmt.Errorf("%s: %w (make samples)", b.name, err)
		}
	}
	o.pod = makePod()
	defer o.pod.remove()
	fr := &fairRun{Clients: o.fairClients, Time: o.fairTime.Seconds(), RoundModes: chosenModes(o, fairRoundModes), NoPod: o.pod.why}
	for _, mode := range chosenModes(o, fairModes) {
		logf("mode %s", mode)
		m, err := fairOneMode(ctx, o, data, mode, cnn.Input, vec.Input, spinIn)
		if err != nil {
			return fmt.Errorf("--sched %s: %w", mode, err)
		}
		fr.Modes = append(fr.Modes, m)
	}
	for r := range o.fairRounds {
		logf("round %d of the victim beside the 4 MB flood: %s", r+1, strings.Join(fr.RoundModes, ", "))
		var round []fairVictim
		for _, mode := range fr.RoundModes {
			v, err := fairVictimRound(ctx, o, data, mode, cnn.Input, vec.Input)
			if err != nil {
				return fmt.Errorf("round %d, %s: %w", r+1, mode, err)
			}
			round = append(round, v)
		}
		fr.Rounds = append(fr.Rounds, round)
	}
	if o.fairSparseRounds > 0 {
		if err := runSparse(ctx, o, data, cnn.Input, vec.Input, fr); err != nil {
			return err
		}
	}
	res.LoadAfterRuns = loadAvg()
	return writeFair(o, res, fr)
}

// fairVictimRound is one mode's round: a server of its own, the victim
// alone, then beside the vecadd flood.
func fairVictimRound(ctx context.Context, o *options, data, mode string, cnnIn, vecIn []byte) (fairVictim, error) {
	srv, err := roundServer(ctx, o, data, mode, cnnIn, vecIn)
	if err != nil {
		return fairVictim{}, err
	}
	defer srv.stop()
	v := fairVictim{Mode: mode}
	if v.Alone, err = closed(ctx, srv.url, "cnn", cnnIn, 1, o.fairTime); err != nil {
		return v, err
	}
	var flood fairLoad
	if v.Beside, flood, err = beside(ctx, o.plover, srv.url, "cnn", cnnIn, "vecadd", vecIn, o.fairClients, o.fairTime); err != nil {
		return v, err
	}
	v.Flood, v.FloodErrors = flood.Throughput, flood.Errors
	return v, nil
}

// roundServer starts a mode's server for a round, the CNN and vecadd
// loaded and their instances made before anything is timed.
func roundServer(ctx context.Context, o *options, data, mode string, cnnIn, vecIn []byte) (*server, error) {
	srv, err := startServerIn(o.podFor(mode), o.plover, data, o.device, o.isolation, nil, fairFlags(data, mode)...)
	if err != nil {
		return nil, err
	}
	if err := warmUp(ctx, srv, mode, map[string][]byte{"cnn": cnnIn, "vecadd": vecIn}); err != nil {
		srv.stop()
		return nil, err
	}
	return srv, nil
}

// writeFairRounds writes the interleaved rounds: each mode's victim beside
// the 4 MB flood, round by round, and the medians.
func writeFairRounds(p func(string, ...any), fr *fairRun) {
	if len(fr.Rounds) == 0 || len(fr.RoundModes) == 0 {
		return
	}
	p("\nThe victim beside the 4 MB flood, the light workers' boost on and off (`--light-boost 1`): %d rounds, each a server per mode, the modes in turn in every round (so that a noisy stretch of this shared machine falls on all of them). Each cell: alone p99 → beside p50 / p99 ms; the medians over the rounds last (target: beside ≤ 1.5× alone at p50, ≤ 3× at p99). The flood's served/s is over its whole run, from 1 s before the victim's start to just after its end. A cell whose requests failed says how many (they are in no latency figure), and a line under the table names them.\n\n", len(fr.Rounds))
	writeRoundTable(p, fr.RoundModes, fr.Rounds, false)
}

// victimMedians are one column's summary over the rounds: the victim
// alone and beside (p50, p99 ms), and the flood's rate; the medians over
// the rounds, or for sparse rounds p50 and p99 of the rounds' requests
// pooled.
type victimMedians struct{ a50, a99, b50, b99, flood float64 }

// writeRoundTable writes rounds of victims, a column per name, then their
// summary with the ratios beside to alone, and a line naming every load
// with failed or unsent requests. Closed-loop rounds (sparse false) show
// the victim's p99 alone, p50 / p99 beside, then the medians over the
// rounds. Sparse rounds, too few requests a round for a p99 that is not
// their slowest, show each round's p50 / max, alone and beside, then p50 /
// p99 of the rounds' requests pooled. It returns the summary by column.
func writeRoundTable(p func(string, ...any), names []string, rounds [][]fairVictim, sparse bool) []victimMedians {
	var f failNotes
	pair := func(a, b float64) string { return fmtMs(a) + " / " + fmtMs(b) }
	p("| round |")
	for _, n := range names {
		p(" %s |", n)
	}
	p("\n|---|%s\n", strings.Repeat("---|", len(names)))
	for i, round := range rounds {
		p("| %d |", i+1)
		for _, v := range round {
			alone, beside := fmtMs(v.Alone.P99), pair(v.Beside.P50, v.Beside.P99)
			if sparse {
				alone, beside = pair(v.Alone.P50, v.Alone.Max), pair(v.Beside.P50, v.Beside.Max)
			}
			where := fmt.Sprintf("round %d, %s", i+1, v.Mode)
			p(" %s%s → %s%s%s |", alone, f.cell(where+", the victim alone", v.Alone), beside, f.cell(where+", the victim beside the flood", v.Beside),
				f.mark(where+", the flood", "flood: ", v.FloodErrors, 0, 0))
		}
		p("\n")
	}
	meds := make([]victimMedians, len(names))
	if sparse {
		var ns []int
		for k := range names {
			var a, b []float64
			for _, round := range rounds {
				a, b = append(a, round[k].Alone.Lat...), append(b, round[k].Beside.Lat...)
			}
			ns = append(ns, len(a), len(b))
			meds[k] = victimMedians{quantile(a, 0.5), quantile(a, 0.99), quantile(b, 0.5), quantile(b, 0.99), 0}
		}
		p("| pooled p50 / p99 (%s) |", pooledNote(ns))
	} else {
		p("| median |")
	}
	for k := range names {
		var a50, a99, b50, b99, fl []float64
		for _, round := range rounds {
			v := round[k]
			a50, a99, b50, b99, fl = append(a50, v.Alone.P50), append(a99, v.Alone.P99), append(b50, v.Beside.P50), append(b99, v.Beside.P99), append(fl, v.Flood)
		}
		if !sparse {
			meds[k] = victimMedians{median(a50), median(a99), median(b50), median(b99), 0}
		}
		m := &meds[k]
		m.flood = median(fl)
		alone := fmtMs(m.a99)
		if sparse {
			alone = pair(m.a50, m.a99)
		}
		p(" %s → %s (%s / %s of alone; flood %.0f/s) |", alone, pair(m.b50, m.b99), ratio(m.b50, m.a50), ratio(m.b99, m.a99), m.flood)
	}
	p("\n")
	f.write(p)
	return meds
}

// pooledNote says how many requests a pooled cell holds and which of them
// the nearest-rank p99 is.
func pooledNote(ns []int) string {
	lo, hi := slices.Min(ns), slices.Max(ns)
	if hi == 0 {
		return "no requests"
	}
	n := fmt.Sprint(lo)
	if hi != lo {
		n = fmt.Sprintf("%d-%d", lo, hi)
	}
	return fmt.Sprintf("%s requests a cell: p99 their %s", n, slowest(lo))
}

// slowest names the nearest-rank p99 of n values by its place from the
// top: "slowest", "2nd slowest".
func slowest(n int) string {
	k := n - int(math.Ceil(0.99*float64(n))) + 1
	switch {
	case k == 1:
		return "slowest"
	case k == 2:
		return "2nd slowest"
	case k == 3:
		return "3rd slowest"
	}
	return fmt.Sprintf("%dth slowest", k)
}

// failNotes gathers a table's loads whose requests failed (non-2xx, or
// no answer: their latency is in no figure, and they are not served) or,
// in an open loop, fell due and were never sent, for a line under the
// table: a figure that lost requests says so where it is read.
type failNotes []string

// cell marks a load's figure: its failed and unsent requests, noted (with
// the most common failure's status and message, so that a run on a
// machine that is gone says why: the victims' and the floods' loads of
// the first table and the rounds' victims; the loads marked by counts
// alone say none), and its late ones (in its latency, from when they were
// due: shown only).
func (f *failNotes) cell(where string, l fairLoad) string {
	n := len(*f)
	out := f.mark(where, "", l.Errors, l.Unsent, l.Late)
	if why := l.CommonError; len(*f) > n && l.Errors > 0 && why != "" {
		if len(why) > 200 {
			why = strings.ToValidUTF8(why[:200], "") + "…"
		}
		(*f)[n] += " (the most common: " + why + ")"
	}
	return out
}

// mark is cell from counts, label before them in the cell.
func (f *failNotes) mark(where, label string, failed, unsent, late int64) string {
	var lost []string
	if failed > 0 {
		lost = append(lost, fmt.Sprintf("%d failed", failed))
	}
	if unsent > 0 {
		lost = append(lost, fmt.Sprintf("%d never sent", unsent))
	}
	out := ""
	if len(lost) > 0 {
		*f = append(*f, where+": "+strings.Join(lost, ", "))
		out = "**" + strings.Join(lost, ", ") + "**"
	}
	if late > 0 {
		out = strings.TrimPrefix(out+fmt.Sprintf(", %d late", late), ", ")
	}
	if out == "" {
		return ""
	}
	return " (" + label + out + ")"
}

// write writes the line under a table, if any load lost requests.
func (f failNotes) write(p func(string, ...any)) {
	if len(f) > 0 {
		p("\n**Requests lost to the figures above** (failed: a non-2xx answer or none, in no latency and not served; never sent: due in an open loop, not sent by its end): %s.\n", strings.Join(f, "; "))
	}
}

// fairModeNamed is the mode called name in fr, or nil.
func fairModeNamed(fr *fairRun, name string) *fairMode {
	for _, m := range fr.Modes {
		if m.Mode == name {
			return m
		}
	}
	return nil
}

// renamedBundle copies b.from to a directory of its own with the manifest's
// name and b.set changed.
func renamedBundle(root string, b fairBundle) (string, error) {
	dst := filepath.Join(root, "bundles", b.name)
	if err := os.MkdirAll(dst, 0o755); err != nil {
		return "", err
	}
	if err := copyDir(b.from, dst); err != nil {
		return "", err
	}
	mp := filepath.Join(dst, "plover.json")
	raw, err := os.ReadFile(mp)
	if err != nil {
		return "", err
	}
	var m map[string]any
	if err := json.Unmarshal(raw, &m); err != nil {
		return "", err
	}
	m["name"] = b.name
	for k, v := range b.set {
		m[k] = v
	}
	out, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return "", err
	}
	return dst, os.WriteFile(mp, out, 0o644)
}

// fairModes are the servers the benchmark compares, each its own process:
// fair (the default: cgroups here, the server's I/O by share where its
// threads can be moved into CPU groups, cgroup v1), fair-noio (the same
// with it unscheduled: --io-shares off), fair-nice (where cgroups cannot be
// written: nice levels, and the server's I/O scheduled by default; the
// server in a pod's CPU group, pod.go), fair-nice-noio (the same with it
// unscheduled), fair-nice-root (fair-nice where this program runs: its
// session's autogroup, where on), fair-noboost and
// fair-nice-noboost (fair and fair-nice without the light workers' boost:
// --light-boost 1), fair-nice-noslice (fair-nice without the light
// workers' short EEVDF slice: --light-slice 0), fair-flood1 (fair with
// --flood-runs 1: the floods one
// run on the device at a time while the victim is about), fair-piece and
// fair-flood1-piece (fair and fair-flood1 with --copy-piece 256: on a GPU
// the victim's copy waits behind a 256 KiB piece of a flood's, not a whole
// one), fair-tenant and fair-tenant-piece (fair and fair-piece with
// --worker-scope tenant: every function in one worker, on a GPU one CUDA
// context; run only where --fair-modes names them), off (--sched off) and
// none (the server before the scheduler and the CPU weights).
var fairModes = []string{"fair", "fair-noio", "fair-noboost", "fair-flood1", "fair-piece", "fair-flood1-piece", "fair-tenant", "fair-tenant-piece", "fair-nice", "fair-nice-noio", "fair-nice-noboost", "fair-nice-noslice", "fair-nice-root", "off", "none"}

// fairGRPCOn reports whether --fair floods vecadd through gRPC too.
func (o *options) fairGRPCOn() bool {
	return o.fairGRPC == "on" || o.fairGRPC == "auto" && o.device == device.KindHost
}

// viaGRPC is the key, in a mode's Beside and Neighbours, of the vecadd
// flood sent through gRPC.
const viaGRPC = "vecadd over gRPC"

// fairFlags are the plover serve flags of a mode.
func fairFlags(data, mode string) []string {
	var flags []string
	base, piece := strings.CutSuffix(mode, "-piece")
	base, tenant := strings.CutSuffix(base, "-tenant")
	base, flood1 := strings.CutSuffix(base, "-flood1")
	base, noio := strings.CutSuffix(base, "-noio")
	base, noboost := strings.CutSuffix(base, "-noboost")
	base, noslice := strings.CutSuffix(base, "-noslice")
	base, _ = strings.CutSuffix(base, "-root") // where the server runs (inPod), not a flag
	switch base {
	case "none":
		return []string{"--sched", "off", "--cpu-weights=false"}
	case "off":
		return []string{"--sched", "off"}
	case "fair-nice":
		flags = []string{"--sched", "fair", "--cgroup-root", filepath.Join(data, "no-cgroups")}
	default:
		flags = []string{"--sched", "fair"}
	}
	if noio {
		flags = append(flags, "--io-shares", "off")
	}
	if noboost {
		flags = append(flags, "--light-boost", "1")
	}
	if noslice {
		flags = append(flags, "--light-slice", "0")
	}
	if flood1 {
		flags = append(flags, "--flood-runs", "1")
	}
	if tenant {
		flags = append(flags, "--worker-scope", "tenant")
	}
	if piece {
		flags = append(flags, "--copy-piece", "256")
	}
	return flags
}

func fairOneMode(ctx context.Context, o *options, data, mode string, cnnIn, vecIn, spinIn []byte) (*fairMode, error) {
	// A closed loop's clients are all to be served: with the server's
	// default max_queue (64) the I/O split's 128 clients of vecadd-b on a
	// 16-CPU host were shed with 429 (113 of them on the H200, 2026-12-04).
	flags := append(fairFlags(data, mode), "--max-queue", strconv.Itoa(fairQueue(o.fairClients, runtime.NumCPU())))
	if o.fairGRPCOn() {
		flags = append(flags, "--grpc-listen", "127.0.0.1:0")
	}
	srv, err := startServerIn(o.podFor(mode), o.plover, data, o.device, o.isolation, nil, flags...)
	if err != nil {
		return nil, err
	}
	defer srv.stop()
	vecB := vecIn[:len(vecIn)/4/4*4] // a quarter of the floats: 1 MB bodies and answers
	inputs := map[string][]byte{"cnn": cnnIn, "vecadd": vecIn, "spin": spinIn, "spin-a": spinIn, "spin-b": spinIn, "cnn-latency": cnnIn, "spin-batch": spinIn,
		"vecadd-a": vecIn, "vecadd-b": vecB}
	if err := warmUp(ctx, srv, mode, inputs); err != nil {
		return nil, err
	}
	m := &fairMode{Mode: mode, Beside: map[string]fairLoad{}, Neighbours: map[string]fairLoad{}}
	if m.Alone, err = closed(ctx, srv.url, "cnn", cnnIn, 1, o.fairTime); err != nil {
		return nil, err
	}
	if m.Alone4, err = closed(ctx, srv.url, "cnn", cnnIn, 4, o.fairTime); err != nil {
		return nil, err
	}
	for _, nb := range []string{"spin", "vecadd"} {
		logf("  cnn beside %s (%d clients)", nb, o.fairClients)
		v, n, err := beside(ctx, o.plover, srv.url, "cnn", cnnIn, nb, inputs[nb], o.fairClients, o.fairTime)
		if err != nil {
			return nil, err
		}
		m.Beside[nb], m.Neighbours[nb] = v, n
	}
	if o.fairGRPCOn() {
		// The same flood through gRPC ModelInfer, the victim over HTTP as
		// before: gRPC-Go reads and writes a connection's frames itself,
		// and the server moves the connection, not the call, in turns
		// (README, "The server's own I/O").
		gaddr, err := srv.grpcAddr()
		if err != nil {
			return nil, err
		}
		logf("  cnn beside vecadd over gRPC (%d clients)", o.fairClients)
		v, n, err := besideFlood(ctx, o.plover, gaddr, "vecadd", vecIn, o.fairClients, o.fairTime,
			func() (fairLoad, error) { return closed(ctx, srv.url, "cnn", cnnIn, 1, o.fairTime) })
		if err != nil {
			return nil, err
		}
		m.Beside[viaGRPC], m.Neighbours[viaGRPC] = v, n
	}
	for _, clients := range []int{4, 12} {
		sh, err := shareSplit(ctx, o, srv.url, mode, spinIn, clients)
		if err != nil {
			return nil, err
		}
		m.Shares = append(m.Shares, sh)
	}
	logf("  cnn-latency alone and beside spin-batch")
	if m.LatAlone, err = closed(ctx, srv.url, "cnn-latency", cnnIn, 1, o.fairTime); err != nil {
		return nil, err
	}
	if m.LatBeside, m.BatchBeside, err = beside(ctx, o.plover, srv.url, "cnn-latency", cnnIn, "spin-batch", spinIn, o.fairClients, o.fairTime); err != nil {
		return nil, err
	}
	ca := ioSplitAClients(o.fairClients, runtime.NumCPU())
	logf("  vecadd alone, %d clients; vecadd-a (share 3, 4 MB, %d clients) and vecadd-b (share 1, 1 MB, %d clients)", o.fairClients, ca, ioSplitClients*ca)
	// Alone means nobody about: cnn-latency, a light function, keeps its
	// slots from floods for the server's reserve hold after its last
	// request (plover serve --reserve-hold, by default this).
	time.Sleep(sched.DefaultRecent)
	if m.FloodAlone, err = closed(ctx, srv.url, "vecadd", vecIn, o.fairClients, o.fairTime); err != nil {
		return nil, err
	}
	if m.IO, err = ioSplit(ctx, srv.url, vecIn, vecB, ca, ioSplitClients*ca, o.fairTime); err != nil {
		return nil, err
	}
	return m, nil
}

// ioSplitClients is how many times a's clients b's flood has: a's bodies
// are 4 times b's.
const ioSplitClients = 4

// ioSplitAClients is how many clients flood vecadd-a: the benchmark's, or
// twice the CPUs where that is more. The server moves a piece per CPU at
// once (its I/O slots), and a client has one piece in flight at most: on
// the H200's 16 CPUs (2026-12-04) a's 8 clients could hold at most half
// of the slots whatever its turns (a's part 0.43), so the shares did not
// decide what the target asks of them.
func ioSplitAClients(clients, cpus int) int { return max(clients, 2*cpus) }

// fairQueue is the servers' --max-queue in fairOneMode: the most clients
// one of its loads sends to a function (vecadd-b's in the I/O split, more
// than any flood's), so that each waits for its turn rather than getting
// 429.
func fairQueue(clients, cpus int) int {
	return ioSplitClients * ioSplitAClients(clients, cpus)
}

func writeFair(o *options, res *results, fr *fairRun) error {
	var b strings.Builder
	p := func(format string, a ...any) { fmt.Fprintf(&b, format, a...) }
	p("## Sharing a device: a victim beside floods (%s device)\n\n", res.Device)
	p("Written by `%s` on %s: %s, %d cores, %s; `plover serve --isolation %s`, one server per mode, client and server on this machine; load average before %s, after %s.\n\n",
		res.Command, res.Started.Format("2006-01-02"), res.Machine.CPU, res.Machine.Cores, res.Machine.OS, o.isolation, res.LoadBefore, res.LoadAfterRuns)
	p("The victim is the CNN (`samples/cnn`) at one client in a closed loop for %.0f s; each neighbour is flooded by %d closed-loop clients from a process of their own (`plover bench`; until 2026-11-30 they shared this program's process with the victim's client): `spin` (`samples/spin`, compute-bound, about 2 ms a request, 1 KiB bodies) and `vecadd` (4 MB bodies), over HTTP, and `vecadd` again through gRPC `ModelInfer` (the victim still over HTTP; gRPC-Go reads and writes a connection's frames itself, for all its calls at once, and a connection moves in its function's I/O turns from its first large call). Ratios are to the victim alone in the same mode. Modes: `fair` is the default (`--sched fair`: the device scheduler, and CPU weights for the workers and the server: cgroups here; `--io-shares auto` moves the server's I/O by share under cgroup v1, the thread moving a piece in a CPU group at its function's weight, and leaves it unscheduled under v2); `fair-noio` is the same with the server's I/O unscheduled (`--io-shares off`); `fair-nice` is the default where cgroups cannot be written (a pod): the workers' weights are nice levels, and the server's I/O moves by share at its functions' levels, the server started (by this program) in a CPU cgroup of its own under cgroup v1, at the default weight, and not given it (`--cgroup-root` at an empty directory), as a pod's container is; `fair-nice-noio` is the same with the server's I/O unscheduled (`--io-shares off`); `fair-nice-root` is `fair-nice` with the server where this program runs, in the root CPU cgroup here, as every `fair-nice` reading before 2026-12-02 was: there the kernel schedules each session as a group (autogroups), which a pod's processes never are, so that the server's threads, whatever their levels, weigh as one group against each worker's (since 2026-12-02 each worker's group takes the worker's level); `fair-noboost` and `fair-nice-noboost` are `fair` and `fair-nice` without the light workers' boost (`--light-boost 1`: every worker at its function's weight all the time, where by default one that used under half its weight's part of the CPUs in the last 250 ms runs at 8 times it); `fair-nice-noslice` is `fair-nice` without the light workers' short EEVDF slice (`--light-slice 0`: by default, on Linux 6.12 and later, a boosted worker's threads and the server's run with a 100 µs slice, so that they preempt a flood's thread when they wake rather than wait out its slice); `fair-flood1` is `fair` with `--flood-runs 1` (while a light function is about, the floods have one run on the device at a time, so that on a GPU a light run's copy waits behind one flood copy, not three); `fair-piece` and `fair-flood1-piece` are `fair` and `fair-flood1` with `--copy-piece 256` (each run's copies between host and device issued in 256 KiB pieces, so that on a GPU a light run's copy waits behind one piece of a flood's copy rather than the whole 4 MB; ignored on the host device); `fair-tenant` and `fair-tenant-piece` are `fair` and `fair-piece` with `--worker-scope tenant`: the benchmark deploys every function without a token, so they are one tenant's and share one worker, and on a GPU one CUDA context, where by default each has a worker and a context of its own (on a GPU, whether the victim's copy waits behind the flood's because the card time-slices between contexts: inferred from the third GPU run, not measured; on the host device one process holds the victim's and the floods' threads at one CPU weight); `off` keeps the CPU weights but runs chains and moves bytes as they come (`--sched off`); `none` is the server before the scheduler (`--sched off --cpu-weights=false`).\n\n",
		fr.Time, fr.Clients)
	if fr.NoPod != "" {
		p("The `fair-nice` modes ran where this program runs, as `fair-nice-root` did, not in a pod's group of their own: %s.\n\n", fr.NoPod)
	}
	p("Every figure in this table and the next three is one reading: one %.0f-s run each, on a server per mode, the modes one after another, minutes apart (the rounds further below repeat and interleave theirs). A cell whose requests failed says how many (they are in no latency figure), and a line under its table names them.\n\n", fr.Time)
	p("| mode | victim alone p50 / p99 ms | beside spin: p50 / p99 (one reading) | beside vecadd: p50 / p99 (one reading) | beside vecadd over gRPC: p50 / p99 (one reading) | spin, vecadd, vecadd over gRPC served/s, each over its flood's whole run (from 1 s before the victim to its end) |\n|---|---|---|---|---|---|\n")
	lost := writeFairNeighbours(p, fr)
	lost.write(p)
	lost = nil
	p("\nWhere the victim's time went, alone, beside vecadd and beside vecadd over gRPC: the server's Server-Timing parts, p50 / p99 ms (the wait for an instance, finding the version, the device scheduler's wait, the copy in, the kernels, the copy out, the hand-over to the worker and back (dispatch: its message, its reply, waking each), the server's total: the parts before it but hand-off and hand-back add up to it request by request; from 2026-12-04 dispatch's two waits, parts of it, beside it: hand-off, from the server's send of the run's message until its worker read it, and hand-back, from the worker's write of its reply until the server's read of it returned, each thread's wake among them, read on the clock both processes share), and each request's latency less its server's total, p50 / p99 (the network, the HTTP stacks and the client; the floods' clients run in a process of their own, `plover bench`, as other machines' would). Each part's p99 is its own, of whichever requests were slowest in it: they do not add up to the total's.\n\n")
	p("| mode | | queue | resolve | sched | copy in | kernels | copy out | dispatch | hand-off | hand-back | server total | outside the server |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	writeFairParts(p, fr)
	p("\nShares, priorities and the cost of scheduling, same servers:\n\n")
	p("| mode | spin-a (share 3) against spin-b (share 1): work done / billed device time (targets 0.75 ± 0.05; billed within 0.05 of the work), at 4 and 12 clients each | served/s a, b | cnn-latency p99 beside a spin-batch flood / alone | cnn alone, 4 clients: served/s | cnn alone 1 client p50 |\n|---|---|---|---|---|---|\n")
	for _, m := range fr.Modes {
		var parts, served []string
		for _, sh := range m.Shares {
			billed := "-"
			if !math.IsNaN(sh.BilledA) {
				billed = fmt.Sprintf("%.3f", sh.BilledA)
			}
			parts = append(parts, fmt.Sprintf("%d clients: %.3f / %s", sh.Clients, sh.WorkA, billed))
			where := fmt.Sprintf("%s, %d clients, spin-", m.Mode, sh.Clients)
			served = append(served, fmt.Sprintf("%d%s, %d%s", sh.Throughput[0], lost.mark(where+"a", "", sh.Errors[0], 0, 0), sh.Throughput[1], lost.mark(where+"b", "", sh.Errors[1], 0, 0)))
		}
		p("| %s | %s | %s | %s (%s%s / %s%s ms)%s | %.0f%s | %s ms |\n", m.Mode, strings.Join(parts, "; "), strings.Join(served, "; "),
			ratio(m.LatBeside.P99, m.LatAlone.P99), fmtMs(m.LatBeside.P99), lost.cell(m.Mode+", cnn-latency beside spin-batch", m.LatBeside),
			fmtMs(m.LatAlone.P99), lost.cell(m.Mode+", cnn-latency alone", m.LatAlone), lost.cell(m.Mode+", the spin-batch flood", m.BatchBeside),
			m.Alone4.Throughput, lost.cell(m.Mode+", cnn alone at 4 clients", m.Alone4), fmtMs(m.Alone.P50))
	}
	lost.write(p)
	lost = nil
	off := fairModeNamed(fr, "off")
	if f := fairModeNamed(fr, "fair"); f != nil && off != nil {
		p("\nA function alone, fair over off (work conservation: the scheduler costs nothing uncontended), one reading each (a run of each server, minutes apart): 4-client throughput **%s**, 1-client p50 **%s**.",
			ratio(f.Alone4.Throughput, off.Alone4.Throughput), ratio(f.Alone.P50, off.Alone.P50))
		p(" (Without the scheduler no device time is accounted: only the work split shows.)\n")
	}
	ca, cb := fr.Clients, ioSplitClients*fr.Clients // a run that did not record its clients
	if len(fr.Modes) > 0 && fr.Modes[0].IO.Clients[0] > 0 {
		ca, cb = fr.Modes[0].IO.Clients[0], fr.Modes[0].IO.Clients[1]
	}
	p("\nThe server's own I/O, same servers: vecadd alone at %d clients (work conservation: ÷ off), and vecadd-a (share 3, 4 MB bodies and answers, %d clients: the vecadd flood's, or twice the CPUs where that is more, so that it can ask for every slot of the server's I/O, one a CPU) against vecadd-b (share 1, 1 MB, %d clients: both asking for about the same bytes, so that the shares decide; from 2026-12-04 each server's `--max-queue` holds them all, where before the default 64 shed b's clients past 64 waiting with 429): a's part of the server's CPU time on their bytes (`io_seconds`, each piece's thread's CPU time; target 0.75 ± 0.05) and of the bytes moved, and the part of the run's `/metrics` readings (every 50 ms) in which both had a piece waiting for its turn (`plover_io_pieces{state=\"waiting\"}`), with a's part of the I/O time charged between two such readings in a row in brackets: the shares decide the server's I/O only then; a split read while the server's I/O is seldom contended follows what each flow asks for, and while each flow moves a piece in a slot of its own with none waiting, the slots split the CPU as the kernel does.\n\n", fr.Clients, ca, cb)
	p("| mode | vecadd alone: served/s (÷ off: one reading each) | vecadd-a / vecadd-b: I/O time to a | bytes to a | both waiting for a turn | served/s a, b |\n|---|---|---|---|---|---|\n")
	for _, m := range fr.Modes {
		io := "-"
		if m.IO.IOA > 0 {
			io = fmt.Sprintf("%.3f", m.IO.IOA)
		}
		alone := fmt.Sprintf("%.0f", m.FloodAlone.Throughput)
		if off != nil {
			alone += " (" + ratio(m.FloodAlone.Throughput, off.FloodAlone.Throughput) + ")"
		}
		alone += lost.cell(m.Mode+", vecadd alone", m.FloodAlone)
		both := "n/a"
		if !math.IsNaN(m.IO.BothWaiting) {
			both = fmt.Sprintf("%.0f%%", 100*m.IO.BothWaiting)
		}
		if m.IO.IOAWaiting > 0 {
			both += fmt.Sprintf(" (a %.3f)", m.IO.IOAWaiting)
		}
		p("| %s | %s | %s | %.3f | %s | %d%s, %d%s |\n", m.Mode, alone, io, m.IO.BytesA, both, m.IO.Throughput[0], lost.cell(m.Mode+", vecadd-a", fairLoad{Errors: m.IO.Errors[0], CommonError: m.IO.Why[0]}),
			m.IO.Throughput[1], lost.cell(m.Mode+", vecadd-b", fairLoad{Errors: m.IO.Errors[1], CommonError: m.IO.Why[1]}))
	}
	lost.write(p)
	writeFairRounds(p, fr)
	writeFairSparse(p, fr)
	return writeSection(o, "fair-"+o.device, b.String(), fr)
}

// writeFairNeighbours writes the first table's rows, a mode each: the
// victim alone and beside each flood, and the floods' rates. It returns
// the failures its cells noted, in the columns' order.
func writeFairNeighbours(p func(string, ...any), fr *fairRun) (lost failNotes) {
	for _, m := range fr.Modes {
		s, v, g := m.Beside["spin"], m.Beside["vecadd"], m.Beside[viaGRPC]
		ns, nv, ng := m.Neighbours["spin"], m.Neighbours["vecadd"], m.Neighbours[viaGRPC]
		_, hasGRPC := m.Beside[viaGRPC]
		// The cells in the columns' order: each notes its failures in it.
		cells := []string{
			fmtMs(m.Alone.P50) + " / " + fmtMs(m.Alone.P99) + lost.cell(m.Mode+", the victim alone", m.Alone),
			ratio(s.P50, m.Alone.P50) + " / " + ratio(s.P99, m.Alone.P99) + lost.cell(m.Mode+", the victim beside spin", s),
			ratio(v.P50, m.Alone.P50) + " / " + ratio(v.P99, m.Alone.P99) + lost.cell(m.Mode+", the victim beside vecadd", v),
			"-",
		}
		if hasGRPC {
			cells[3] = ratio(g.P50, m.Alone.P50) + " / " + ratio(g.P99, m.Alone.P99) + lost.cell(m.Mode+", the victim beside vecadd over gRPC", g)
		}
		served := []string{
			fmt.Sprintf("%.0f%s", ns.Throughput, lost.cell(m.Mode+", the spin flood", ns)),
			fmt.Sprintf("%.0f%s", nv.Throughput, lost.cell(m.Mode+", the vecadd flood", nv)),
			"-",
		}
		if hasGRPC {
			served[2] = fmt.Sprintf("%.0f%s", ng.Throughput, lost.cell(m.Mode+", the vecadd flood over gRPC", ng))
		}
		p("| %s | %s | %s |\n", m.Mode, strings.Join(cells, " | "), strings.Join(served, ", "))
	}
	return lost
}

// writeFairParts writes the rows of where the victim's time went: alone,
// beside vecadd and, where the mode ran it, beside vecadd over gRPC.
func writeFairParts(p func(string, ...any), fr *fairRun) {
	for _, m := range fr.Modes {
		for _, c := range []struct {
			what string
			l    fairLoad
		}{{"alone", m.Alone}, {"beside vecadd", m.Beside["vecadd"]}, {"beside vecadd over gRPC", m.Beside[viaGRPC]}} {
			if _, ok := m.Beside[viaGRPC]; !ok && c.what == "beside vecadd over gRPC" {
				continue
			}
			t := &c.l.Server
			part := func(x bench.Summary) string {
				if x.N == 0 {
					return "n/a"
				}
				return fmtMs(x.P50) + " / " + fmtMs(x.P99)
			}
			outside := "n/a"
			if !math.IsNaN(c.l.OutsideP50) && t.Total.N > 0 {
				outside = fmtMs(c.l.OutsideP50) + " / " + fmtMs(c.l.OutsideP99)
			}
			p("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", m.Mode, c.what, part(t.Queue), part(t.Resolve), part(t.Sched), part(t.CopyIn), part(t.Kernels), part(t.CopyOut), part(t.Dispatch), part(t.Handoff), part(t.Handback), part(t.Total), outside)
		}
	}
}
