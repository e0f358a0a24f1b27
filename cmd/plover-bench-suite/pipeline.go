package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// The pipeline benchmark (--pipeline): the digits sample's three host
// functions (normalize, the CNN, top-1) as one pipeline request, against
// the same three invoked in turn from one keep-alive client, each output
// sent back as the next input. The two alternate in blocks, so that both
// see the same machine; every figure is from the one server.
const (
	pipeBlock  = 200 // requests of one mode before switching to the other
	pipeRounds = 10  // blocks of each mode
)

var pipeSteps = []string{"digits-normalize", "cnn", "digits-top1"}

type pipeRun struct {
	Plover      string      `json:"plover"`
	PipeClient  []float64   `json:"pipeline_client_ms"`
	PipeServer  []float64   `json:"pipeline_server_ms"`
	SepClient   []float64   `json:"separate_client_ms"` // the three invocations together
	StepServer  [][]float64 `json:"step_server_ms"`     // per step, each invocation's Server-Timing total
	PipeStepSrv [][]float64 `json:"pipeline_step_ms"`   // per step, its entry in the pipeline's Server-Timing
}

func runPipeline(ctx context.Context, o *options, res *results) error {
	held, err := os.ReadFile(filepath.Join(o.repo, "samples", "cnn", "testdata", "heldout.bin"))
	if err != nil || len(held) < 12+785 {
		return fmt.Errorf("the held-out digits: %v", err)
	}
	pixels := held[13 : 13+784]
	dirs := []string{
		filepath.Join(o.samples, "digits-normalize-"+o.suffix), filepath.Join(o.samples, "cnn-"+o.suffix),
		filepath.Join(o.samples, "digits-top1-"+o.suffix), filepath.Join(o.samples, "digits-pipeline"),
	}
	var runs []*pipeRun
	for _, bin := range []string{o.plover} {
		pr, err := pipelineOne(ctx, o, bin, dirs, pixels)
		if err != nil {
			return fmt.Errorf("%s: %w", bin, err)
		}
		runs = append(runs, pr)
	}
	var plain []*plainRun
	if o.pipelineBefore != "" {
		in := make([]byte, 3136)
		var err error
		if plain, err = plainCost(ctx, o, []string{o.plover, o.pipelineBefore}, dirs[1], in); err != nil {
			return err
		}
	}
	res.LoadAfterRuns = loadAvg()
	return writePipeline(o, res, runs, plain)
}

// plainRun is one binary's hot latency for a plain function (the CNN).
type plainRun struct {
	Plover string    `json:"plover"`
	Client []float64 `json:"client_ms"`
	Server []float64 `json:"server_ms"`
}

// plainCost measures a plain function's hot requests on each binary's
// server, all running, in alternating blocks: what pipelines cost the
// functions that are not in one.
func plainCost(ctx context.Context, o *options, bins []string, dir string, in []byte) ([]*plainRun, error) {
	var runs []*plainRun
	var urls []string
	for _, bin := range bins {
		data, err := os.MkdirTemp("", "plover-bench-plain-")
		if err != nil {
			return nil, err
		}
		defer removeAll(data)
		srv, err := startServer(bin, data, o.device, o.isolation)
		if err != nil {
			return nil, err
		}
		defer srv.stop()
		if err := deployDir(ctx, bin, dir, srv.url); err != nil {
			return nil, err
		}
		urls = append(urls, srv.url)
		runs = append(runs, &plainRun{Plover: ploverVersion(bin)})
	}
	c := &http.Client{Timeout: 10 * time.Second}
	for round := 0; round <= pipeRounds && ctx.Err() == nil; round++ {
		for i, u := range urls {
			for j := 0; j < pipeBlock; j++ {
				t0 := time.Now()
				resp, err := c.Post(u+"/v1/functions/cnn/invoke", "application/octet-stream", bytes.NewReader(in))
				if err != nil {
					return nil, err
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 200 {
					return nil, fmt.Errorf("cnn on %s: %d", u, resp.StatusCode)
				}
				if round == 0 {
					continue // warm-up
				}
				runs[i].Client = append(runs[i].Client, float64(time.Since(t0).Nanoseconds())/1e6)
				runs[i].Server = append(runs[i].Server, timingEntry(resp.Header.Get("Server-Timing"), "total;"))
			}
		}
	}
	return runs, ctx.Err()
}

func pipelineOne(ctx context.Context, o *options, plover string, dirs []string, pixels []byte) (*pipeRun, error) {
	data, err := os.MkdirTemp("", "plover-bench-pipeline-")
	if err != nil {
		return nil, err
	}
	defer removeAll(data)
	srv, err := startServer(plover, data, o.device, o.isolation)
	if err != nil {
		return nil, err
	}
	defer srv.stop()
	for _, d := range dirs {
		cmd := exec.CommandContext(ctx, plover, "deploy", d, "--server", srv.url)
		if out, err := cmd.CombinedOutput(); err != nil {
			return nil, fmt.Errorf("deploy %s: %v\n%s", d, err, out)
		}
	}
	c := &http.Client{Timeout: 10 * time.Second}
	post := func(name string, in []byte) ([]byte, http.Header, float64, error) {
		t0 := time.Now()
		resp, err := c.Post(srv.url+"/v1/functions/"+name+"/invoke", "application/octet-stream", bytes.NewReader(in))
		if err != nil {
			return nil, nil, 0, err
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		ms := float64(time.Since(t0).Nanoseconds()) / 1e6
		if err == nil && resp.StatusCode != 200 {
			err = fmt.Errorf("%s: %d %s", name, resp.StatusCode, b)
		}
		return b, resp.Header, ms, err
	}
	pr := &pipeRun{Plover: ploverVersion(plover), StepServer: make([][]float64, len(pipeSteps)), PipeStepSrv: make([][]float64, len(pipeSteps))}
	// Warm: every function loaded and its instance made, both ways.
	for i := 0; i < 20; i++ {
		if _, _, _, err := post("digits", pixels); err != nil {
			return nil, err
		}
	}
	for round := 0; round < pipeRounds && ctx.Err() == nil; round++ {
		for i := 0; i < pipeBlock; i++ {
			_, h, ms, err := post("digits", pixels)
			if err != nil {
				return nil, err
			}
			st := h.Get("Server-Timing")
			pr.PipeClient = append(pr.PipeClient, ms)
			pr.PipeServer = append(pr.PipeServer, timingEntry(st, "total;"))
			for s := range pipeSteps {
				pr.PipeStepSrv[s] = append(pr.PipeStepSrv[s], timingEntry(st, "step"+strconv.Itoa(s)+";"))
			}
		}
		for i := 0; i < pipeBlock; i++ {
			x, total := pixels, 0.0
			for s, name := range pipeSteps {
				out, h, ms, err := post(name, x)
				if err != nil {
					return nil, err
				}
				x, total = out, total+ms
				pr.StepServer[s] = append(pr.StepServer[s], timingEntry(h.Get("Server-Timing"), "total;"))
			}
			pr.SepClient = append(pr.SepClient, total)
		}
	}
	return pr, ctx.Err()
}

// timingEntry is the dur of the Server-Timing entry starting with prefix.
func timingEntry(h, prefix string) float64 {
	for _, e := range strings.Split(h, ", ") {
		if !strings.HasPrefix(e, prefix) {
			continue
		}
		if i := strings.Index(e, "dur="); i >= 0 {
			v, _ := strconv.ParseFloat(e[i+4:], 64)
			return v
		}
	}
	return 0
}

func writePipeline(o *options, res *results, runs []*pipeRun, plain []*plainRun) error {
	var b strings.Builder
	r := runs[0]
	fmt.Fprintf(&b, "## Pipelines: the digits sample (%s device)\n\n", o.device)
	fmt.Fprintf(&b, "Command: `%s`. The digits sample, `digits-normalize > cnn > digits-top1` on the %s device (--isolation %s), one keep-alive client, %d requests each way in alternating blocks of %d.\n\n",
		res.Command, o.device, o.isolation, pipeBlock*pipeRounds, pipeBlock)
	b.WriteString(runMachine(res, r.Plover))
	sum := 0.0
	b.WriteString("| | p50 ms | p99 ms |\n|---|---|---|\n")
	for s, name := range pipeSteps {
		fmt.Fprintf(&b, "| %s alone, server time | %s | %s |\n", name, fmtMs(median(r.StepServer[s])), fmtMs(quantile(r.StepServer[s], 0.99)))
		sum += median(r.StepServer[s])
	}
	for s, name := range pipeSteps {
		fmt.Fprintf(&b, "| %s as a step of the pipeline | %s | %s |\n", name, fmtMs(median(r.PipeStepSrv[s])), fmtMs(quantile(r.PipeStepSrv[s], 0.99)))
	}
	fmt.Fprintf(&b, "| the pipeline, server time | %s | %s |\n", fmtMs(median(r.PipeServer)), fmtMs(quantile(r.PipeServer, 0.99)))
	fmt.Fprintf(&b, "| the pipeline, client latency | %s | %s |\n", fmtMs(median(r.PipeClient)), fmtMs(quantile(r.PipeClient, 0.99)))
	fmt.Fprintf(&b, "| the three invoked in turn, client latency | %s | %s |\n\n", fmtMs(median(r.SepClient)), fmtMs(quantile(r.SepClient, 0.99)))
	over := (median(r.PipeServer) - sum) * 1000 / float64(len(pipeSteps))
	fmt.Fprintf(&b, "- Pipeline server time p50 against the sum of the steps' p50 server times alone (%s ms): %s, %+.1f µs per step (target: at most +20 µs per step).\n",
		fmtMs(sum), ratio(median(r.PipeServer), sum), over)
	fmt.Fprintf(&b, "- Pipeline client latency p50 against the three invocations in turn: %s (target ≤ 0.5×); p99 %s.\n\n",
		ratio(median(r.PipeClient), median(r.SepClient)), ratio(quantile(r.PipeClient, 0.99), quantile(r.SepClient, 0.99)))
	writePlain(&b, plain, "No cost to plain functions", "With pipelines against before them")
	return writeSection(o, "pipeline-"+o.device, b.String(), map[string]any{"pipeline": runs, "plain": plain})
}
