package abi

import (
	"cmp"
	"slices"
	"strconv"
	"strings"

	"github.com/plover-run/plover/named"
)

// Target is what a bundle can be built for, as it registers itself
// (target_host.go, target_cuda.go): what plover build runs to compile for
// it and what the manifest check asks of a build section for it. A device
// kind (package device) names the target its devices run; a new kind's file
// registers its target here too (RegisterTarget) when this package does not
// already, so that the kind is that one file.
type Target struct {
	// Name is the manifest's "target" and PLOVER_BUNDLE's argument.
	Name string
	// Flags are the compiler's fixed flags, the first Command passes;
	// plover init's Makefile and docs/author-loop.md spell the same lines.
	Flags []string
	// Command is plover build's command line for b's sources, run in the
	// function directory and writing the library to out: it finds the
	// compiler, or says how to install one, and refuses what the compiler
	// found cannot build. deps, unless "", is where the compiler should
	// also write the files it read, as a make rule (-MMD -MF deps): a
	// header the function includes is part of it, and plover run and
	// deploy rebuild when one changed. A target whose compiler cannot
	// write it for b leaves it out (see depFlags), and a build without it
	// is checked against the files of the source directory instead.
	Command func(b *Build, out, deps string) ([]string, error)
	// CheckBuild checks the build section's fields only this target's
	// compiler reads (nil: none). Every manifest's build section passes
	// every target's: plover build --target all builds each target from
	// the one source directory.
	CheckBuild func(b *Build) error
	// Unloads: a library built for the target is dlclosed when its
	// function unloads. Without it the library stays mapped (CUDA: its
	// static cudart registered fatbins with the driver, and unregistering
	// them at dlclose is a documented source of crashes).
	Unloads bool
}

var registered = named.New[Target]("target")

// RegisterTarget adds a target; one with no name or no Command, or a
// second of the same name, is a programming error (it panics).
func RegisterTarget(t Target) {
	if t.Command == nil {
		panic("abi: RegisterTarget(" + strconv.Quote(t.Name) + "): no Command")
	}
	registered.Register(t.Name, t)
}

// TargetOf is the registered target called name, if any.
func TargetOf(name string) (Target, bool) { return registered.Get(name) }

// Targets are the registered targets' names: the host first, then the
// rest by name. It is the order plover build --target all builds them in
// (the host needs only a C++ compiler, so a missing GPU toolkit fails
// after it is built) and messages list them in.
func Targets() []string {
	names := registered.Names()
	slices.SortStableFunc(names, func(a, b string) int { return cmp.Compare(rank(a), rank(b)) })
	return names
}

func rank(target string) int {
	if target == TargetHost {
		return 0
	}
	return 1
}

func isTarget(name string) bool {
	_, ok := TargetOf(name)
	return ok
}

// checkBuildTargets runs each target's CheckBuild over b.
func checkBuildTargets(b *Build) error {
	for _, name := range Targets() {
		if t, _ := TargetOf(name); t.CheckBuild != nil {
			if err := t.CheckBuild(b); err != nil {
				return err
			}
		}
	}
	return nil
}

// orList joins choices as a sentence does: "a", "a or b", "a, b or c".
func orList(choices []string) string {
	if len(choices) < 2 {
		return strings.Join(choices, "")
	}
	return strings.Join(choices[:len(choices)-1], ", ") + " or " + choices[len(choices)-1]
}

func quoted(s []string) []string {
	q := make([]string, len(s))
	for i, v := range s {
		q[i] = strconv.Quote(v)
	}
	return q
}

// IncludeDirs is the build's include directories: build.include, or
// include/ when it names none.
func (b *Build) IncludeDirs() []string {
	if len(b.Include) == 0 {
		return []string{"include"}
	}
	return b.Include
}

// depFlags make g++ and nvcc (CUDA 10.2 and later) write deps, the
// non-system headers they read, while they compile. One -MF file is
// written again by each source's compilation, so for several sources it
// would hold the last one's alone: none is asked for then. phony adds
// -MP, an empty rule per header: plover init's Makefile includes the
// file under the same name, and without those rules a header deleted
// since (its #include gone too) stops make with "No rule to make target".
func depFlags(b *Build, deps string, phony bool) []string {
	if deps == "" || len(b.Sources) != 1 {
		return nil
	}
	if phony {
		return []string{"-MMD", "-MP", "-MF", deps}
	}
	return []string{"-MMD", "-MF", deps}
}

// includeFlags are b's include directories as -I flags.
func includeFlags(b *Build) []string {
	inc := b.IncludeDirs()
	flags := make([]string, len(inc))
	for i, d := range inc {
		flags[i] = "-I" + d
	}
	return flags
}
