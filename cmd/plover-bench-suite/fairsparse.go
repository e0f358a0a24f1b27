package main

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/plover-run/plover/bench"
)

// The sparse victim (--fair): the CNN in an open loop at sparseRate
// requests a second, alone and beside the 4 MB flood. The closed-loop
// victim of the rounds sends its next request as soon as the last is
// answered, so it is always about and the server counts it light and
// present; a function called now and then, the usual shape of real
// traffic, arrives each time at a server busy with the flood. Its latency
// is measured from each request's scheduled send (bench's open loop), so
// that a client held up on these shared CPUs counts, as it would for a
// caller.
//
// Beside the scheduled servers it measures two echo floors (the datapath
// bench's, spinning each function's own kernel time of CPU): one process for
// both functions' bytes, as a server that moves them unscheduled, and a
// process each, as a container per function would, the kernel alone
// sharing the CPUs between them. The second is the floor a server of
// one process is to be read against on this machine: the victim's and
// the flood's clients share its two CPUs with the servers.

// sparseRate is the sparse victim's requests a second: one every 250 ms,
// far apart against its own 0.1 ms, and past the 100 ms for which the
// schedulers once kept a light function's slots after its last request
// (sched.DefaultRecent's history).
const sparseRate = 4

// sparseTime is each sparse loop's length, in --fair-time units: 4/s for
// 20 s by default, 80 requests, whose nearest-rank p99 is their slowest
// (rank ceil(0.99 × 80) = 80). A round's table cell says max, not p99,
// and the p99 the report reads is of the rounds' requests pooled (160 at
// the default 2 rounds: their second slowest). Until 2026-12-01 the
// cells' "p99" was each round's maximum, and the medians over rounds
// medians of maxima.
const sparseTime = 4

// The echo floors' names among the sparse targets.
const (
	floorOne = "echo, one process"
	floorTwo = "echo, a process each"
)

// sparseTargets are the servers the sparse rounds compare: the defaults
// with cgroups and without (those --fair-modes keeps), then the floors.
func sparseTargets(o *options) []string {
	return append(chosenModes(o, []string{"fair", "fair-nice"}), floorOne, floorTwo)
}

// runSparse runs o.fairSparseRounds rounds of every sparse target in turn.
func runSparse(ctx context.Context, o *options, data string, cnnIn, vecIn []byte, fr *fairRun) error {
	burnVec, burnCNN, err := kernelTimes(ctx, o, data, cnnIn, vecIn)
	if err != nil {
		return err
	}
	fr.SparseBurns = [2]float64{ms(burnVec), ms(burnCNN)}
	var floors [2]string // the one both functions' bytes go to, the victim's own
	for i := range floors {
		url, stop, err := startEchoFloor(burnVec, burnCNN)
		if err != nil {
			return err
		}
		defer stop()
		floors[i] = url
	}
	fr.SparseTargets = sparseTargets(o)
	for r := range o.fairSparseRounds {
		logf("sparse round %d: the CNN at %d/s alone and beside the 4 MB flood: %s", r+1, sparseRate, strings.Join(fr.SparseTargets, ", "))
		var round []fairVictim
		for _, t := range fr.SparseTargets {
			s, err := sparseRound(ctx, o, data, t, floors, cnnIn, vecIn)
			if err != nil {
				return fmt.Errorf("sparse round %d, %s: %w", r+1, t, err)
			}
			round = append(round, s)
		}
		fr.Sparse = append(fr.Sparse, round)
	}
	return nil
}

// kernelTimes are vecadd's and the CNN's kernel time (the server's own
// Server-Timing, p50 at one client) on a fair server: what the floors spin.
func kernelTimes(ctx context.Context, o *options, data string, cnnIn, vecIn []byte) (vec, cnn time.Duration, err error) {
	srv, err := startServer(o.plover, data, o.device, o.isolation, fairFlags(data, "fair")...)
	if err != nil {
		return 0, 0, err
	}
	defer srv.stop()
	var k [2]time.Duration
	for i, w := range []struct {
		fn string
		in []byte
	}{{"vecadd", vecIn}, {"cnn", cnnIn}} {
		r, err := bench.Run(ctx, bench.Config{Server: srv.url, Function: w.fn, Input: w.in, Requests: 50, Duration: time.Minute, Timeout: time.Minute})
		if err != nil {
			return 0, 0, fmt.Errorf("%s: %w", w.fn, err)
		}
		k[i] = time.Duration(r.Timing.Kernels.P50 * float64(time.Millisecond))
	}
	return k[0], k[1], nil
}

// sparseRound measures one target: a server of its own for a mode, or the
// floors (floors[0] takes the flood; the victim's is floors[0] too for
// floorOne, floors[1] for floorTwo).
func sparseRound(ctx context.Context, o *options, data, target string, floors [2]string, cnnIn, vecIn []byte) (fairVictim, error) {
	victim, flooded := floors[0], floors[0]
	switch target {
	case floorOne:
	case floorTwo:
		victim = floors[1]
	default:
		srv, err := roundServer(ctx, o, data, target, cnnIn, vecIn)
		if err != nil {
			return fairVictim{}, err
		}
		defer srv.stop()
		victim, flooded = srv.url, srv.url
	}
	d := sparseTime * o.fairTime
	sparse := func() (fairLoad, error) { return sparseLoop(ctx, victim, "cnn", cnnIn, sparseRate, d) }
	s := fairVictim{Mode: target}
	var err error
	if s.Alone, err = sparse(); err != nil {
		return s, err
	}
	var fl fairLoad
	if s.Beside, fl, err = besideFlood(ctx, o.plover, flooded, "vecadd", vecIn, o.fairClients, d, sparse); err != nil {
		return s, err
	}
	s.Flood, s.FloodErrors = fl.Throughput, fl.Errors
	return s, nil
}

// writeFairSparse writes the sparse rounds and their medians.
func writeFairSparse(p func(string, ...any), fr *fairRun) {
	if len(fr.Sparse) == 0 {
		return
	}
	p("\nA sparse victim: the CNN at %d requests/s in an open loop for %.0f s (latency from each request's scheduled send), alone and beside the 4 MB flood (%d clients), %d round(s), each target in turn in every round; a server of its own per mode and round. The floors are echo servers (fasthttp, the datapath bench's) spinning each function's kernel time of their thread's CPU (vecadd %s ms, the CNN %s ms: the fair server's kernels p50; CPU time from 2026-12-01, the wall clock before, which did less work when the thread was descheduled): `%s` takes both functions' bytes, as an unscheduled server of one process would; `%s` is a process for the victim and one for the flood, as a container per function, the kernel alone sharing the CPUs. Both the victim's client and the flood's run on this machine's CPUs too. Each round's cell: alone p50 / max → beside p50 / max ms of the round's %.0f requests (in so few, the nearest-rank p99 is the slowest: until 2026-12-01 these cells were headed p99 and showed each round's maximum, and the row below was the medians of those maxima); the last row pools the rounds' requests, alone and beside, and takes p50 / p99 of the pool, the ratios from those. Latency counts from each request's scheduled send, less up to %s of the client's own timer waking late (bench's forgiveness for Go's timers in an idle process; any more counts); a request then sent over %s behind schedule counts late, and one due but not sent by the end never sent: the cell says how many where any. The flood's served/s is over its whole run, from 1 s before the victim's start to just after its end, the median over the rounds.\n\n",
		sparseRate, fr.Time*sparseTime, fr.Clients, len(fr.Sparse), fmtMs(fr.SparseBurns[0]), fmtMs(fr.SparseBurns[1]), floorOne, floorTwo,
		sparseRate*fr.Time*sparseTime, bench.MaxWakeLag, bench.LateSlack)
	meds := writeRoundTable(p, fr.SparseTargets, fr.Sparse, true)
	floor := meds[len(meds)-1] // floorTwo, always last
	var against []string
	var wake float64
	for k, t := range fr.SparseTargets {
		for _, round := range fr.Sparse {
			wake = max(wake, round[k].Alone.WakeLagMax, round[k].Beside.WakeLagMax)
		}
		if k < len(fr.SparseTargets)-1 {
			against = append(against, fmt.Sprintf("`%s` %s / %s", t, ratio(meds[k].b50, floor.b50), ratio(meds[k].b99, floor.b99)))
		}
	}
	p("\nBeside the flood, each target's pooled p50 / p99 over the floor's (a process each): %s.\n", strings.Join(against, "; "))
	if wake > 0 {
		p("\nThe client's timer woke up to %s ms late (the most over these loops; up to %s of it a request is not counted).\n", fmtMs(wake), bench.MaxWakeLag)
	}
}
