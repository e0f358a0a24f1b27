// Package abi holds Plover's bundle contract: the C headers users compile
// against (plover.h, plover_kernel.h) and the Go types of the manifest that
// names a bundle's library, constants, buffer sizes and kernel chain.
package abi

// Version is the ABI version this runtime speaks; it must equal
// PLOVER_ABI_VERSION in plover.h.
const Version = 1

// Targets a bundle can be built for.
const (
	TargetHost = "host"
	TargetCUDA = "cuda"
)

// Symbols every bundle exports through PLOVER_BUNDLE.
const (
	SymABIVersion = "plover_abi_version"
	SymTarget     = "plover_target"
	SymLastError  = "plover_last_error"
)

// ReservedPrefix starts every ABI symbol; no kernel may use it.
const ReservedPrefix = "plover_"

// ManifestFile is the manifest's name inside a bundle directory and tarball.
const ManifestFile = "plover.json"
