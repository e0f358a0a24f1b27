package main

import (
	"context"
	"os/exec"
	"strings"
	"time"

	"github.com/plover-run/plover/device"
)

// goBenchResult is one `go test -bench` command and the lines it printed
// about the machine and the benchmarks.
type goBenchResult struct {
	Command string `json:"command"`
	Output  string `json:"output"`
	Failed  string `json:"failed,omitempty"`
}

var goBenches = [][]string{
	{"test", "-run", "^$", "-bench", "HotInvoke", "-benchmem", "-count", "3", "./httpapi/"},
	{"test", "-run", "^$", "-bench", ".", "-benchmem", "./bench/"},
}

// runGoBench runs the hot-path Go benchmarks, or says why not.
func runGoBench(ctx context.Context, o *options) ([]goBenchResult, string) {
	switch {
	case o.goBench == "off":
		return nil, "--go-bench off"
	case o.goBench == "auto" && o.device != device.KindHost:
		return nil, "they measure the host device; run with --go-bench on to include them"
	case !goAvailable(o.repo):
		return nil, "no Go toolchain or go.mod here"
	}
	var out []goBenchResult
	for _, args := range goBenches {
		cmdline := "go " + strings.Join(quoteArgs(args), " ")
		logf("%s", cmdline)
		cctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
		cmd := exec.CommandContext(cctx, "go", args...)
		cmd.Dir = o.repo
		b, err := cmd.CombinedOutput()
		cancel()
		r := goBenchResult{Command: cmdline, Output: benchLines(string(b))}
		if err != nil {
			r.Failed = err.Error() + "\n" + lastLines(string(b), 20)
		}
		out = append(out, r)
	}
	return out, ""
}

// benchLines keeps the environment header and the result lines.
func benchLines(s string) string {
	var keep []string
	for _, l := range strings.Split(s, "\n") {
		for _, p := range []string{"goos:", "goarch:", "pkg:", "cpu:", "Benchmark"} {
			if strings.HasPrefix(l, p) {
				keep = append(keep, strings.TrimRight(l, " \t"))
				break
			}
		}
	}
	return strings.Join(keep, "\n")
}

func lastLines(s string, n int) string {
	ls := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(ls) > n {
		ls = ls[len(ls)-n:]
	}
	return strings.Join(ls, "\n")
}

func quoteArgs(args []string) []string {
	out := make([]string, len(args))
	for i, a := range args {
		if strings.ContainsAny(a, "^$ *") {
			a = "'" + a + "'"
		}
		out[i] = a
	}
	return out
}
