// Package abi holds Plover's bundle contract: the C headers users compile
// against (plover.h, plover_kernel.h), the Go types of the manifest that
// names a bundle's library, constants, buffer sizes and kernel chain, and
// the targets a bundle is built for (target.go), each registered with its
// compiler line and build check.
package abi

import (
	"embed"
	"fmt"
)

// The ABI this runtime speaks: bundles of the same major and any minor up to
// Minor load, and so do ABI 1 bundles (see Accept). Major and Minor must
// equal PLOVER_ABI_MAJOR and PLOVER_ABI_MINOR in plover.h.
const (
	Major   = 2
	Minor   = 2
	Version = Major<<16 | Minor // plover_abi_version of a bundle built today
)

// Headers are the C headers a function author builds against, embedded so
// `plover init` needs nothing but the plover binary.
//
//go:embed plover.h plover_kernel.h
var Headers embed.FS

// HeaderFiles lists Headers' files.
var HeaderFiles = []string{"plover.h", "plover_kernel.h"}

// ABIVersion is a bundle's plover_abi_version, decoded. ABI 1 bundles export
// the plain integer 1, which reads as 1.0; from ABI 2 on the value is
// (major << 16) | minor.
type ABIVersion struct{ Major, Minor uint32 }

// DecodeVersion decodes a plover_abi_version value. Only ABI 1's plain 1 is
// special: a plain 2 reads as 0.2, and is refused.
func DecodeVersion(v uint32) ABIVersion {
	if v == 1 {
		return ABIVersion{Major: 1}
	}
	return ABIVersion{Major: v >> 16, Minor: v & 0xffff}
}

func (v ABIVersion) String() string { return fmt.Sprintf("%d.%d", v.Major, v.Minor) }

// Accept says whether this runtime loads a bundle built for v, and if not,
// why, naming both versions.
func Accept(v ABIVersion) error {
	switch {
	case v.Major == 1 && v.Minor == 0:
		return nil
	case v.Major == Major && v.Minor <= Minor:
		return nil
	case v.Major == Major:
		return fmt.Errorf("built for ABI %s, newer than this runtime's ABI %d.%d: upgrade plover or rebuild against this plover's headers", v, Major, Minor)
	}
	return fmt.Errorf("built for ABI %s; this runtime speaks ABI %d.%d (and loads ABI 1.0 bundles)", v, Major, Minor)
}

// The targets this package registers (target_host.go, target_cuda.go);
// a new device kind's file may register another (RegisterTarget).
const (
	TargetHost = "host"
	TargetCUDA = "cuda"
)

// Symbols bundles export through PLOVER_BUNDLE, and optional hooks.
const (
	SymABIVersion = "plover_abi_version"
	SymTarget     = "plover_target"
	SymLastError  = "plover_last_error"
	// ABI 2 hooks, each optional: void fn(plover_state_t *s).
	SymLoad         = "plover_load"
	SymInstanceInit = "plover_instance_init"
	SymInstanceFini = "plover_instance_fini"
	SymUnload       = "plover_unload"
	// PLOVER_BUNDLE's error slot, which plover_fail and plover_reject set.
	SymSetError  = "plover_set_error_"
	SymSetReject = "plover_set_reject_"
)

// Hooks are the ABI 2 lifecycle hooks, the functions plover.h declares for
// a bundle to define.
var Hooks = []string{SymLoad, SymUnload, SymInstanceInit, SymInstanceFini}

// ReservedFunctions are the functions with ReservedPrefix that the runtime
// calls in an ABI 2 bundle: PLOVER_BUNDLE's and the hooks. Another one typo
// from a hook's is one it would never call, refused at deploy.
var ReservedFunctions = append([]string{SymLastError, SymSetError, SymSetReject}, Hooks...)

// EntriesSection is the ELF section where ABI 2's PLOVER_ENTRY records each
// entry's name, NUL-terminated: the entries a chain may name.
const EntriesSection = "plover_entries"

// ReservedPrefix starts every ABI symbol; no kernel may use it.
const ReservedPrefix = "plover_"

// ManifestFile is the manifest's name inside a bundle directory and tarball.
const ManifestFile = "plover.json"
