package main

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/plover-run/plover/fileutil"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/bundle"
	"github.com/plover-run/plover/device"
	"github.com/plover-run/plover/loader"
)

// directTrial is one in-process cold call of a bundle's chain through the
// Device interface, with no HTTP and no runtime: what the served numbers
// are compared with.
type directTrial struct {
	OpenMs     float64 `json:"load_kernel_ms"`    // loader.Open: ELF checks, dlopen, every chain symbol
	ConstMs    float64 `json:"load_constants_ms"` // Device.LoadConstants from the bundle's file
	InstanceMs float64 `json:"new_instance_ms"`   // Device.NewInstance: input, tmp, out buffers
	RunMs      float64 `json:"first_run_ms"`      // the first Instance.Run, wall time
	CopyInMs   float64 `json:"copyin_ms"`
	KernelsMs  float64 `json:"kernels_ms"`
	CopyOutMs  float64 `json:"copyout_ms"`
}

// directRepeat is one Run on an instance that has already run.
type directRepeat struct {
	RunMs, CopyInMs, KernelsMs, CopyOutMs float64
}

type directResult struct {
	Trials  []directTrial  `json:"trials"`
	Repeats []directRepeat `json:"-"`
	Output  []byte         `json:"-"`
}

// measureDirect times trials cold calls of the bundle in dir on dev, each
// from a fresh copy of the bundle (so dlopen loads a new image instead of
// returning the handle it has), then repeats Run on the last instance up
// to repeat times or for dur. items > 0 runs a batching bundle's chain on
// that many items (input holds them back to back).
func measureDirect(dev device.Device, dir string, input []byte, items, trials, repeat int, dur time.Duration) (*directResult, error) {
	if trials > 1 {
		if err := fitForCopies(dir); err != nil {
			return nil, err
		}
	}
	res := &directResult{}
	for t := 0; t < trials; t++ {
		last := t == trials-1
		if err := directOnce(dev, dir, input, items, res, last, repeat, dur); err != nil {
			return nil, err
		}
	}
	return res, nil
}

// fitForCopies refuses a bundle whose library defines GNU unique symbols
// of its own: the loader opens no second copy of such a library in a
// process (its statics would be the first copy's), so every trial after
// the first would fail.
func fitForCopies(dir string) error {
	m, err := bundle.ReadManifest(dir)
	if err != nil {
		return err
	}
	info, err := loader.Inspect(filepath.Join(dir, m.Library))
	if err != nil {
		return err
	}
	if own := info.OwnUnique(); len(own) > 0 {
		return fmt.Errorf("%s defines GNU unique symbols (%s): direct trials open a fresh copy of it each time, which one process cannot; give --trials 1, build it with -fno-gnu-unique, or bench it through a server", m.Library, strings.Join(own[:min(len(own), 3)], " "))
	}
	return nil
}

// rawDevice is an in-process device below the Program seam: the direct
// figures time dlopen, constants and instance creation apart.
type rawDevice interface {
	device.Device
	LoadConstants(r io.Reader, size int64) (device.Constants, error)
	NewInstance(cfg device.InstanceConfig) (device.Instance, error)
}

func directOnce(cdev device.Device, dir string, input []byte, items int, res *directResult, last bool, repeat int, dur time.Duration) error {
	tmp, err := os.MkdirTemp("", "plover-bench-direct-*")
	if err != nil {
		return err
	}
	defer removeAll(tmp)
	if err := copyDir(dir, tmp); err != nil {
		return err
	}
	m, err := bundle.ReadManifest(tmp)
	if err != nil {
		return err
	}
	var tr directTrial
	dev, ok := cdev.(rawDevice)
	if !ok {
		return fmt.Errorf("direct calls need an in-process device, not %T", cdev)
	}

	t0 := time.Now()
	lib, err := loader.Open(filepath.Join(tmp, m.Library), dev.Target(), abi.Kernels(m.Chain))
	if err != nil {
		return err
	}
	if lib.Load != nil {
		lib.Close()
		return fmt.Errorf("%s defines plover_load: direct trials time the load stages one by one and do not run it; bench it through a server", m.Library)
	}
	ents := device.NewEntries(lib)
	steps := make([]device.Step, len(m.Chain))
	for i, l := range m.Chain {
		e, err := ents.Resolve(l.Kernel)
		if err != nil {
			lib.Close()
			return err
		}
		steps[i] = device.Step{Entry: e, Grid: int32(l.Grid), Block: int32(l.Block)}
	}
	tr.OpenMs = msSince(t0)
	defer lib.Close()

	var consts device.Constants
	if m.Constants != "" {
		t0 = time.Now()
		f, err := os.Open(filepath.Join(tmp, m.Constants))
		if err != nil {
			return err
		}
		fi, err := f.Stat()
		if err == nil {
			consts, err = dev.LoadConstants(f, fi.Size())
		}
		f.Close()
		if err != nil {
			return fmt.Errorf("constants: %w", err)
		}
		tr.ConstMs = msSince(t0)
		defer consts.Free()
	}

	t0 = time.Now()
	inst, err := dev.NewInstance(device.InstanceConfig{MaxInput: m.MaxInputBytes, Tmp: m.TmpBytes, Out: m.OutBytes,
		Constants: consts, Entries: ents, Priority: m.Priority})
	if err != nil {
		return fmt.Errorf("instance: %w", err)
	}
	tr.InstanceMs = msSince(t0)
	defer inst.Close()

	out := make([]byte, m.OutBytes)
	r := &device.Run{Input: input, Output: out, Chain: steps, TmpLen: m.TmpBytes, ZeroTmp: m.ZeroTmp, ZeroOut: m.ZeroesOut(), ChainKey: 1}
	if items > 0 {
		if m.Batch == nil {
			return fmt.Errorf("%s does not batch", dir)
		}
		r.Output, r.Items = out[:int64(items)*m.Batch.ItemOutputBytes], uint32(items)
	}
	t0 = time.Now()
	if err := inst.Run(r); err != nil {
		return fmt.Errorf("run: %w", err)
	}
	tr.RunMs = msSince(t0)
	tr.CopyInMs, tr.KernelsMs, tr.CopyOutMs = ms(r.Timing.CopyIn), ms(r.Timing.Kernels), ms(r.Timing.CopyOut)
	res.Trials = append(res.Trials, tr)
	if !last {
		return nil
	}
	res.Output = bytes.Clone(out[:r.OutLen])
	end := time.Now().Add(dur)
	for i := 0; i < repeat && time.Now().Before(end); i++ {
		t0 = time.Now()
		if err := inst.Run(r); err != nil {
			return fmt.Errorf("run: %w", err)
		}
		res.Repeats = append(res.Repeats, directRepeat{RunMs: msSince(t0), CopyInMs: ms(r.Timing.CopyIn),
			KernelsMs: ms(r.Timing.Kernels), CopyOutMs: ms(r.Timing.CopyOut)})
	}
	return nil
}

func copyDir(src, dst string) error {
	des, err := os.ReadDir(src)
	if err != nil {
		return err
	}
	for _, de := range des {
		if !de.Type().IsRegular() {
			continue
		}
		to := filepath.Join(dst, de.Name())
		os.Remove(to) // a bundle made again under its name (fileutil.Copy makes new files only)
		if err := fileutil.Copy(filepath.Join(src, de.Name()), to); err != nil {
			return err
		}
	}
	return nil
}

func ms(d time.Duration) float64 { return float64(d) / 1e6 }

func msSince(t time.Time) float64 { return ms(time.Since(t)) }
