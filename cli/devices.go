package cli

import (
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"text/tabwriter"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/device"
)

// openDevices opens the server's devices; bare (under MPS, functions in
// worker processes), as device.OpenBare does: no CUDA context in the
// server.
func openDevices(kind string, limit int64, bare bool, log *slog.Logger) ([]device.Device, error) {
	open := device.Open
	if bare {
		open = device.OpenBare
	}
	devs, err := open(kind, limit, log)
	if err != nil {
		return nil, fmt.Errorf("--device %s: %w", kind, err)
	}
	return devs, nil
}

// The --copy-piece bounds: the largest whose bytes fit an int64, and the
// smallest a run may be cut into (each piece is a driver call).
const (
	minCopyPieceKiB = 64
	maxCopyPieceKiB = math.MaxInt64 >> 10
)

// setCopyPiece gives the devices that copy in pieces (CUDA) --copy-piece,
// before any instance is made: with --isolation none they run the
// functions themselves (worker processes get it as a flag: isolate). A
// server without such a device says the flag does nothing.
func setCopyPiece(devs []device.Device, kib int, log *slog.Logger) {
	if kib <= 0 {
		return
	}
	set := false
	for _, d := range devs {
		if p, ok := d.(device.CopyPiecer); ok {
			p.SetCopyPiece(int64(kib) << 10)
			set = true
		}
	}
	if !set {
		log.Warn("--copy-piece applies to CUDA devices only; ignored")
	}
}

// withHost adds the host device to GPUs (unless off), so that one server
// runs host bundles (a pipeline's pre- and post-processing) beside cuda
// ones; each bundle runs on the device its manifest's target names.
func withHost(devs []device.Device, on bool, limit int64, log *slog.Logger) []device.Device {
	if !on || slices.ContainsFunc(devs, func(d device.Device) bool { return d.Target() == abi.TargetHost }) {
		return devs
	}
	h := device.NewHost(limit)
	log.Info("the host device runs host-target bundles beside the GPUs (--host-device=false: GPUs only)", "device", h.Name())
	return append(devs, h)
}

func devicesCmd() *command {
	var asJSON bool
	return &command{
		nargs: 0,
		name:  "devices", summary: "list NVIDIA GPUs (index, name, UUID, memory, utilization, MIG, driver)",
		example: "  plover devices",
		flags: func(fs *flag.FlagSet) {
			fs.BoolVar(&asJSON, "json", false, `print {"gpus": [...]} instead (empty without a driver)`)
		},
		run: func(fs *flag.FlagSet, args []string, env *Env) error {
			gpus, err := device.ListGPUs()
			if asJSON && (err == nil || errors.Is(err, device.ErrNoDriver)) {
				if gpus == nil {
					gpus = []device.GPUInfo{}
				}
				return printJSON(env.Stdout, map[string]any{"gpus": gpus})
			}
			if errors.Is(err, device.ErrNoDriver) {
				fmt.Fprintf(env.Stdout, "%v\nplover serve --device auto will use the host device.\n", err)
				return nil
			}
			if err != nil {
				return err
			}
			tw := tabwriter.NewWriter(env.Stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "INDEX\tNAME\tUUID\tMEMORY FREE/TOTAL\tUTIL\tMIG\tDRIVER\tCUDA")
			for _, g := range gpus {
				fmt.Fprintf(tw, "%d\t%s\t%s\t%s / %s\t%d%%\t%s\t%s\t%s\n", g.Index, g.Name, g.UUID,
					humanBytes(g.MemoryFree), humanBytes(g.MemoryTotal), g.UtilizationPct, g.MIGMode, g.DriverVersion, g.CUDADriverVersion)
			}
			return tw.Flush()
		},
	}
}
