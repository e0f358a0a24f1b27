package main_test

import (
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/internal/testkit"
)

// TestABI2Served runs ABI 1 and ABI 2 bundles side by side in one real
// `plover serve` with worker processes: version negotiation, out.len
// lowering, declared entries, the lifecycle hooks and their failures, and
// no stale bytes between requests of different sizes on one instance.
func TestABI2Served(t *testing.T) {
	if testing.Short() {
		t.Skip("builds binaries and starts servers")
	}
	bin := buildPlover(t)
	h := &isoHarness{mode: "process", bin: bin, client: &http.Client{Timeout: 20 * time.Second}}
	h.srv = startIsoServer(t, bin, t.TempDir(), nil, "--max-instances", "1")
	libs := t.TempDir()
	v2 := testkit.BuildLib(t, testkit.KernelsSource(), libs, "v2.so")
	v1 := testkit.BuildLib(t, testkit.KernelsSource(), libs, "v1.so", testkit.ABI1Include())
	hooks := testkit.BuildLib(t, testkit.HooksSource(), libs, "hooks.so")
	failLoad := testkit.BuildLib(t, testkit.HooksSource(), libs, "failload.so", "-DFAIL_LOAD")
	failInit := testkit.BuildLib(t, testkit.HooksSource(), libs, "failinit.so", "-DFAIL_INIT")
	crashLoad := testkit.BuildLib(t, testkit.HooksSource(), libs, "crashload.so", "-DCRASH_LOAD")
	hangInit := testkit.BuildLib(t, testkit.HooksSource(), libs, "hanginit.so", "-DHANG_INIT")

	manifest := func(name string, major int, lib string, chain ...abi.Launch) *abi.Manifest {
		m := testkit.Manifest(name)
		m.ABI, m.Library, m.Chain, m.OutBytes = major, filepath.Base(lib), chain, 64
		return m
	}
	deployLib := func(t *testing.T, m *abi.Manifest, lib string, consts []byte) (int, []byte) {
		t.Helper()
		dir := t.TempDir()
		b, err := os.ReadFile(lib)
		if err != nil {
			t.Fatal(err)
		}
		os.WriteFile(filepath.Join(dir, m.Library), b, 0o755)
		if consts != nil {
			m.Constants = "c.bin"
			os.WriteFile(filepath.Join(dir, m.Constants), consts, 0o644)
		}
		testkit.WriteManifest(t, dir, m)
		return h.deployDir(t, dir)
	}
	mustDeploy := func(t *testing.T, m *abi.Manifest, lib string, consts []byte) {
		t.Helper()
		deployed(t, m.Name)(deployLib(t, m, lib, consts))
	}
	invoke := func(t *testing.T, name string, in []byte, wantCode int, want string) []byte {
		t.Helper()
		r := h.invokeNoFatal(name, in, 0)
		if r.err != nil || r.code != wantCode || !strings.Contains(string(r.body), want) {
			t.Fatalf("invoke %s: %d %v %.300q; want %d and %q", name, r.code, r.err, r.body, wantCode, want)
		}
		return r.body
	}
	// invokeChain posts a JSON body with a chain override; it returns the
	// status and the decoded output or error text.
	invokeChain := func(t *testing.T, name string, in []byte, chain ...abi.Launch) (int, []byte) {
		t.Helper()
		body, _ := json.Marshal(map[string]any{"input": base64.StdEncoding.EncodeToString(in), "chain": chain})
		resp, err := h.client.Post(h.srv.url+"/v1/functions/"+name+"/invoke", "application/json", bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var out struct {
			Output []byte `json:"output"`
		}
		var raw bytes.Buffer
		raw.ReadFrom(resp.Body)
		if resp.StatusCode == 200 {
			if err := json.Unmarshal(raw.Bytes(), &out); err != nil {
				t.Fatalf("%s: %v", raw.String(), err)
			}
			return 200, out.Output
		}
		return resp.StatusCode, raw.Bytes()
	}
	padded := func(b []byte, n int) []byte { return append(append([]byte{}, b...), make([]byte, n-len(b))...) }

	t.Run("abi1-bundle-served", func(t *testing.T) {
		mustDeploy(t, manifest("old", 1, v1, launch("echo", 1, 64)), v1, nil)
		if got := invoke(t, "old", []byte("abi one"), 200, ""); !bytes.Equal(got, padded([]byte("abi one"), 64)) {
			t.Fatalf("ABI 1 echo = %q", got)
		}
		// ABI 1 has no out.len lowering: all of out comes back.
		code, got := invokeChain(t, "old", []byte("abcdef"), launch("echo", 1, 64), launch("out_len", 3, 1))
		if code != 200 || len(got) != 64 {
			t.Fatalf("ABI 1 with out_len: %d, %d bytes", code, len(got))
		}
	})
	t.Run("manifest-abi-must-match-library", func(t *testing.T) {
		code, body := deployLib(t, manifest("mismatch", 2, v1, launch("echo", 1, 64)), v1, nil)
		if code != 422 || !strings.Contains(string(body), `built for ABI 1.0 but plover.json says \"abi\": 2`) {
			t.Fatalf("deploy: %d %s", code, body)
		}
	})
	t.Run("out-len-lowered", func(t *testing.T) {
		mustDeploy(t, manifest("trim", 2, v2, launch("echo", 1, 64), launch("out_len", 5, 1)), v2, nil)
		if got := invoke(t, "trim", []byte("hello, world"), 200, ""); string(got) != "hello" {
			t.Fatalf("lowered output = %q, want %q", got, "hello")
		}
		code, got := invokeChain(t, "trim", []byte("x"), launch("echo", 1, 64), launch("out_len", 65, 1))
		if code != 500 || !strings.Contains(string(got), `set s-\u003eout.len to 65, above the 64 bytes of out`) {
			t.Fatalf("raised out.len: %d %s", code, got)
		}
	})
	t.Run("no-stale-bytes-across-sizes", func(t *testing.T) {
		// One instance (--max-instances 1); echo writes only the input's
		// bytes, so the zeroing of out is all that stands between a short
		// request and the previous one's bytes.
		m := manifest("sizes", 2, v2, launch("add_one", 1, 1))
		mustDeploy(t, m, v2, nil)
		code, big := invokeChain(t, "sizes", bytes.Repeat([]byte{7}, 64), launch("echo", 1, 64))
		if code != 200 || !bytes.Equal(big, bytes.Repeat([]byte{7}, 64)) {
			t.Fatalf("first: %d %v", code, big)
		}
		got := invoke(t, "sizes", nil, 200, "") // add_one alone: out was zeroed
		if !bytes.Equal(got, bytes.Repeat([]byte{1}, 64)) {
			t.Fatalf("after a 64-byte response, an empty request returned %v", got)
		}
	})
	t.Run("declared-entries-only", func(t *testing.T) {
		mustDeploy(t, manifest("declared", 2, v2, launch("echo", 1, 64)), v2, nil)
		for _, k := range []string{"not_a_kernel_but_exported", "_Z5twiceIiET_S0_"} {
			code, body := invokeChain(t, "declared", []byte("x"), launch(k, 1, 1))
			if code != 422 || !strings.Contains(string(body), k) {
				t.Errorf("override naming %s: %d %s", k, code, body)
			}
		}
		code, body := deployLib(t, manifest("undeclared", 2, v2, launch("not_a_kernel_but_exported", 1, 1)), v2, nil)
		if code != 422 || !strings.Contains(string(body), `kernel \"not_a_kernel_but_exported\" is not a declared entry`) {
			t.Errorf("deploy naming a helper: %d %s", code, body)
		}
	})
	t.Run("hooks", func(t *testing.T) {
		mustDeploy(t, manifest("hooks", 2, hooks, launch("report", 1, 1)), hooks, []byte{1, 2, 3})
		for i := uint64(1); i <= 3; i++ {
			got := invoke(t, "hooks", nil, 200, "")
			if len(got) != 12 || !bytes.Equal(got[:3], []byte{0xfe, 0xfd, 0xfc}) || binary.LittleEndian.Uint64(got[3:]) != i || got[11] != 1 {
				t.Fatalf("request %d: %v (want decoded constants fe fd fc, count %d, program tag 1)", i, got, i)
			}
		}
	})
	t.Run("hook-failures", func(t *testing.T) {
		mustDeploy(t, manifest("failload", 2, failLoad, launch("report", 1, 1)), failLoad, []byte{1})
		// Every request reloads (in a fresh worker) and fails, until the
		// failures count to back-off: then 503 without a reload.
		for i := 0; i < 5; i++ {
			invoke(t, "failload", nil, 500, "plover_load failed: the weights are corrupt")
		}
		invoke(t, "failload", nil, 503, "is backing off: it failed 5 times")
		mustDeploy(t, manifest("failinit", 2, failInit, launch("report", 1, 1)), failInit, []byte{1})
		invoke(t, "failinit", nil, 500, "plover_instance_init failed: no handle for this instance")
	})
	t.Run("hostile-hooks", func(t *testing.T) {
		// Hooks are bundle code: a crash in plover_load is a worker crash,
		// and an instance init that never returns ends at the request's
		// deadline with its worker stopped.
		mustDeploy(t, manifest("crashload", 2, crashLoad, launch("report", 1, 1)), crashLoad, []byte{1})
		invoke(t, "crashload", nil, 500, "SIGSEGV")
		mustDeploy(t, manifest("hanginit", 2, hangInit, launch("report", 1, 1)), hangInit, []byte{1})
		start := time.Now()
		r := h.invokeNoFatal("hanginit", nil, 1500)
		if r.err != nil || r.code != 504 || time.Since(start) > 5*time.Second {
			t.Fatalf("hanging plover_instance_init: %d %v after %v: %s", r.code, r.err, time.Since(start), r.body)
		}
		// The function still serves the others' requests: the server is fine.
		invoke(t, "hooks", nil, 200, "")
	})
	h.srv.mustBeHealthy(t, "after the ABI 2 cases")
}
