package loader

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/plover-run/plover/abi"
)

// CheckBundle is the static check of a bundle directory against its
// manifest and the target it is to run on, with no bundle code run: the
// library's ELF headers, ABI version and target, every kernel the chain
// names is a declared entry, the manifest's "abi" and "batch" agree with
// the library, and the constants file exists. plover deploy runs it before
// uploading, the server before storing a bundle, and every program load
// before dlopen (OpenBundle), so the three cannot drift apart. Errors name
// the library by its path under dir. Not max_host_memory_mb: only a worker
// is held to it (FitsHostMemory).
func CheckBundle(dir string, m *abi.Manifest, target string) (*Info, error) {
	path := filepath.Join(dir, m.Library)
	info, err := Inspect(path)
	if err != nil {
		return nil, err
	}
	if info.Target != m.Target {
		return nil, &Error{Path: path, Reason: fmt.Sprintf("built for target %q, but plover.json says \"target\": %q", info.Target, m.Target)}
	}
	if err := info.Check(path, target, nil); err != nil {
		return nil, err
	}
	for i, l := range m.Chain { // named by the manifest's field
		if err := info.CheckEntry(l.Kernel); err != nil {
			return nil, &Error{Path: path, Reason: fmt.Sprintf("chain[%d].kernel: %v", i, err)}
		}
	}
	if err := info.CheckManifest(path, m); err != nil {
		return nil, err
	}
	if m.Constants != "" {
		if _, err := os.Stat(filepath.Join(dir, m.Constants)); err != nil {
			var pe *fs.PathError
			if errors.As(err, &pe) {
				err = pe.Err // the file's name, not where this node keeps it
			}
			return nil, fmt.Errorf("constants: %s: %w", m.Constants, err)
		}
	}
	return info, nil
}

// FitsHostMemory refuses a host function whose worker could never stay
// within its own max_host_memory_mb: on the host device its constants and
// an instance's tmp are the worker's resident memory, so such a worker
// was killed at its first memory sample, at every load. checked: the
// worker runs in checked mode, where a run is copied through the
// instance's guarded buffers instead of run in place on the server's
// slot, so with zero_out its out_bytes are resident from the first
// request too. A worker device applies it (device.HostMemoryBound); in
// the server nothing enforces the field, and such a function runs.
func FitsHostMemory(m *abi.Manifest, constSize int64, checked bool) error {
	limit := m.MaxHostMemoryMB << 20
	if m.Target != abi.TargetHost || limit == 0 {
		return nil
	}
	need, out := constSize+m.TmpBytes, ""
	if checked && m.ZeroesOut() {
		need += m.OutBytes
		out = fmt.Sprintf(", and its out_bytes %d, zeroed there at every request in checked mode (serve --checked)", m.OutBytes)
	}
	if need <= limit {
		return nil
	}
	return &abi.FieldError{Field: "max_host_memory_mb", Reason: fmt.Sprintf("%d MiB is less than the worker must hold on the host: constants %s of %d bytes and one instance's tmp_bytes %d%s", m.MaxHostMemoryMB, orNone(m.Constants), constSize, m.TmpBytes, out)}
}

func orNone(name string) string {
	if name == "" {
		return "(none)"
	}
	return name
}

// OpenBundle checks the bundle in dir (CheckBundle), then dlopens its
// library and resolves the ABI symbols and the chain's kernels, in
// abi.Kernels order. The library's constructors run here.
func OpenBundle(dir string, m *abi.Manifest, target string) (*Library, error) {
	info, err := CheckBundle(dir, m, target)
	if err != nil {
		return nil, err
	}
	return open(filepath.Join(dir, m.Library), info, target, abi.Kernels(m.Chain))
}
