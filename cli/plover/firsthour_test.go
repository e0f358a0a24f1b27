package main_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/plover-run/plover/internal/testkit"
)

// A plover.json value of the wrong type, through the real CLI: the field,
// the value and the type wanted, the file named once, no Go internals
// (issue 27, item 6).
func TestManifestTypeErrorServed(t *testing.T) {
	if testing.Short() {
		t.Skip("builds binaries")
	}
	bin := buildPlover(t)
	dir := testkit.BundleDir(t, testkit.Manifest("echo"), nil)
	mp := filepath.Join(dir, "plover.json")
	b, err := os.ReadFile(mp)
	if err != nil {
		t.Fatal(err)
	}
	bad := strings.Replace(string(b), `"out_bytes": 256`, `"out_bytes": "400"`, 1)
	if bad == string(b) {
		t.Fatalf("manifest has no out_bytes to break:\n%s", b)
	}
	os.WriteFile(mp, []byte(bad), 0o644)
	out, err := exec.Command(bin, "deploy", dir, "--store", "file://"+t.TempDir()).CombinedOutput()
	msg := string(out)
	if err == nil || !strings.Contains(msg, `out_bytes: "400" is a string, want a whole number`) ||
		strings.Contains(msg, "Go struct") || strings.Count(msg, "plover.json") != 1 {
		t.Fatalf("plover deploy: %v\n%s", err, msg)
	}
}

// A deploy straight to the store is held to what a default server checks
// at deploy: a host function whose constants pass its own
// max_host_memory_mb could never stay in its worker, and is refused naming
// the field; within it, the deploy goes through.
func TestStoreDeployChecksHostMemory(t *testing.T) {
	if testing.Short() {
		t.Skip("builds binaries")
	}
	bin := buildPlover(t)
	for _, tc := range []struct {
		name  string
		limit int64
		ok    bool
	}{{"under", 1, false}, {"within", 8, true}} {
		t.Run(tc.name, func(t *testing.T) {
			m := testkit.Manifest("echo")
			m.Constants, m.MaxHostMemoryMB = "weights.bin", tc.limit
			dir := testkit.BundleDir(t, m, make([]byte, 2<<20))
			out, err := exec.Command(bin, "deploy", dir, "--store", "file://"+t.TempDir()).CombinedOutput()
			refused := err != nil && strings.Contains(string(out), "plover.json: max_host_memory_mb: 1 MiB is less than the worker must hold")
			if tc.ok && err != nil || !tc.ok && !refused {
				t.Fatalf("plover deploy: %v\n%s", err, out)
			}
		})
	}
}

// A kernel name with a typo, through the real CLI: the entries the bundle
// declares and the closest one (issue 27, item 5).
func TestKernelTypoServed(t *testing.T) {
	if testing.Short() {
		t.Skip("builds binaries")
	}
	bin := buildPlover(t)
	m := testkit.Manifest("echo")
	m.Chain[0].Kernel = "ecoh"
	dir := testkit.BundleDir(t, m, nil)
	out, err := exec.Command(bin, "deploy", dir, "--store", "file://"+t.TempDir()).CombinedOutput()
	if err == nil || !strings.Contains(string(out), `kernel "ecoh" is not in the library; this bundle declares`) || !strings.Contains(string(out), `(did you mean "echo"?)`) {
		t.Fatalf("plover deploy: %v\n%s", err, out)
	}
}

// plover run runs the chain in a worker, as a server does: a kernel that
// writes far past out ends in the worker's crash, reported, and one that
// never returns is stopped at --timeout; neither hangs nor takes plover run
// down (issue 27, item 1). Each command is bounded by the test's own
// timeout.
func TestRunContainsHostileKernels(t *testing.T) {
	if testing.Short() {
		t.Skip("builds binaries")
	}
	bin := buildPlover(t)
	in := filepath.Join(t.TempDir(), "in.bin")
	os.WriteFile(in, make([]byte, 4000), 0o644)
	for _, tc := range []struct {
		kernel string
		want   []string
	}{
		{"overflow_out", []string{"SIGSEGV", "running the chain"}},
		{"spin", []string{"still running at the --timeout of 500ms", "raise --timeout"}},
	} {
		t.Run(tc.kernel, func(t *testing.T) {
			m := testkit.Manifest("hostile-" + strings.ReplaceAll(tc.kernel, "_", "-"))
			m.Library, m.OutBytes = "hostile.so", 400
			m.Chain[0].Kernel = tc.kernel
			dir := t.TempDir()
			testkit.BuildLib(t, testkit.HostileSource(), dir, m.Library)
			testkit.WriteManifest(t, dir, m)
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			start := time.Now()
			out, err := exec.CommandContext(ctx, bin, "run", dir, "--in", in, "--out", os.DevNull, "--timeout", "500ms").CombinedOutput()
			if ctx.Err() != nil {
				t.Fatalf("plover run hung (killed after %v):\n%s", time.Since(start), out)
			}
			for _, w := range tc.want {
				if err == nil || !strings.Contains(string(out), w) {
					t.Fatalf("plover run: %v, want an error containing %q:\n%s", err, w, out)
				}
			}
		})
	}
}

// Deploying a source directory whose sources changed after its build
// rebuilds it first: what is deployed is the edited function, never the
// stale bytes called "unchanged" (issue 27, item 4).
func TestDeployRebuildsAStaleBuild(t *testing.T) {
	if testing.Short() {
		t.Skip("builds binaries")
	}
	bin := buildPlover(t)
	work := t.TempDir()
	store := "file://" + t.TempDir()
	runIn := func(args ...string) string {
		t.Helper()
		cmd := exec.Command(bin, args...)
		cmd.Dir = work
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("plover %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	runIn("init", "edited")
	runIn("build", "edited")
	runIn("deploy", "edited", "--store", store)
	src := filepath.Join(work, "edited", "edited.cu")
	b, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	edited := strings.Replace(string(b), "ab[0] * x[i] + ab[1]", "ab[0] * x[i] - ab[1]", 1)
	if edited == string(b) {
		t.Fatalf("no line to edit in %s", src)
	}
	os.WriteFile(src, []byte(edited), 0o644)
	future := time.Now().Add(2 * time.Second) // newer than the build whatever the clock's grain
	os.Chtimes(src, future, future)
	out := runIn("deploy", "edited", "--store", store)
	if !strings.Contains(out, "rebuilding it") || !strings.Contains(out, "deployed edited version") || strings.Contains(out, "unchanged") {
		t.Fatalf("deploy after an edit:\n%s", out)
	}
}

// The scaffold's Makefile builds what plover.json says: with its constants,
// and with none once plover.json names none (issue 27, item 9).
func TestScaffoldMakefileFollowsConstants(t *testing.T) {
	if testing.Short() {
		t.Skip("builds binaries")
	}
	mk, err := exec.LookPath("make")
	if err != nil {
		t.Skip("make not found")
	}
	bin := buildPlover(t)
	work := t.TempDir()
	if out, err := exec.Command(bin, "init", "fn", "--dir", filepath.Join(work, "fn")).CombinedOutput(); err != nil {
		t.Fatalf("plover init: %v\n%s", err, out)
	}
	dir := filepath.Join(work, "fn")
	build := func(want ...string) {
		t.Helper()
		os.RemoveAll(filepath.Join(dir, "build"))
		cmd := exec.Command(mk, "host")
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("make host: %v\n%s", err, out)
		}
		des, _ := os.ReadDir(filepath.Join(dir, "build", "host"))
		var got []string
		for _, de := range des {
			got = append(got, de.Name())
		}
		if strings.Join(got, " ") != strings.Join(want, " ") {
			t.Fatalf("build/host holds %v, want %v", got, want)
		}
	}
	// fn.d: the headers the compiler read (-MMD), which make and plover
	// run read to tell a stale build; not packed (a bundle is its
	// manifest, library and constants).
	build("constants.bin", "fn.d", "fn.so", "plover.json")
	mp := filepath.Join(dir, "plover.json")
	b, _ := os.ReadFile(mp)
	var kept []string
	for _, l := range strings.Split(string(b), "\n") {
		if !strings.Contains(l, `"constants"`) {
			kept = append(kept, l)
		}
	}
	os.WriteFile(mp, []byte(strings.Join(kept, "\n")), 0o644)
	os.Remove(filepath.Join(dir, "constants.bin"))
	build("fn.d", "fn.so", "plover.json")
}

// An accumulator in tmp without zero_tmp: plover run's answer is right the
// first time and a server's is wrong from the second request on, so plover
// run runs the input once more and warns when the output moved; with
// zero_tmp it does not (issue 27, item 7).
func TestRunWarnsOfStateLeftInTmp(t *testing.T) {
	if testing.Short() {
		t.Skip("builds binaries")
	}
	bin := buildPlover(t)
	in := filepath.Join(t.TempDir(), "in.bin")
	os.WriteFile(in, []byte{1}, 0o644)
	for _, zero := range []bool{false, true} {
		m := testkit.Manifest("counter")
		m.Chain[0].Kernel, m.ZeroTmp = "count", zero
		dir := testkit.BundleDir(t, m, nil)
		out, err := exec.Command(bin, "run", dir, "--in", in, "--out", os.DevNull).CombinedOutput()
		if err != nil {
			t.Fatalf("plover run: %v\n%s", err, out)
		}
		warned := strings.Contains(string(out), `warning: the same input, run again on the same instance, gave another output`) &&
			strings.Contains(string(out), `"zero_tmp": true`)
		if warned == zero {
			t.Fatalf("zero_tmp %v: warned %v:\n%s", zero, warned, out)
		}
	}
}

// ^C on a plover run whose chain never returns, or whose instance is being
// made: it stops at once, says it was interrupted, and leaves nothing
// behind in the temporary directory (the worker's stage links to the
// bundle).
func TestRunInterruptedCleansUp(t *testing.T) {
	if testing.Short() {
		t.Skip("builds binaries")
	}
	bin := buildPlover(t)
	for _, c := range []struct {
		name, src, lib, kernel string
		defs                   []string
		said                   string // ^C once the bundle said it ("": once the worker's stage is there)
	}{
		// ^C in a chain that spins, and in a plover_instance_init of 3 s
		// (said before as the worker's stop, not as the interrupt).
		{name: "in a run", src: testkit.HostileSource(), lib: "hostile.so", kernel: "spin"},
		{name: "in the instance's creation", src: testkit.HooksSource(), lib: "hooks.so", kernel: "report",
			defs: []string{"-DSLOW_INIT_MS=3000", "-DSAY_INIT"}, said: "plover_instance_init begins"},
	} {
		t.Run(c.name, func(t *testing.T) {
			m := testkit.Manifest("spinner")
			m.Library, m.Chain[0].Kernel = c.lib, c.kernel
			dir := t.TempDir()
			testkit.BuildLib(t, c.src, dir, m.Library, c.defs...)
			testkit.WriteManifest(t, dir, m)
			in := filepath.Join(t.TempDir(), "in.bin")
			os.WriteFile(in, []byte{1}, 0o644)
			tmp := t.TempDir()
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			cmd := exec.CommandContext(ctx, bin, "run", dir, "--in", in, "--out", os.DevNull)
			cmd.Env = append(os.Environ(), "TMPDIR="+tmp)
			var out testkit.LogBuffer
			cmd.Stdout, cmd.Stderr = &out, &out
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			// Running: the worker's stage exists under the run's directory,
			// and the bundle said what the case waits for.
			for {
				stages, _ := filepath.Glob(filepath.Join(tmp, "plover-run-*", "worker-*"))
				if len(stages) > 0 && strings.Contains(out.String(), c.said) {
					break
				}
				if ctx.Err() != nil {
					t.Fatalf("no worker stage appeared:\n%s", out.String())
				}
				time.Sleep(20 * time.Millisecond)
			}
			cmd.Process.Signal(os.Interrupt)
			err := cmd.Wait()
			if ctx.Err() != nil {
				t.Fatalf("plover run did not stop on ^C:\n%s", out.String())
			}
			if err == nil || !strings.Contains(out.String(), "interrupted") {
				t.Fatalf("plover run after ^C: %v\n%s", err, out.String())
			}
			if left, _ := os.ReadDir(tmp); len(left) != 0 {
				t.Fatalf("left behind in TMPDIR: %v", left)
			}
		})
	}
}

// What a bundle prints reaches the terminal of plover run, as it did when
// the chain ran in plover run's own process: the worker's stderr is passed
// through whole.
func TestRunShowsWhatTheBundlePrints(t *testing.T) {
	if testing.Short() {
		t.Skip("builds binaries")
	}
	bin := buildPlover(t)
	m := testkit.Manifest("talker")
	m.Chain[0].Kernel = "talk"
	dir := t.TempDir()
	src := `#include <stdio.h>
#include "plover_kernel.h"
PLOVER_BUNDLE(PLOVER_TARGET);
PLOVER_ENTRY(talk) {
  (void)grid; (void)block;
  for (int i = 0; i < 30; i++) fprintf(stderr, "talk line %d\n", i);
  s->out.dat[0] = 1;
}
`
	srcFile := filepath.Join(t.TempDir(), "talk.cu")
	os.WriteFile(srcFile, []byte(src), 0o644)
	testkit.BuildLib(t, srcFile, dir, m.Library)
	testkit.WriteManifest(t, dir, m)
	in := filepath.Join(t.TempDir(), "in.bin")
	os.WriteFile(in, []byte{1}, 0o644)
	out, err := exec.Command(bin, "run", dir, "--in", in, "--out", os.DevNull).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "talk line 0\n") || !strings.Contains(string(out), "talk line 29\n") {
		t.Fatalf("plover run: %v, want the bundle's 30 lines:\n%s", err, out)
	}
}
