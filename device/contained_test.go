package device

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
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
// process of this binary under each step of that containment alone and
// under all of them in the worker's order, so that a GPU run says which
// step, if any, a driver (under MPS or not) does not stand. A child holds
// its context for a while and runs the chain again before it may pass, as
// a worker lives on between requests: a death 150 ms after the connection
// must fail it. On the fake driver the same children check the harness.

// containSteps are the children: a name and its steps.
var containSteps = []struct{ name, steps string }{
	{"none", ""},
	// contain.Enter as a worker under MPS calls it (no uid to drop where
	// the server is not root, the server's pid to die with, a subreaper:
	// no PID namespace under MPS): no capabilities, no_new_privs on every
	// thread, RLIMIT_NICE and RLIMIT_RTPRIO 0, PDEATHSIG.
	{"enter", "enter"},
	{"fatal-signals", "fatal"}, // contain.DefaultFatalSignals
	{"reach", "reach"},         // the seccomp filter
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
	{"all", "bareenv,enter,reach,nodump,fatal,landlock,limits"},
}

func TestGPUContained(t *testing.T)  { testContained(t, "gpu") }
func TestFakeContained(t *testing.T) { testContained(t, "fake") }

// containHold is how long a child keeps its context between its two runs
// of the chain: past the 150 ms the workers lived under MPS.
var containHold = map[string]time.Duration{"gpu": 2 * time.Second, "fake": 200 * time.Millisecond}

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
	name := t.Name()
	for i, c := range containSteps {
		t.Run(c.name, func(t *testing.T) {
			// The time left shared among the children still to run: one
			// that hangs in the driver (connecting to MPS, say) ends with
			// its goroutines' stacks, and the others still run.
			limit := 30 * time.Second
			if dl, ok := t.Deadline(); ok {
				limit = min(limit, (time.Until(dl)-time.Second)/time.Duration(len(containSteps)-i))
			}
			base := os.Environ()
			if strings.Contains(c.steps, "bareenv") {
				base = bareEnv()
			}
			out, err := childTest(t, name, limit, append(append(base, childEnv...), "PLOVER_CONTAIN_STEPS="+c.steps))
			for _, l := range strings.Split(out, "\n") {
				if i := strings.Index(l, ": "); i >= 0 && strings.Contains(l, "applied: ") {
					t.Log("child: " + l[i+2:])
				}
			}
			switch {
			case errors.Is(err, errChildSkipped):
				t.Skipf("the child skipped: %s", strings.TrimSpace(out))
			case err != nil:
				t.Fatalf("the chain contained by %q: %v; the child's output:\n%s", c.steps, err, out)
			}
		})
	}
}

// bareEnv is a worker's environment (worker.workerCommand with
// deviceSelection, and mpsEnv's directories; device cannot import worker,
// which imports it: keep the three in step).
func bareEnv() []string {
	env := []string{"PATH=/usr/local/bin:/usr/bin:/bin"}
	for _, k := range []string{"CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_LOG_DIRECTORY"} {
		if v, ok := os.LookupEnv(k); ok {
			env = append(env, k+"="+v)
		}
	}
	return env
}

// containedChain contains this process by steps in a worker's order
// (worker/inside: containSelf, openDevice, restrictFS, then the bundle's
// load), runs the suite's chain and memfd-slot tests, keeps the device for
// containHold, and runs them again. A step that applies nothing here skips
// the test.
func containedChain(t *testing.T, env string, steps []string) {
	has := func(s string) bool { return slices.Contains(steps, s) }
	if has("limits") {
		// What a worker of the bench's functions is started with under
		// MPS (worker.mpsEnv: no gpu_share in their manifests, a device
		// memory budget of a few MiB plus 1 GiB); the driver reads it as
		// it initialises. With 512 MiB (513 MB) an H200's context did not
		// fit: this child failed where the others passed (2026-12-04).
		os.Setenv("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "0=1025MB")
	}
	if has("enter") {
		if err := contain.Enter(contain.Policy{ParentPID: os.Getppid(), Subreaper: true}); err != nil {
			t.Fatalf("contain.Enter: %v", err)
		}
	}
	if has("reach") {
		// Where Enter did not set no_new_privs on every thread, it is
		// set on the thread that installs the filter (the kernel asks it
		// of that thread), which this goroutine keeps meanwhile.
		runtime.LockOSThread()
		if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
			t.Fatalf("prctl(PR_SET_NO_NEW_PRIVS): %v", err)
		}
		on, err := contain.RestrictReach()
		runtime.UnlockOSThread()
		if err != nil {
			t.Fatalf("contain.RestrictReach: %v", err)
		}
		if !on {
			t.Skip("no seccomp filters on this kernel: the reach filter applies nothing")
		}
		t.Log("reach filter applied: true")
	}
	if has("nodump") {
		if err := contain.MakeNonDumpable(); err != nil {
			t.Fatalf("contain.MakeNonDumpable: %v", err)
		}
	}
	if has("fatal") {
		if err := contain.DefaultFatalSignals(); err != nil {
			t.Fatalf("contain.DefaultFatalSignals: %v", err)
		}
	}
	// The device as a worker opens it: its ordinal alone (device.OpenOne),
	// before Landlock.
	var bundle, driver string
	var entries []string
	switch env {
	case "gpu":
		p, err := cudaBundle()
		if err != nil {
			t.Fatal(err)
		}
		bundle, driver, entries = p, libcuda, testEntries
	default:
		bundle, driver, entries = filepath.Join(fakeDir(t), "fakebundle.so"), fakeLib(t), fakeEntries
	}
	g, err := openOneGPU(driver, 0, 0, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatalf("open the device: %v", err)
	}
	defer g.Close()
	if (has("signals") || has("sockets")) && contain.LandlockABI() < 6 {
		t.Skipf("Landlock ABI %d scopes neither signals nor abstract sockets: the same as landlock", contain.LandlockABI())
	}
	if has("landlock") {
		rules := contain.DefaultRules()
		rules.RODirs = append(rules.RODirs, filepath.Dir(bundle))
		if contain.MPSRunning() { // as a worker under MPS (cli: mpsFor)
			rules.AddMPS(os.Getenv("CUDA_MPS_PIPE_DIRECTORY"))
		}
		rules.OpenSignals, rules.OpenAbstractSockets = has("signals"), has("sockets")
		applied, err := contain.RestrictFS(rules)
		if err != nil {
			t.Fatalf("contain.RestrictFS: %v", err)
		}
		if !applied {
			t.Skip("no Landlock on this kernel: the landlock step applies nothing")
		}
		// The rules hold: what they do not name (this binary) is out of
		// reach.
		if f, err := os.Open(os.Args[0]); err == nil {
			f.Close()
			t.Fatalf("Landlock applied, and %s is still readable", os.Args[0])
		}
		t.Log("Landlock applied: true")
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
	// The chain, and a run in place on a memfd slot the driver pins, as a
	// worker's every instance is (the server's shared slot).
	runs := func(t *testing.T) {
		t.Run("chain", func(t *testing.T) { testChain(t, e) })
		t.Run("memfd slot", func(t *testing.T) { testMemfdSlot(t, e) })
	}
	runs(t)
	time.Sleep(containHold[env])
	if t.Failed() {
		return
	}
	t.Run(fmt.Sprintf("again after %v", containHold[env]), runs)
}
