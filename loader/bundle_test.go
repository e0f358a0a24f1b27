package loader_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/internal/testkit"
	"github.com/plover-run/plover/loader"
)

// CheckBundle is the one static check of deploy, the server and the
// program load: each refusal names what is wrong.
func TestCheckBundle(t *testing.T) {
	dir := t.TempDir()
	testkit.BuildLib(t, testkit.KernelsSource(), dir, "kernels.so")
	if err := os.WriteFile(filepath.Join(dir, "w.bin"), []byte{1, 2, 3, 4}, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "big.bin"), make([]byte, 1<<20+1), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name   string
		change func(m *abi.Manifest)
		target string
		want   string // "" accepts
	}{
		{"valid", func(m *abi.Manifest) {}, abi.TargetHost, ""},
		{"valid with constants", func(m *abi.Manifest) { m.Constants = "w.bin" }, abi.TargetHost, ""},
		{"missing constants", func(m *abi.Manifest) { m.Constants = "gone.bin" }, abi.TargetHost, "constants: gone.bin: no such file"},
		{"manifest target differs from the library's", func(m *abi.Manifest) { m.Target = abi.TargetCUDA }, abi.TargetHost, `but plover.json says "target": "cuda"`},
		{"device target differs", func(m *abi.Manifest) {}, abi.TargetCUDA, `the device is "cuda"`},
		{"unknown kernel", func(m *abi.Manifest) { m.Chain[0].Kernel = "nope" }, abi.TargetHost, `kernels.so: chain[0].kernel: kernel "nope" is not in the library`},
		// A __global__ kernel named where its entry should be: the field,
		// and that a chain names entries.
		{"a __global__ kernel in the chain", func(m *abi.Manifest) {
			m.Chain = append(m.Chain, abi.Launch{Kernel: "copy_bytes", Grid: 1, Block: 1})
		}, abi.TargetHost, `chain[1].kernel: kernel "copy_bytes" is not in the library; this bundle declares `},
		{"a __global__ kernel in the chain, the hint", func(m *abi.Manifest) {
			m.Chain = append(m.Chain, abi.Launch{Kernel: "copy_bytes", Grid: 1, Block: 1})
		}, abi.TargetHost, `: a chain names entries (their PLOVER_ENTRY names), not the __global__ kernels they launch`},
		{"abi mismatch", func(m *abi.Manifest) { m.ABI = 1 }, abi.TargetHost, `plover.json says "abi": 1`},
		{"batch without PLOVER_BATCHED", func(m *abi.Manifest) {
			m.Batch = &abi.Batch{MaxItems: 2, ItemInputBytes: 4, ItemOutputBytes: 4}
		}, abi.TargetHost, "does not declare PLOVER_BATCHED"},
		{"missing library", func(m *abi.Manifest) { m.Library = "gone.so" }, abi.TargetHost, "gone.so"},
		// Only a worker is held to max_host_memory_mb (FitsHostMemory):
		// CheckBundle runs in the server too, where nothing enforces it.
		{"constants over max_host_memory_mb", func(m *abi.Manifest) { m.Constants, m.MaxHostMemoryMB = "big.bin", 1 }, abi.TargetHost, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := testkit.Manifest("fn")
			tt.change(m)
			_, err := loader.CheckBundle(dir, m, tt.target)
			switch {
			case tt.want == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
				t.Fatalf("got %v, want an error containing %q", err, tt.want)
			}
		})
	}
	// A typo of an entry gets the entry suggested, and no word of kernels.
	m := testkit.Manifest("fn")
	m.Chain[0].Kernel = "ecoh"
	if _, err := loader.CheckBundle(dir, m, abi.TargetHost); err == nil || !strings.HasSuffix(err.Error(), `(did you mean "echo"?)`) {
		t.Fatalf("typo: %v", err)
	}
	// So does a hook's, which deploy refuses: the function would run
	// without the hook. The entries are the test kernels'.
	src := filepath.Join(dir, "typo.cu")
	def := "#include \"" + testkit.KernelsSource() + "\"\nPLOVER_EXPORT void plover_unlaod(plover_state_t *s) { (void)s; }\n"
	if err := os.WriteFile(src, []byte(def), 0o644); err != nil {
		t.Fatal(err)
	}
	testkit.BuildLib(t, src, dir, "typo.so")
	m = testkit.Manifest("fn")
	m.Library = "typo.so"
	info, err := loader.CheckBundle(dir, m, abi.TargetHost)
	if err != nil {
		t.Fatalf("a hook's typo, checked as a load checks it: %v", err)
	}
	if err := info.CheckHooks(filepath.Join(dir, m.Library)); err == nil || !strings.Contains(err.Error(), `typo.so: exports the function plover_unlaod, which the runtime never calls`) || !strings.HasSuffix(err.Error(), `(did you mean "plover_unload"?)`) {
		t.Fatalf("a hook's typo: %v", err)
	}
}

// On the host the constants and tmp live in the worker, which its own
// max_host_memory_mb would kill at its first memory sample; in checked
// mode, with zero_out, out_bytes too, from its first request.
func TestFitsHostMemory(t *testing.T) {
	for _, tt := range []struct {
		name      string
		change    func(m *abi.Manifest)
		constSize int64
		checked   bool
		want      string // "" accepts
	}{
		{"constants over it", func(m *abi.Manifest) { m.Constants, m.MaxHostMemoryMB = "big.bin", 1 }, 1<<20 + 1, false,
			"max_host_memory_mb: 1 MiB is less than the worker must hold on the host: constants big.bin of 1048577 bytes and one instance's tmp_bytes 64"},
		{"tmp over it", func(m *abi.Manifest) { m.TmpBytes, m.MaxHostMemoryMB = 2<<20, 1 }, 0, false,
			"max_host_memory_mb: 1 MiB is less than the worker must hold on the host: constants (none) of 0 bytes and one instance's tmp_bytes 2097152"},
		{"constants within it", func(m *abi.Manifest) { m.Constants, m.MaxHostMemoryMB = "w.bin", 1 }, 4, false, ""},
		{"no limit", func(m *abi.Manifest) { m.Constants = "big.bin" }, 1 << 30, false, ""},
		{"on a GPU", func(m *abi.Manifest) { m.Target, m.Constants, m.MaxHostMemoryMB = abi.TargetCUDA, "big.bin", 1 }, 1<<20 + 1, false, ""},
		// In place on the server's slots, a worker never touches its own out.
		{"out over it", func(m *abi.Manifest) { m.OutBytes, m.MaxHostMemoryMB = 128<<20, 64 }, 0, false, ""},
		{"out over it, checked", func(m *abi.Manifest) { m.OutBytes, m.MaxHostMemoryMB = 128<<20, 64 }, 0, true,
			"max_host_memory_mb: 64 MiB is less than the worker must hold on the host: constants (none) of 0 bytes and one instance's tmp_bytes 64, and its out_bytes 134217728, zeroed there at every request in checked mode (serve --checked)"},
		{"out over it, checked, not zeroed", func(m *abi.Manifest) {
			m.OutBytes, m.MaxHostMemoryMB, m.ZeroOut = 128<<20, 64, new(false)
		}, 0, true, ""},
		{"out within it, checked", func(m *abi.Manifest) { m.OutBytes, m.MaxHostMemoryMB = 32<<20, 64 }, 0, true, ""},
	} {
		m := testkit.Manifest("fn")
		tt.change(m)
		err := loader.FitsHostMemory(m, tt.constSize, tt.checked)
		if tt.want == "" && err != nil || tt.want != "" && (err == nil || err.Error() != tt.want) {
			t.Errorf("%s: got %v, want %q", tt.name, err, tt.want)
		}
	}
}

// BenchmarkInspect: the static read of a bundle library at every load (in
// a worker, before dlopen), here the CNN sample's when it is built, else
// the test kernels'.
func BenchmarkInspect(b *testing.B) {
	lib := filepath.Join("..", "build", "samples", "cnn-host", "cnn.so")
	if _, err := os.Stat(lib); err != nil {
		lib = testkit.BuildLib(b, testkit.KernelsSource(), b.TempDir(), "kernels.so")
	}
	for b.Loop() {
		if _, err := loader.Inspect(lib); err != nil {
			b.Fatal(err)
		}
	}
}
