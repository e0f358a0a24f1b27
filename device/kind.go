package device

import (
	"fmt"
	"log/slog"
	"strconv"
	"strings"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/named"
)

// Kind is a kind of device Plover runs bundles on, as it registers itself
// (host.go, gpu.go; database/sql's drivers are the model): its target, how
// its devices open, and the traits the rest of Plover asks about instead
// of switching on target names. Adding a kind is a file here whose init
// registers its target (abi.RegisterTarget: the compiler line plover build
// runs, the manifest's build check) unless package abi has it, then the
// kind.
type Kind struct {
	// Target is the manifest "target" (abi.Target*) its devices run, and
	// Name the kind as people write it ("CUDA").
	Target, Name string
	// Open opens every device of the kind on this node, or says why there
	// is none; limit is each one's memory budget in bytes (0: all of it).
	// driver is where its driver library is ("": the default).
	Open func(driver string, limit int64, log *slog.Logger) ([]Device, error)
	// OpenBare, when set, opens the devices as Open does for a process
	// that runs nothing on them itself and must hold nothing on them that
	// another process's fault could reach (a CUDA server whose functions
	// run in MPS worker processes: no context). nil: Open.
	OpenBare func(driver string, limit int64, log *slog.Logger) ([]Device, error)
	// OpenOne opens device ordinal and no other: a worker process serves
	// one device and must not hold contexts on the rest.
	OpenOne func(ordinal int, limit int64, driver string, log *slog.Logger) (Device, error)
	// Fallback marks the kind "auto" falls back to when no other kind has
	// a device (the host); "auto" tries the others first, in name order.
	Fallback bool
	// Runs is how many runs one device takes at once by default, and
	// Reserve how many of runs are kept for light functions (sched).
	Runs    func() int
	Reserve func(runs int) int
	// SharedRuns is how many runs floods may have on one device together
	// while two or more functions want it (sched.Config.SharedRuns), where
	// its runs share cores and the OS would split them; nil: Runs.
	SharedRuns func() int
	// SharedTime, when not 0, says a run's measured device time
	// (Timing.Busy) is a span in which other runs' work can fall, and how
	// many runs the device serves at full speed at once: runs in flight
	// together split its time for charging (sched.Config.Capacity). 0: the
	// measure is the run's own (the host's CPU time: in a worker, its share
	// of the worker's), which may pass its wall time on several threads.
	SharedTime float64
	// PinsHost: its devices pin (page-lock) the host memory requests are
	// copied between, whole (HostRegistrar), so a node bounds it.
	PinsHost bool
	// PadBatches: a batch's input is padded to the function's full batch,
	// so that a recorded graph replays (its launches are keyed by shape).
	PadBatches bool
	// MPS: the kind's workers can take CUDA MPS limits.
	MPS bool
	// StandbyFloor and StandbyCeiling bound the standby workers a node
	// keeps by default (each holds a context on a GPU; on the host about
	// 2 MiB).
	StandbyFloor, StandbyCeiling int
}

var kinds = named.New[Kind]("device kind")

// Register adds a device kind. A kind with no Open, one whose target
// package abi does not know (abi.RegisterTarget: a kind's file registers
// a new target before its kind), or a second kind of the same target, is
// a programming error (it panics).
func Register(k Kind) {
	if _, ok := abi.TargetOf(k.Target); !ok || k.Open == nil || k.OpenOne == nil {
		panic("device: Register of kind " + strconv.Quote(k.Target) + ": incomplete, or its target is not registered in package abi")
	}
	kinds.Register(k.Target, k)
}

// KindOf is the registered kind of target, if any.
func KindOf(target string) (Kind, bool) { return kinds.Get(target) }

// Kinds are the registered kinds' targets, sorted.
func Kinds() []string { return kinds.Names() }

// traits is target's kind, or a kind with no traits for a target no kind
// registered (a test's fake device).
func traits(target string) Kind {
	k, _ := KindOf(target)
	return k
}

// DefaultRuns is how many runs a device of target takes at once by
// default (4 for a kind that does not say).
func DefaultRuns(target string) int {
	if k := traits(target); k.Runs != nil {
		return k.Runs()
	}
	return 4
}

// ReservedRuns is how many of runs a device of target keeps for light
// functions by default (1 for a kind that does not say).
func ReservedRuns(target string, runs int) int {
	if k := traits(target); k.Reserve != nil {
		return k.Reserve(runs)
	}
	return 1
}

// DefaultSharedRuns is the kind's SharedRuns (0, all runs, for a kind
// that does not say).
func DefaultSharedRuns(target string) int {
	if k := traits(target); k.SharedRuns != nil {
		return k.SharedRuns()
	}
	return 0
}

// SharedTime reports the kind's SharedTime (0 for a kind that does not say).
func SharedTime(target string) float64 { return traits(target).SharedTime }

// PinsHost reports the kind's PinsHost.
func PinsHost(target string) bool { return traits(target).PinsHost }

// PadsBatches reports the kind's PadBatches.
func PadsBatches(target string) bool { return traits(target).PadBatches }

// TakesMPS reports the kind's MPS.
func TakesMPS(target string) bool { return traits(target).MPS }

// Standby is the kind's StandbyFloor and StandbyCeiling (1 and 4 for a
// kind that does not say).
func Standby(target string) (floor, ceiling int) {
	k := traits(target)
	if k.StandbyCeiling == 0 {
		return 1, 4
	}
	return k.StandbyFloor, k.StandbyCeiling
}

// openKinds is Open's kind argument: one kind, or "auto": the first kind
// other than the fallback with a device, else the fallback's, with a log
// line saying why. bare: OpenBare's.
func openKinds(kind, driver string, limit int64, bare bool, log *slog.Logger) ([]Device, error) {
	open := func(k Kind) ([]Device, error) {
		if bare && k.OpenBare != nil {
			return k.OpenBare(driver, limit, log)
		}
		return k.Open(driver, limit, log)
	}
	if kind != KindAuto && kind != "" {
		k, ok := KindOf(kind)
		if !ok {
			return nil, fmt.Errorf("device kind %q: want %s", kind, strings.Join(append([]string{KindAuto}, Kinds()...), ", "))
		}
		devs, err := open(k)
		if err != nil {
			return nil, fmt.Errorf("device %s: %w", kind, err)
		}
		return devs, nil
	}
	var why, names []string
	var fallback *Kind
	for _, t := range Kinds() {
		k, _ := KindOf(t)
		if k.Fallback {
			fallback = &k
			continue
		}
		devs, err := open(k)
		if err == nil && len(devs) > 0 {
			return devs, nil
		}
		if err == nil {
			err = fmt.Errorf("no devices")
		}
		why, names = append(why, err.Error()), append(names, k.Name)
	}
	if fallback == nil {
		return nil, fmt.Errorf("no device: %s", strings.Join(why, "; "))
	}
	devs, err := open(*fallback)
	if err != nil {
		return nil, err
	}
	if len(why) > 0 && len(devs) > 0 {
		log.Info("no usable "+strings.Join(names, " or ")+" device, running kernels on the "+fallback.Target+" device",
			"reason", strings.Join(why, "; "), "device", devs[0].Name())
	}
	return devs, nil
}
