package main_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/plover-run/plover/internal/testkit"
)

// pythonClient is the Python client's directory, clients/python.
func pythonClient(t *testing.T) (python, dir string) {
	t.Helper()
	python, err := exec.LookPath("python3")
	if err != nil {
		t.Skipf("python3 not found, cannot test the Python client (clients/python): %v", err)
	}
	return python, filepath.Join(testkit.Root(), "clients", "python")
}

// runUnittest runs python3 -m unittest on the given test modules of
// clients/python/tests, with env added, and fails the test on failure.
func runUnittest(t *testing.T, python, dir string, env []string, modules ...string) string {
	t.Helper()
	args := append([]string{"-m", "unittest", "-v"}, modules...)
	cmd := exec.Command(python, args...)
	cmd.Dir = filepath.Join(dir, "tests")
	cmd.Env = append(os.Environ(), append([]string{"PYTHONPATH=" + dir, "PYTHONDONTWRITEBYTECODE=1"}, env...)...)
	done := make(chan struct{})
	var out []byte
	var err error
	go func() { out, err = cmd.CombinedOutput(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Minute):
		cmd.Process.Kill()
		<-done
		t.Fatalf("python3 -m unittest %s: still running after 5 minutes:\n%s", strings.Join(modules, " "), out)
	}
	if err != nil {
		t.Fatalf("python3 -m unittest %s: %v\n%s", strings.Join(modules, " "), err, out)
	}
	t.Logf("python3 -m unittest %s:\n%s", strings.Join(modules, " "), out)
	return string(out)
}

// TestPythonClientUnit runs the Python client's tests that need no server.
func TestPythonClientUnit(t *testing.T) {
	python, dir := pythonClient(t)
	runUnittest(t, python, dir, []string{"PLOVER_TEST_FUNCTION="}, "test_unit")
}

// TestPythonClient runs clients/python/tests/test_e2e.py against a real
// plover serve with --auth-file: invoke (bytes and NumPy), the PyPlover
// JSON shape, the timing headers, the control plane, errors, and deploy
// through the CLI.
func TestPythonClient(t *testing.T) {
	python, dir := pythonClient(t)
	if testing.Short() {
		t.Skip("builds binaries and starts a server")
	}
	bin := buildPlover(t)
	work := t.TempDir()
	authFile := filepath.Join(work, "tokens")
	toks := writeAuthFile(t, authFile, [][3]string{
		{"root", "admin", "*"},
		{"app", "invoke", "*"},
	})
	srv := startIsoServer(t, bin, t.TempDir(), nil, "--auth-file", authFile)

	const fn = "pyecho"
	fnDir := testkit.BundleDir(t, testkit.Manifest(fn), nil)
	env := []string{"PLOVER_SERVER=" + srv.url, "PLOVER_TOKEN=" + toks["root"]}
	if out := run(t, bin, env, "deploy", fnDir); !strings.Contains(out, "deployed "+fn+" version") {
		t.Fatalf("deploy said %q", out)
	}
	packed := filepath.Join(work, fn+".bundle")
	if err := os.WriteFile(packed, packDir(t, fnDir), 0o644); err != nil {
		t.Fatal(err)
	}
	const cliFn = "pycli"
	cliDir := testkit.BundleDir(t, testkit.Manifest(cliFn), nil)

	out := runUnittest(t, python, dir, append(env,
		"PATH="+filepath.Dir(bin)+string(os.PathListSeparator)+os.Getenv("PATH"), // the plover CLI, for Client.deploy
		"PLOVER_TEST_FUNCTION="+fn,
		"PLOVER_TEST_PACKED="+packed,
		"PLOVER_TEST_BUNDLE="+cliDir,
		"PLOVER_TEST_BUNDLE_NAME="+cliFn,
		"PLOVER_TEST_INVOKE_TOKEN="+toks["app"],
	), "test_e2e")
	// Only NumPy may be missing; everything else must have run.
	for _, line := range strings.Split(out, "\n") {
		if strings.Contains(line, "... skipped") && !strings.Contains(line, "NumPy") {
			t.Errorf("a test was skipped: %s", line)
		}
	}
}

// The Python client installs with no network and no build dependency: pip
// with --no-index (no package index at all) into a fresh virtual
// environment, NumPy left out (issue 27, item 8).
func TestPythonClientInstallsOffline(t *testing.T) {
	python, dir := pythonClient(t)
	venv := filepath.Join(t.TempDir(), "venv")
	if out, err := exec.Command(python, "-m", "venv", venv).CombinedOutput(); err != nil {
		t.Skipf("python3 -m venv is not available here (Debian: python3-venv): %v\n%s", err, out)
	}
	pip := exec.Command(filepath.Join(venv, "bin", "pip"), "install", "--no-index", "--no-cache-dir", dir)
	pip.Env = append(os.Environ(), "PIP_NO_INPUT=1", "PIP_DISABLE_PIP_VERSION_CHECK=1")
	if out, err := pip.CombinedOutput(); err != nil {
		t.Fatalf("pip install --no-index %s: %v\n%s", dir, err, out)
	}
	check := exec.Command(filepath.Join(venv, "bin", "python"), "-c",
		"import plover, importlib.metadata as m; print(plover.__version__, m.version('plover-client'), m.metadata('plover-client').get_all('Provides-Extra'))")
	check.Dir = t.TempDir() // not the source tree: the installed package
	out, err := check.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "0.1.0 0.1.0 ['numpy']") {
		t.Fatalf("the installed client: %v\n%s", err, out)
	}
	// Editable (pip install -e): the package is the source directory's.
	pip = exec.Command(filepath.Join(venv, "bin", "pip"), "install", "--no-index", "--no-cache-dir", "--force-reinstall", "-e", dir)
	pip.Env = append(os.Environ(), "PIP_NO_INPUT=1", "PIP_DISABLE_PIP_VERSION_CHECK=1")
	if out, err := pip.CombinedOutput(); err != nil {
		t.Fatalf("pip install --no-index -e %s: %v\n%s", dir, err, out)
	}
	where := exec.Command(filepath.Join(venv, "bin", "python"), "-c", "import plover; print(plover.__file__)")
	where.Dir = t.TempDir()
	if out, err := where.CombinedOutput(); err != nil || !strings.HasPrefix(strings.TrimSpace(string(out)), filepath.Join(dir, "plover")) {
		t.Fatalf("the editable client: %v\n%s", err, out)
	}
}
