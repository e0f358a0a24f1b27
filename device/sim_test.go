package device_test

// The host target's kernel simulator (abi/plover_kernel.h): testdata/sim.cu
// built with g++, loaded on the host device, every result checked against a
// plain Go reference. The kernels' threads cooperate through __shared__
// memory, barriers and atomics, so a simulator that ran threads one after
// another to completion would fail them.

import (
	"bytes"
	"context"
	"debug/elf"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/device"
	"github.com/plover-run/plover/internal/testkit"
	"github.com/plover-run/plover/loader"
)

const (
	simMaxInput = 4 << 20
	simMaxOut   = 16 << 20
)

// buildSim compiles testdata/sim.cu (and extra sources) for the host target
// the way the Makefile builds bundles, plus -Werror: the header must compile
// cleanly. flags go before the sources.
func buildSim(t testing.TB, dir string, flags []string, extra ...string) string {
	t.Helper()
	args := append(append([]string{"-std=c++17", "-Wall", "-Wextra", "-Werror"}, flags...), extra...)
	return testkit.BuildLib(t, filepath.Join("testdata", "sim.cu"), dir, "sim.so", args...)
}

type simEnv struct {
	prog device.Program
}

// loadSim loads a built sim.so on a host device, as the runtime would.
func loadSim(t testing.TB, so string) *simEnv { return loadSimOn(t, so, device.NewHost(0)) }

// loadSimOn loads a built sim.so on h.
func loadSimOn(t testing.TB, so string, h *device.Host) *simEnv {
	t.Helper()
	m := &abi.Manifest{
		Name: "sim", ABI: abi.Major, Target: abi.TargetHost, Library: filepath.Base(so),
		MaxInputBytes: simMaxInput, OutBytes: simMaxOut,
		Chain: []abi.Launch{{Kernel: "sim_reduce", Grid: 1, Block: 1}},
	}
	prog, err := h.Load(context.Background(), device.ProgramSpec{Dir: filepath.Dir(so), Manifest: m})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { prog.Close() })
	return &simEnv{prog: prog}
}

func (e *simEnv) instance(t testing.TB) device.Instance {
	t.Helper()
	inst, err := e.prog.NewInstance(device.InstanceConfig{MaxInput: simMaxInput, Out: simMaxOut})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(inst.Close)
	return inst
}

// run runs one entry as a one-step chain and returns outLen bytes of out.
func (e *simEnv) run(inst device.Instance, kernel string, grid, block int32, in []byte, outLen int) ([]byte, error) {
	idx, err := e.prog.Entry(kernel)
	if err != nil {
		return nil, err
	}
	out := make([]byte, outLen)
	r := &device.Run{Input: in, Output: out, Chain: []device.Step{{Entry: idx, Grid: grid, Block: block}}, ZeroOut: true}
	err = inst.Run(r)
	return out, err
}

// ---- Go references and encodings ----------------------------------------

func u32s(b []byte) []uint32 {
	v := make([]uint32, len(b)/4)
	for i := range v {
		v[i] = binary.LittleEndian.Uint32(b[4*i:])
	}
	return v
}

func u32bytes(v []uint32) []byte {
	b := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(b[4*i:], x)
	}
	return b
}

func f32bytes(v []float32) []byte {
	b := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(x))
	}
	return b
}

// sameWords compares out with want word by word, naming the first
// difference.
func sameWords(got []byte, want []uint32) error {
	g := u32s(got)
	for i := range want {
		if g[i] != want[i] {
			return fmt.Errorf("word %d of %d: got %#x, want %#x", i, len(want), g[i], want[i])
		}
	}
	return nil
}

func randU32(rng *rand.Rand, n int) []uint32 {
	v := make([]uint32, n)
	for i := range v {
		v[i] = rng.Uint32()
	}
	return v
}

// reduceRef: out[0] the total, out[1+b] block b's grid-stride sum.
func reduceRef(in []uint32, grid, block int) []uint32 {
	out := make([]uint32, grid+1)
	for i, x := range in {
		out[1+(i/block)%grid] += x
	}
	for _, p := range out[1:] {
		out[0] += p
	}
	return out
}

// votesRef: what __syncthreads_count/_and/_or return to every thread.
func votesRef(in []uint32, grid, block int) []uint32 {
	out := make([]uint32, grid*block)
	for b := 0; b < grid; b++ {
		c := uint32(0)
		for t := 0; t < block; t++ {
			if i := b*block + t; i < len(in) && in[i]&1 == 1 {
				c++
			}
		}
		v := c
		if c == uint32(block) {
			v |= 1 << 12
		}
		if c > 0 {
			v |= 1 << 13
		}
		for t := 0; t < block; t++ {
			out[b*block+t] = v
		}
	}
	return out
}

// matmulRef: C = A·B in float32, accumulating in k order like the kernel.
func matmulRef(a, b []float32, m, k, n int) []uint32 {
	c := make([]uint32, m*n)
	for i := 0; i < m; i++ {
		for j := 0; j < n; j++ {
			var acc float32
			for l := 0; l < k; l++ {
				acc = float32(acc + float32(a[i*k+l]*b[l*n+j]))
			}
			c[i*n+j] = math.Float32bits(acc)
		}
	}
	return c
}

// Word offsets of sim_atomics' out (sim.cu's AT_*).
const (
	atHist, atClaim, atCount, atIMax, atIMin, atUMax, atFMax, atFSum = 0, 256, 512, 513, 514, 515, 516, 517
	atDSum, atUSum, atHead, atDown, atWrap, atXor, atOr, atAnd       = 518, 520, 522, 523, 524, 525, 526, 527
	atWinners, atSlots                                               = 528, 532
)

// checkAtomics checks what sim_atomics computed from in: the order the
// threads ran in may differ (on a GPU it does), so the checks are of
// order-free properties, including of every returned old value.
func checkAtomics(in []byte, out []byte) error {
	w := u32s(out)
	n := len(in)
	var hist [256]uint32
	var bits, notAnd, xor uint32
	imax, imin, umax := int32(math.MinInt32), int32(math.MaxInt32), uint32(0)
	fmax := float32(math.Inf(-1))
	var fsum float32
	var dsum float64
	var usum uint64
	for i, c := range in {
		v := uint32(c)
		hist[v]++
		imax, imin = max(imax, int32(v)-128), min(imin, int32(v)-128)
		umax = max(umax, v*100000+uint32(i))
		fmax = max(fmax, float32(v)*0.5-17.25)
		fsum += float32(v)
		dsum += float64(v) * 0.25
		usum += uint64(v) << 33
		xor ^= v * 0x01010101
		bits |= 1 << (v % 32)
		notAnd |= 1 << (v % 31)
	}
	distinct := uint32(0)
	for v := range hist {
		if w[atHist+v] != hist[v] {
			return fmt.Errorf("histogram[%d] = %d, want %d", v, w[atHist+v], hist[v])
		}
		claim := w[atClaim+v]
		switch {
		case hist[v] == 0 && claim != 0:
			return fmt.Errorf("claim[%d] = %d, but no input byte is %d", v, claim, v)
		case hist[v] > 0 && (claim == 0 || claim > uint32(n) || in[claim-1] != byte(v)):
			return fmt.Errorf("claim[%d] = %d: not the index+1 of a byte %d", v, claim, v)
		}
		if hist[v] > 0 {
			distinct++
		}
	}
	scalars := []struct {
		name      string
		got, want uint32
	}{
		{"ticket counter", w[atCount], uint32(n)},
		{"atomicCAS winners", w[atWinners], distinct},
		{"atomicMax(int)", w[atIMax], uint32(imax)},
		{"atomicMin(int)", w[atIMin], uint32(imin)},
		{"atomicMax(unsigned)", w[atUMax], umax},
		{"atomicCAS float max", w[atFMax], math.Float32bits(fmax)},
		{"atomicAdd(float)", w[atFSum], math.Float32bits(fsum)},
		{"atomicAdd(double) low", w[atDSum], uint32(math.Float64bits(dsum))},
		{"atomicAdd(double) high", w[atDSum+1], uint32(math.Float64bits(dsum) >> 32)},
		{"atomicAdd(ull) low", w[atUSum], uint32(usum)},
		{"atomicAdd(ull) high", w[atUSum+1], uint32(usum >> 32)},
		{"atomicSub(int)", w[atDown], uint32(-int32(hist2sum(hist)))},
		{"atomicInc(9)", w[atWrap], uint32(n % 10)},
		{"atomicXor", w[atXor], xor},
		{"atomicOr", w[atOr], bits},
		{"atomicAnd", w[atAnd], ^notAnd},
	}
	for _, s := range scalars {
		if s.got != s.want {
			return fmt.Errorf("%s = %#x, want %#x", s.name, s.got, s.want)
		}
	}
	// atomicAdd's tickets: every index exactly once.
	slots := w[atSlots : atSlots+n]
	seen := make([]bool, n)
	for t, i := range slots {
		if i >= uint32(n) || seen[i] {
			return fmt.Errorf("ticket %d holds index %d: tickets are not a permutation", t, i)
		}
		seen[i] = true
	}
	// atomicExch's returns chain every index from head down to 0.
	next := w[atSlots+n : atSlots+2*n]
	clear(seen)
	steps := 0
	for p := w[atHead]; p != 0; p = next[p-1] {
		if p > uint32(n) || seen[p-1] || steps > n {
			return fmt.Errorf("atomicExch list breaks at %d after %d steps", p, steps)
		}
		seen[p-1] = true
		steps++
	}
	if steps != n {
		return fmt.Errorf("atomicExch list has %d of %d elements", steps, n)
	}
	return nil
}

func hist2sum(h [256]uint32) uint32 {
	s := uint32(0)
	for v, c := range h {
		s += uint32(v) * c
	}
	return s
}

// dynRef: sums (float64 per block) then each block's chunk reversed.
func dynRef(in []int32, block int) []byte {
	n := len(in)
	nb := (n + block - 1) / block
	out := make([]byte, 8*nb+4*n)
	for b := 0; b < nb; b++ {
		sum := 0.0
		chunk := min(block, n-b*block)
		for t := 0; t < chunk; t++ {
			sum += float64(in[b*block+t]) * 0.5
			binary.LittleEndian.PutUint32(out[8*nb+4*(b*block+t):], uint32(in[b*block+chunk-1-t]))
		}
		binary.LittleEndian.PutUint64(out[8*b:], math.Float64bits(sum))
	}
	return out
}

type dim3 struct{ x, y, z int }

func (d dim3) n() int { return d.x * d.y * d.z }

// grid3dRef: the 9-word record of every thread at its linear index.
func grid3dRef(g, b dim3, sync bool) []uint32 {
	out := make([]uint32, 9*g.n()*b.n())
	for bz := 0; bz < g.z; bz++ {
		for by := 0; by < g.y; by++ {
			for bx := 0; bx < g.x; bx++ {
				blk := (bz*g.y+by)*g.x + bx
				for tz := 0; tz < b.z; tz++ {
					for ty := 0; ty < b.y; ty++ {
						for tx := 0; tx < b.x; tx++ {
							lin := (tz*b.y+ty)*b.x + tx
							r := out[9*(blk*b.n()+lin):]
							copy(r, []uint32{uint32(tx), uint32(ty), uint32(tz), uint32(bx), uint32(by), uint32(bz),
								uint32(b.x | b.y<<11 | b.z<<22), uint32(g.x | g.y<<8 | g.z<<16), 0xffffffff})
							if sync {
								r[8] = uint32(blk*1024 + b.n() - 1 - lin)
							}
						}
					}
				}
			}
		}
	}
	return out
}

// ---- The table ----------------------------------------------------------

type simCase struct {
	name        string
	kernel      string
	grid, block int32
	input       []byte
	outLen      int
	check       func(out []byte) error // nil when wantErr is set
	wantErr     string                 // a substring of the kernel error
}

func simCases() []simCase {
	rng := rand.New(rand.NewPCG(1, 2))
	var cs []simCase

	for _, c := range []struct{ n, grid, block int }{
		{0, 1, 1}, {1, 1, 1}, {1000, 1, 2}, {1000, 3, 7}, {1000, 4, 64}, {100000, 2, 1024},
		{100000, 37, 256}, {5000, 5, 1000}, {777, 1, 33},
	} {
		in := randU32(rng, c.n)
		want := reduceRef(in, c.grid, c.block)
		cs = append(cs, simCase{
			name: fmt.Sprintf("reduce n=%d <<<%d,%d>>>", c.n, c.grid, c.block), kernel: "sim_reduce",
			grid: int32(c.grid), block: int32(c.block), input: u32bytes(in), outLen: 4 * len(want),
			check: func(out []byte) error { return sameWords(out, want) },
		})
	}

	for _, c := range []struct{ n, block int }{{1, 1}, {1, 64}, {5, 64}, {64, 64}, {100, 64}, {777, 1024}, {1024, 1024}, {3, 2}} {
		in := randU32(rng, c.n)
		var sum uint32
		for _, x := range in[:min(c.n, c.block)] {
			sum += x
		}
		for _, mirror := range []int32{1, 2} {
			c := simCase{
				name: fmt.Sprintf("early exit n=%d block %d mirror %v", c.n, c.block, mirror == 2), kernel: "sim_early_exit",
				grid: mirror, block: int32(c.block), input: u32bytes(in), outLen: 4,
				check: func(out []byte) error { return sameWords(out, []uint32{sum}) },
			}
			if c.block > 1 { // threads return while others wait: reported
				c.check, c.wantErr = nil, "barrier divergence in kernel early_exit, block (0,0,0)"
			}
			cs = append(cs, c)
		}
	}

	for _, c := range []struct{ n, grid, block int }{{1000, 5, 128}, {1000, 1, 1024}, {100, 3, 33}, {10, 2, 1}, {64, 1, 64}} {
		in := randU32(rng, c.n)
		if c.n == 64 {
			for i := range in {
				in[i] |= 1 // all odd: _and is true
			}
		}
		want := votesRef(in, c.grid, c.block)
		cs = append(cs, simCase{
			name: fmt.Sprintf("votes n=%d <<<%d,%d>>>", c.n, c.grid, c.block), kernel: "sim_votes",
			grid: int32(c.grid), block: int32(c.block), input: u32bytes(in), outLen: 4 * len(want),
			check: func(out []byte) error { return sameWords(out, want) },
		})
	}

	for _, sh := range []struct{ m, k, n int }{{1, 1, 1}, {37, 50, 29}, {64, 64, 64}, {5, 100, 3}, {33, 7, 65}} {
		// Small integers: every product and sum is exact in float32, in any order.
		a, b := make([]float32, sh.m*sh.k), make([]float32, sh.k*sh.n)
		for i := range a {
			a[i] = float32(rng.IntN(17) - 8)
		}
		for i := range b {
			b[i] = float32(rng.IntN(17) - 8)
		}
		want := matmulRef(a, b, sh.m, sh.k, sh.n)
		for _, tile := range []int32{8, 16, 32} {
			cs = append(cs, simCase{
				name: fmt.Sprintf("matmul %dx%dx%d tile %d", sh.m, sh.k, sh.n, tile), kernel: "sim_matmul",
				grid: int32(sh.m | sh.k<<10 | sh.n<<20), block: tile, input: append(f32bytes(a), f32bytes(b)...),
				outLen: 4 * len(want), check: func(out []byte) error { return sameWords(out, want) },
			})
		}
	}

	for _, c := range []struct{ n, grid, block int }{{1, 1, 1}, {1000, 7, 128}, {65536, 64, 256}, {3000, 1, 1024}} {
		in := make([]byte, c.n)
		for i := range in {
			in[i] = byte(rng.IntN(200)) // some byte values never occur
		}
		cs = append(cs, simCase{
			name: fmt.Sprintf("atomics n=%d <<<%d,%d>>>", c.n, c.grid, c.block), kernel: "sim_atomics",
			grid: int32(c.grid), block: int32(c.block), input: in, outLen: 4 * (atSlots + 2*c.n),
			check: func(out []byte) error { return checkAtomics(in, out) },
		})
	}

	for _, c := range []struct{ n, block int }{{1, 1}, {1000, 32}, {1000, 100}, {4096, 1024}, {5, 64}} {
		in := make([]int32, c.n)
		for i := range in {
			in[i] = rng.Int32N(2000) - 1000
		}
		want := dynRef(in, c.block)
		cs = append(cs, simCase{
			name: fmt.Sprintf("dynamic shared n=%d block %d", c.n, c.block), kernel: "sim_dynshared",
			grid: 1, block: int32(c.block), input: u32bytes(int32sAsU32(in)), outLen: len(want),
			check: func(out []byte) error {
				if !bytes.Equal(out, want) {
					return errors.New("differs from the reference: " + firstDiff(out, want))
				}
				return nil
			},
		})
	}

	for _, c := range []struct{ g, b dim3 }{
		{dim3{1, 1, 1}, dim3{1, 1, 1}}, {dim3{3, 2, 4}, dim3{5, 3, 2}}, {dim3{2, 1, 3}, dim3{8, 8, 4}},
		{dim3{1, 5, 1}, dim3{1, 1, 64}}, {dim3{2, 2, 2}, dim3{1024, 1, 1}}, {dim3{1, 1, 1}, dim3{16, 64, 1}},
	} {
		for _, sync := range []bool{false, true} {
			want := grid3dRef(c.g, c.b, sync)
			kernel := "sim_grid3d"
			if sync {
				kernel = "sim_grid3d_sync"
			}
			cs = append(cs, simCase{
				name: fmt.Sprintf("%s grid %v block %v", kernel, c.g, c.b), kernel: kernel,
				grid: int32(c.g.x | c.g.y<<8 | c.g.z<<16), block: int32(c.b.x | c.b.y<<11 | c.b.z<<22),
				outLen: 4 * len(want), check: func(out []byte) error { return sameWords(out, want) },
			})
		}
	}

	cs = append(cs,
		simCase{name: "thread 0 skips a barrier", kernel: "sim_diverge", grid: 2, block: 64, outLen: 512,
			wantErr: "barrier divergence in kernel diverge, block (0,0,0): thread (1,0,0) reached __syncthreads() at sim.cu:"},
		simCase{name: "threads skip a conditional barrier", kernel: "sim_cond_barrier", grid: 1, block: 64, outLen: 256,
			wantErr: "barrier divergence in kernel cond_barrier, block (0,0,0): thread (32,0,0) returned while other " +
				"threads wait at __syncthreads() at " + simSite("skipped")},
		simCase{name: "threads reach another barrier", kernel: "sim_cond_barrier", grid: 2, block: 64, outLen: 256,
			wantErr: "thread (16,0,0) reached __syncthreads() at " + simSite("second") +
				" while other threads wait at the one at " + simSite("first")},
		simCase{name: "a thread reaches a barrier after others returned", kernel: "sim_early_exit", grid: 2, block: 2,
			input: u32bytes([]uint32{1, 2, 3}), outLen: 4,
			wantErr: "thread (1,0,0) reached __syncthreads() at sim.cu:"},
		simCase{name: "a conditional barrier all threads skip passes", kernel: "sim_cond_barrier", grid: 1, block: 32,
			outLen: 128, check: func(out []byte) error { return sameWords(out, slices.Repeat([]uint32{1}, 32)) }},
		simCase{name: "2048 threads per block fail", kernel: "sim_bad_launch", grid: 1, block: 1, outLen: 4,
			wantErr: "invalid launch configuration"},
		simCase{name: "64 KiB of dynamic shared memory fail", kernel: "sim_dyn_too_big", grid: 1, block: 32, outLen: 4,
			wantErr: "dynamic shared memory"},
		simCase{name: "stack depth 20 KiB", kernel: "sim_deep", grid: 20, block: 2, outLen: 4,
			check: func(out []byte) error { return sameWords(out, []uint32{deepRef(20)}) }},
	)
	return cs
}

// deepRef is what sim_deep's recursion returns for depth d.
func deepRef(d uint32) uint32 { return d*(d+1)/2 + d }

func int32sAsU32(v []int32) []uint32 {
	u := make([]uint32, len(v))
	for i, x := range v {
		u[i] = uint32(x)
	}
	return u
}

func firstDiff(got, want []byte) string {
	for i := range want {
		if got[i] != want[i] {
			return fmt.Sprintf("byte %d of %d: got %#x, want %#x", i, len(want), got[i], want[i])
		}
	}
	return "equal"
}

// TestSimKernels runs the table on both context switches, the x86-64 one
// (where this is x86-64) and the ucontext fallback, at -O3 (more inlining
// across barriers), and on a checked host device (buffers placed against
// guard pages; none of these kernels overruns). All cases share one
// instance, so every case after an error also checks that the simulator
// recovered.
func TestSimKernels(t *testing.T) {
	cases := simCases()
	for _, v := range []struct {
		name    string
		flags   []string
		checked bool
	}{{"default", nil, false}, {"ucontext", []string{"-DPLOVER_FIBER_UCONTEXT"}, false}, {"O3", []string{"-O3"}, false}, {"checked", nil, true}} {
		t.Run(v.name, func(t *testing.T) {
			h := device.NewHost(0)
			if v.checked {
				h.EnableChecks(-1)
			}
			e := loadSimOn(t, buildSim(t, t.TempDir(), v.flags), h)
			inst := e.instance(t)
			for _, c := range cases {
				t.Run(c.name, func(t *testing.T) {
					out, err := e.run(inst, c.kernel, c.grid, c.block, c.input, c.outLen)
					if c.wantErr != "" {
						var ke *device.KernelError
						if !errors.As(err, &ke) || !strings.Contains(ke.Msg, c.wantErr) {
							t.Fatalf("Run: %v, want a kernel error containing %q", err, c.wantErr)
						}
						return
					}
					if err != nil {
						t.Fatal(err)
					}
					if err := c.check(out); err != nil {
						t.Error(err)
					}
				})
			}
		})
	}
}

// simSite is the file:line of the barrier in sim.cu marked "site: mark",
// as the simulator names it.
func simSite(mark string) string {
	src, err := os.ReadFile(filepath.Join("testdata", "sim.cu"))
	if err != nil {
		panic(err)
	}
	for i, line := range strings.Split(string(src), "\n") {
		if strings.Contains(line, "/* site: "+mark+" */") {
			return fmt.Sprintf("sim.cu:%d", i+1)
		}
	}
	panic("sim.cu has no barrier marked " + mark)
}

// simEntries are sim.cu's entries.
var simEntries = []string{"sim_reduce", "sim_early_exit", "sim_votes", "sim_matmul", "sim_atomics", "sim_dynshared",
	"sim_dyn_too_big", "sim_dyn_overrun", "sim_grid3d", "sim_grid3d_sync", "sim_bad_launch", "sim_diverge", "sim_cond_barrier", "sim_deep",
	"sim_vec_nosync", "sim_vec_sync", "sim_vec_sync8", "sim_vec_serial"}

// TestSimCUDABuild compiles sim.cu with nvcc and the Makefile's NVCCFLAGS:
// the same source must build for both targets. Nothing runs it here.
func TestSimCUDABuild(t *testing.T) {
	so := testkit.BuildCUDALib(t, filepath.Join("testdata", "sim.cu"), t.TempDir(), "sim.so")
	info, err := loader.Inspect(so)
	if err != nil {
		t.Fatal(err)
	}
	if err := info.Check(so, abi.TargetCUDA, simEntries); err != nil {
		t.Error(err)
	}
	if !slices.Equal(slices.Sorted(slices.Values(info.Declared)), slices.Sorted(slices.Values(simEntries))) {
		t.Errorf("declared entries %v, want %v", info.Declared, simEntries)
	}
}

// TestSimExports: the simulator adds no exported or GNU-unique symbol to a
// bundle (a unique symbol would tie bundles together and keep them loaded).
// Two source files that both include plover_kernel.h link into one bundle,
// and both files' kernels cooperate correctly. The GPU machine's g++ linked
// the C++ runtime statically, which exported all of libsupc++ until bundle
// builds hid archive symbols (testkit.BuildLib, the Makefile): the static
// case builds that way here.
func TestSimExports(t *testing.T) {
	for _, tc := range []struct {
		name  string
		flags []string
	}{
		{"shared C++ runtime", nil},
		{"static C++ runtime", []string{"-static-libstdc++"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if len(tc.flags) > 0 && !haveStaticLibstdcxx() {
				t.Skip("no libstdc++.a for this compiler")
			}
			checkSimExports(t, tc.flags)
		})
	}
}

// haveStaticLibstdcxx: the compiler finds libstdc++.a (it prints the bare
// name back when it does not).
func haveStaticLibstdcxx() bool {
	cxx := os.Getenv("CXX")
	if cxx == "" {
		cxx = "g++"
	}
	out, err := exec.Command(cxx, "-print-file-name=libstdc++.a").Output()
	return err == nil && filepath.IsAbs(strings.TrimSpace(string(out)))
}

func checkSimExports(t *testing.T, flags []string) {
	dir := t.TempDir()
	second := filepath.Join(dir, "second.cu")
	if err := os.WriteFile(second, []byte(simSecondFile), 0o644); err != nil {
		t.Fatal(err)
	}
	so := buildSim(t, dir, flags, second)
	f, err := elf.Open(so)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	syms, err := f.DynamicSymbols()
	if err != nil {
		t.Fatal(err)
	}
	var exported []string
	for _, s := range syms {
		if s.Section == elf.SHN_UNDEF {
			continue
		}
		if elf.ST_BIND(s.Info) == elf.STB_LOOS { // STB_GNU_UNIQUE
			t.Errorf("GNU unique symbol %s", s.Name)
		}
		if !strings.HasPrefix(s.Name, "sim_") {
			exported = append(exported, s.Name)
		}
	}
	slices.Sort(exported)
	want := []string{"plover_abi_version", "plover_last_error", "plover_set_error_", "plover_set_reject_", "plover_target"}
	if !slices.Equal(exported, want) {
		t.Errorf("exported symbols other than the entries: %v, want %v", exported, want)
	}

	e := loadSim(t, so)
	inst := e.instance(t)
	in := randU32(rand.New(rand.NewPCG(3, 4)), 5000)
	for _, k := range []string{"sim_reduce", "sim_second_reduce"} {
		out, err := e.run(inst, k, 3, 128, u32bytes(in), 4*4)
		if err != nil {
			t.Fatalf("%s: %v", k, err)
		}
		if err := sameWords(out, reduceRef(in, 3, 128)); err != nil {
			t.Errorf("%s: %v", k, err)
		}
	}
}

// A second source file of the bundle: its own copy of the simulator.
const simSecondFile = `#include "plover_kernel.h"
__global__ void reduce2(const unsigned *in, size_t n, unsigned *part) {
  __shared__ unsigned sh[1024];
  unsigned t = threadIdx.x, sum = 0;
  for (size_t i = (size_t)blockIdx.x * blockDim.x + t; i < n; i += (size_t)gridDim.x * blockDim.x) sum += in[i];
  sh[t] = sum;
  __syncthreads();
  for (unsigned step = 1; step < blockDim.x; step *= 2) {
    if (t % (2 * step) == 0 && t + step < blockDim.x) sh[t] += sh[t + step];
    __syncthreads();
  }
  if (t == 0) part[blockIdx.x] = sh[0];
}
PLOVER_ENTRY(sim_second_reduce) {
  unsigned *out = (unsigned *)s->out.dat;
  PLOVER_LAUNCH(reduce2, grid, block, s, (const unsigned *)s->input.dat, s->input.len / 4, out + 1);
  PLOVER_LAUNCH(reduce2, 1, block, s, out + 1, (size_t)grid, out);
}
`

// TestSimConcurrent runs instances on several OS threads at once: the
// simulator's state (indices, shared memory, fibers) is per OS thread.
func TestSimConcurrent(t *testing.T) {
	e := loadSim(t, buildSim(t, t.TempDir(), nil))
	rng := rand.New(rand.NewPCG(5, 6))
	const m, k, n = 40, 48, 36
	a, b := make([]float32, m*k), make([]float32, k*n)
	for i := range a {
		a[i] = float32(rng.IntN(9) - 4)
	}
	for i := range b {
		b[i] = float32(rng.IntN(9) - 4)
	}
	mmIn, mmWant := append(f32bytes(a), f32bytes(b)...), matmulRef(a, b, m, k, n)
	redIn := randU32(rng, 20000)
	redWant := reduceRef(redIn, 9, 256)

	const workers, rounds = 4, 30
	insts := make([]device.Instance, workers)
	for i := range insts {
		insts[i] = e.instance(t)
	}
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for r := range rounds {
				out, err := e.run(insts[w], "sim_matmul", m|k<<10|n<<20, int32(8<<(r%3)), mmIn, 4*m*n)
				if err == nil {
					err = sameWords(out, mmWant)
				}
				if err == nil {
					out, err = e.run(insts[w], "sim_reduce", 9, 256, u32bytes(redIn), 4*len(redWant))
					if err == nil {
						err = sameWords(out, redWant)
					}
				}
				if err != nil {
					errs <- fmt.Errorf("worker %d round %d: %w", w, r, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// TestSimStackGuard: a fiber that overflows its stack hits the guard page
// and the process dies of SIGSEGV (it must not run on into another fiber's
// stack); PLOVER_FIBER_STACK_BYTES gives a kernel more.
func TestSimStackGuard(t *testing.T) {
	if so := os.Getenv("PLOVER_SIM_OVERFLOW_SO"); so != "" {
		// The child: 200 levels of 1 KiB on a 64 KiB stack.
		e := loadSim(t, so)
		out, err := e.run(e.instance(t), "sim_deep", 200, 2, nil, 4)
		t.Fatalf("sim_deep returned (%v, %x) instead of faulting", err, out)
	}
	if testing.Short() {
		t.Skip("runs a child process")
	}
	big := loadSim(t, buildSim(t, t.TempDir(), []string{"-DPLOVER_FIBER_STACK_BYTES=1048576"}))
	out, err := big.run(big.instance(t), "sim_deep", 200, 2, nil, 4)
	if err != nil {
		t.Fatal(err)
	}
	if err := sameWords(out, []uint32{deepRef(200)}); err != nil {
		t.Errorf("1 MiB stacks: %v", err)
	}

	// Without a guard the fiber runs on into whatever lies below its stack
	// (SEGV_MAPERR, sigcode=1, where nothing is mapped).
	faultsOnAGuard(t, "TestSimStackGuard", "PLOVER_SIM_OVERFLOW_SO", "the overflowing child")
}

// TestSimKernelThrow: an exception out of a kernel ends the process
// (std::terminate), from any thread of a block: CUDA device code cannot
// throw, and a fiber's throw always ended it. From thread 0, or a block
// without barriers, it left the launch past the simulator's reset, so an
// entry that caught it wedged the simulator on that OS thread: every later
// launch there failed "kernel launched from inside a kernel".
func TestSimKernelThrow(t *testing.T) {
	if so := os.Getenv("PLOVER_SIM_THROW_SO"); so != "" {
		m := &abi.Manifest{Name: "throw", ABI: abi.Major, Target: abi.TargetHost, Library: filepath.Base(so),
			OutBytes: 64, Chain: []abi.Launch{{Kernel: "throw_caught", Grid: 1, Block: 1}}}
		prog, err := device.NewHost(0).Load(context.Background(), device.ProgramSpec{Dir: filepath.Dir(so), Manifest: m})
		if err != nil {
			t.Fatal(err)
		}
		inst, err := prog.NewInstance(device.InstanceConfig{Out: 64})
		if err != nil {
			t.Fatal(err)
		}
		idx, err := prog.Entry("throw_caught")
		if err != nil {
			t.Fatal(err)
		}
		out := make([]byte, 64)
		err = inst.Run(&device.Run{Output: out, Chain: []device.Step{{Entry: idx}}, ZeroOut: true})
		t.Fatalf("throw_caught returned (%v, %x) instead of ending the process", err, out[:8])
	}
	if testing.Short() {
		t.Skip("runs a child process")
	}
	dir := t.TempDir()
	src := filepath.Join(dir, "throw.cu")
	if err := os.WriteFile(src, []byte(simThrowSource), 0o644); err != nil {
		t.Fatal(err)
	}
	so := testkit.BuildLib(t, src, dir, "throw.so", "-std=c++17", "-Wall", "-Wextra", "-Werror")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestSimKernelThrow$", "-test.count=1")
	cmd.Env = append(os.Environ(), "PLOVER_SIM_THROW_SO="+so)
	child, err := cmd.CombinedOutput()
	const want = "terminate called after throwing an instance of 'std::runtime_error'"
	if err == nil || !strings.Contains(string(child), want) {
		t.Fatalf("the child: %v, want it ended by std::terminate (%q):\n%s", err, want, child)
	}
}

// simThrowSource: a kernel whose thread 1 throws (a block without
// barriers: thread 0 has returned), launched by an entry that catches
// around the launch and then launches again.
const simThrowSource = `#include "plover_kernel.h"
#include <stdexcept>
PLOVER_BUNDLE("host");
__global__ void thrower(unsigned *out) {
  if (threadIdx.x == 1) throw std::runtime_error("thread 1 threw");
  out[threadIdx.x] = 1;
}
__global__ void fine(unsigned *out) { out[threadIdx.x] = 2; }
PLOVER_ENTRY(throw_caught) {
  try {
    PLOVER_LAUNCH(thrower, 1, 2, s, (unsigned *)s->out.dat);
  } catch (...) {
  }
  PLOVER_LAUNCH(fine, 1, 2, s, (unsigned *)s->out.dat);
}
`

// faultsOnAGuard runs test again in a child process with env naming a
// fresh sim.so, and fails unless the child (what) dies of SIGSEGV on a
// guard page: sigcode=2, SEGV_ACCERR, a mapped page without access.
func faultsOnAGuard(t *testing.T, test, env, what string) {
	t.Helper()
	so := buildSim(t, t.TempDir(), nil)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^"+test+"$", "-test.count=1")
	cmd.Env = append(os.Environ(), env+"="+so)
	child, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(child), "SIGSEGV") || !strings.Contains(string(child), "sigcode=2") {
		t.Fatalf("%s: %v, want SIGSEGV on a guard page (sigcode=2):\n%s", what, err, child)
	}
}

// BenchmarkSim: one float per thread, n = 2^20, 256-thread blocks unless
// named. serial is the ABI 1 host loop (every thread called in turn);
// nosync the simulator's fast path; sync the same kernel ending in
// __syncthreads(), so every block runs as fibers; sync8 one with eight
// barriers (sync8 - sync = 7 barriers). kernel-ns/thread is the chain's own
// time per simulated thread.
func BenchmarkSim(b *testing.B) {
	e := loadSim(b, buildSim(b, b.TempDir(), nil))
	const n = 1 << 20
	in := make([]float32, n)
	for i := range in {
		in[i] = float32(i)
	}
	input := f32bytes(in)
	for _, c := range []struct {
		name, kernel string
		block        int32
	}{
		{"serial", "sim_vec_serial", 256},
		{"nosync", "sim_vec_nosync", 256},
		{"sync", "sim_vec_sync", 256},
		{"sync8", "sim_vec_sync8", 256},
		{"nosync-block1024", "sim_vec_nosync", 1024},
		{"sync-block1024", "sim_vec_sync", 1024},
		{"nosync-block32", "sim_vec_nosync", 32},
		{"sync-block32", "sim_vec_sync", 32},
	} {
		b.Run(c.name, func(b *testing.B) {
			inst := e.instance(b)
			idx, err := e.prog.Entry(c.kernel)
			if err != nil {
				b.Fatal(err)
			}
			r := &device.Run{Input: input, Output: make([]byte, 4*n),
				Chain: []device.Step{{Entry: idx, Grid: n / c.block, Block: c.block}}}
			var kernels time.Duration
			for b.Loop() {
				if err := inst.Run(r); err != nil {
					b.Fatal(err)
				}
				kernels += r.Timing.Kernels
			}
			for _, i := range []int{0, n/2 + 1, n - 1} {
				if got := math.Float32frombits(binary.LittleEndian.Uint32(r.Output[4*i:])); got != 2*float32(i)+1 {
					b.Fatalf("out[%d] = %v, want %v", i, got, 2*float32(i)+1)
				}
			}
			b.ReportMetric(float64(kernels.Nanoseconds())/float64(b.N), "kernel-ns/op")
			b.ReportMetric(float64(kernels.Nanoseconds())/float64(b.N)/n, "kernel-ns/thread")
		})
	}
}

// TestSimDynamicSharedGuard: a kernel that writes past the dynamic shared
// memory its launch asked for faults at the access, on an inaccessible
// page after it (sigcode=2), as an illegal access fails on a GPU. It went
// unnoticed: the memory was a heap buffer as large as the thread's
// largest launch so far.
func TestSimDynamicSharedGuard(t *testing.T) {
	if so := os.Getenv("PLOVER_SIM_DYN_OVERRUN_SO"); so != "" {
		// The child: 4 KiB written of a 64-byte launch, after a 16 KiB one.
		e := loadSim(t, so)
		out, err := e.run(e.instance(t), "sim_dyn_overrun", 1, 1, nil, 4)
		t.Fatalf("sim_dyn_overrun returned (%v, %x) instead of faulting", err, out)
	}
	if testing.Short() {
		t.Skip("runs a child process")
	}
	faultsOnAGuard(t, "TestSimDynamicSharedGuard", "PLOVER_SIM_DYN_OVERRUN_SO", "the child writing past its dynamic shared memory")
}
