package device

import (
	"context"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/plover-run/plover/internal/fakecuda"
	"github.com/plover-run/plover/loader"
	"github.com/plover-run/plover/worker/contain"
	"golang.org/x/sys/unix"
)

// A worker contains itself before it runs bundle code (worker/inside:
// containSelf, then restrictFS once its device is open), and under MPS on
// an H200 (2026-12-04) every worker left its MPS server about 150 ms after
// connecting, where the server process, an MPS client too but not
// contained, stayed. These tests run the device suite's chain in a child
// process of this binary under each containment step alone and under all
// of them in the worker's order, so that a GPU run says which step, if
// any, a driver (under MPS or not) does not stand: the reach filter
// (seccomp, after no_new_privs), non-dumpable, Landlock with the worker's
// rules (applied after the device is open, the bundle loaded after it),
// Landlock with its scope of signals or of abstract sockets left open (a
// lead: the H200's kernel has both), and the MPS limits a worker is started with (in
// its environment). On the fake driver the same children check the steps
// and the harness.

// containSteps are the children's names, each a set of steps.
var containSteps = []struct{ name, steps string }{
	{"none", ""},
	{"reach", "reach"},
	{"nodump", "nodump"},
	{"landlock", "landlock"},
	// Landlock with one of its scopes left open: signals to the MPS
	// server (FSRules.OpenSignals), or its abstract Unix sockets
	// (OpenAbstractSockets).
	{"landlock-signals", "landlock,signals"},
	{"landlock-sockets", "landlock,sockets"},
	{"mps-limits", "limits"},
	// A worker's environment: PATH, the device selection and the MPS
	// daemon's directories, nothing else (no HOME, no TMPDIR).
	{"bare-env", "bareenv"},
	{"all", "bareenv,reach,nodump,landlock,limits"},
}

// bareEnv is a worker's environment (worker.workerCommand, mpsEnv) and
// what a child needs to be one of these tests.
func bareEnv() []string {
	env := []string{"PATH=/usr/local/bin:/usr/bin:/bin"}
	for _, k := range []string{"CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_LOG_DIRECTORY"} {
		if v, ok := os.LookupEnv(k); ok {
			env = append(env, k+"="+v)
		}
	}
	return env
}

func TestGPUContained(t *testing.T)  { testContained(t, "gpu") }
func TestFakeContained(t *testing.T) { testContained(t, "fake") }

// testContained is the parent (each step set in a child, which must pass
// its chain) or, in a child, the contained chain.
func testContained(t *testing.T, env string) {
	if os.Getenv("PLOVER_CONTAIN_CHILD") == env {
		containedChain(t, env, strings.Split(os.Getenv("PLOVER_CONTAIN_STEPS"), ","))
		return
	}
	childEnv := []string{"PLOVER_CONTAIN_CHILD=" + env}
	switch env {
	case "gpu":
		gpuEnv(t) // skips without a device
		childEnv = append(childEnv, "PLOVER_TEST_CUDA_BUNDLE_DIR="+gpuT.bundleDir)
	default:
		// Built once, lent to the children: one under Landlock could not
		// remove a build of its own.
		childEnv = append(childEnv, fakecuda.DirEnv+"="+fakeDir(t))
	}
	if contain.LandlockABI() == 0 {
		t.Log("no Landlock on this kernel: the landlock step applies nothing")
	}
	name := "^Test" + strings.ToUpper(env[:1]) + env[1:] + "Contained$"
	for _, c := range containSteps {
		t.Run(c.name, func(t *testing.T) {
			// A child that hangs in the driver (connecting to MPS, say)
			// ends with its goroutines' stacks well before the others'
			// turns are spent.
			ctx, cancel := context.WithTimeout(t.Context(), 15*time.Second)
			defer cancel()
			cmd := exec.CommandContext(ctx, os.Args[0], "-test.run="+name, "-test.v", "-test.count=1", "-test.timeout=12s")
			base := os.Environ()
			if strings.Contains(c.steps, "bareenv") {
				base = bareEnv()
			}
			cmd.Env = append(append(base, childEnv...), "PLOVER_CONTAIN_STEPS="+c.steps)
			out, err := cmd.CombinedOutput()
			if err != nil || !strings.Contains(string(out), "--- PASS: "+name[1:len(name)-1]) {
				t.Fatalf("the chain contained by %q: %v; the child's output:\n%s", c.steps, err, out)
			}
			for _, l := range strings.Split(string(out), "\n") {
				if i := strings.Index(l, ": "); i >= 0 && (strings.Contains(l, "installed: ") || strings.Contains(l, "applied: ")) {
					t.Log("child: " + l[i+2:])
				}
			}
		})
	}
}

// containedChain opens the device, contained by steps as a worker is,
// then loads the bundle and runs the suite's chain test on that device.
func containedChain(t *testing.T, env string, steps []string) {
	has := func(s string) bool { return slices.Contains(steps, s) }
	if has("limits") {
		// What a worker of a small function is started with under MPS:
		// half the SMs, its budget plus 512 MiB of device memory
		// (worker.mpsEnv). The driver reads them as it initialises.
		os.Setenv("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "50")
		os.Setenv("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "0=513MB")
	}
	if has("reach") {
		if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
			t.Fatal(err)
		}
		on, err := contain.RestrictReach()
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("reach filter installed: %v", on)
	}
	if has("nodump") {
		if err := contain.MakeNonDumpable(); err != nil {
			t.Fatal(err)
		}
	}
	var bundle string
	var entries []string
	var g *GPU
	switch env {
	case "gpu":
		p, err := cudaBundle()
		if err != nil {
			t.Fatal(err)
		}
		bundle, entries = p, testEntries
		gpus, err := openGPUs(libcuda, 0, nil)
		if err != nil {
			t.Fatalf("open CUDA: %v", err)
		}
		g = gpus[0]
	default:
		bundle, entries = filepath.Join(fakeDir(t), "fakebundle.so"), fakeEntries
		g = openFake(t, 0, 0, nil)
	}
	if has("landlock") {
		rules := contain.DefaultRules()
		rules.RODirs = append(rules.RODirs, filepath.Dir(bundle))
		rules.OpenSignals, rules.OpenAbstractSockets = has("signals"), has("sockets")
		if pipe := os.Getenv("CUDA_MPS_PIPE_DIRECTORY"); pipe != "" || mpsDaemon() {
			rules.AddMPS(pipe)
		}
		applied, err := contain.RestrictFS(rules)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("Landlock applied: %v", applied)
		if applied {
			// The rules hold: what they do not name (this binary) is
			// out of reach.
			if f, err := os.Open(os.Args[0]); err == nil {
				f.Close()
				t.Fatalf("Landlock applied, and %s is still readable", os.Args[0])
			}
		}
	}
	lib, err := loader.Open(bundle, "cuda", entries)
	if err != nil {
		t.Fatalf("load the bundle: %v", err)
	}
	calls, err := lib.Symbol("pl_entry_calls")
	if err != nil {
		t.Fatal(err)
	}
	e := &bundleEnv{name: env, fake: env != "gpu", lib: lib, ents: NewEntries(lib), calls: (*int64)(calls)}
	e.open = func(testing.TB, int64, *slog.Logger) *GPU { return g }
	testChain(t, e)
}

// mpsDaemon reports whether an MPS control daemon listens at the default
// pipe directory.
func mpsDaemon() bool {
	fi, err := os.Stat(filepath.Join(contain.MPSPipeDefault, "control"))
	return err == nil && fi.Mode()&os.ModeSocket != 0
}
