package cli

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/engine"
	"github.com/plover-run/plover/httpapi"
	"github.com/plover-run/plover/internal/testkit"
)

// TestDeployAsksTheServersTargetsFirst: plover deploy of a CUDA build to a
// host-only server fails at once with the server's own message (issue 42,
// item 9: it reran nvcc, ~10 s, on a stale build before the server's
// 422). The compiler here is a stand-in that records being run; it must
// not be, for a source directory or its build/cuda named directly. A
// host build to the same server deploys.
func TestDeployAsksTheServersTargetsFirst(t *testing.T) {
	if _, err := exec.LookPath("g++"); err != nil {
		t.Skip("no g++")
	}
	src := initDir(t, "k")
	if _, stderr, err := runCommand(buildCmd(), src); err != nil {
		t.Fatalf("build: %v\n%s", err, stderr)
	}
	// A CUDA build, older than its sources: a deploy would rebuild it.
	cuda := filepath.Join(src, BuildDir, abi.TargetCUDA)
	if err := os.CopyFS(cuda, os.DirFS(filepath.Join(src, BuildDir, abi.TargetHost))); err != nil {
		t.Fatal(err)
	}
	setManifestField(t, cuda, "target", abi.TargetCUDA)
	old := time.Now().Add(-time.Hour)
	os.Chtimes(filepath.Join(cuda, "k.so"), old, old)
	ran := filepath.Join(t.TempDir(), "nvcc-ran")
	nvcc := filepath.Join(t.TempDir(), "nvcc")
	if err := os.WriteFile(nvcc, []byte("#!/bin/sh\ntouch "+ran+"\nexit 1\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("NVCC", nvcc)
	srcCUDA := t.TempDir() // the source directory itself, its plover.json saying cuda
	if err := os.CopyFS(srcCUDA, os.DirFS(src)); err != nil {
		t.Fatal(err)
	}
	setManifestField(t, srcCUDA, "target", abi.TargetCUDA)
	os.Chtimes(filepath.Join(srcCUDA, BuildDir, abi.TargetCUDA, "k.so"), old, old)

	// And one with no host build: the message says how to make one.
	srcUnbuilt := t.TempDir()
	if err := os.CopyFS(srcUnbuilt, os.DirFS(srcCUDA)); err != nil {
		t.Fatal(err)
	}
	os.RemoveAll(filepath.Join(srcUnbuilt, BuildDir, abi.TargetHost))

	url := testkit.Serve(t, testkit.Engine(t, engine.Config{}), httpapi.Options{})
	const want = `(422 invalid: target: the bundle is built for "cuda"; this node's devices run "host")`
	for _, tc := range []struct {
		dir, hint string // hint: what the message says to do next ("" none)
	}{
		{cuda, ""},
		{srcCUDA, "its host build is there: plover deploy " + filepath.Join(srcCUDA, BuildDir, abi.TargetHost)},
		{srcUnbuilt, "build it for this server: plover build " + srcUnbuilt + " --target host, then plover deploy " + filepath.Join(srcUnbuilt, BuildDir, abi.TargetHost)},
	} {
		dir := tc.dir
		_, stderr, err := runCommand(deployCmd(), dir, "--server", url)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("deploy %s: %v\nwant an error containing %q\n%s", dir, err, want, stderr)
		}
		if err != nil && tc.hint != "" && !strings.Contains(err.Error(), tc.hint) {
			t.Errorf("deploy %s: %v\nwant the next step %q", dir, err, tc.hint)
		}
		if err != nil && tc.hint == "" && strings.Contains(err.Error(), "plover build") {
			t.Errorf("deploy of the built bundle %s: %v\nwant no build advice", dir, err)
		}
		if _, err := os.Stat(ran); err == nil {
			t.Fatalf("deploy %s ran the CUDA compiler before the server refused the target:\n%s", dir, stderr)
		}
	}
	if out, stderr, err := runCommand(deployCmd(), src, "--server", url); err != nil || !strings.Contains(out, "deployed k version") {
		t.Fatalf("deploy of the host build: %v, %q, want it deployed\n%s", err, out, stderr)
	}
}
