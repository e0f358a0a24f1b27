package contain

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// bpfAsm assembles a classic BPF program whose jumps name labels: the
// reach filter's branches, counted by hand, had to be renumbered at every
// new rule, and a miscount is a filter that allows what it should refuse.
// Jumps go forward only (the kernel refuses a program with a backward
// one), each at most 255 instructions (a conditional jump's reach).
type bpfAsm struct {
	prog   []unix.SockFilter
	labels map[string]int
	jumps  []bpfJump
}

// bpfJump is a jump to resolve: at instruction i, to labels jt and jf
// (conditional; "" is the next instruction) or to ja (unconditional).
type bpfJump struct {
	i          int
	jt, jf, ja string
}

const (
	bpfLd   = unix.BPF_LD | unix.BPF_W | unix.BPF_ABS
	bpfJeq  = unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K
	bpfJge  = unix.BPF_JMP | unix.BPF_JGE | unix.BPF_K
	bpfJset = unix.BPF_JMP | unix.BPF_JSET | unix.BPF_K
	bpfJa   = unix.BPF_JMP | unix.BPF_JA
	bpfRet  = unix.BPF_RET | unix.BPF_K
)

// label names the next instruction.
func (a *bpfAsm) label(name string) {
	if a.labels == nil {
		a.labels = map[string]int{}
	}
	if _, ok := a.labels[name]; ok {
		panic("contain: bpf: label " + name + " twice")
	}
	a.labels[name] = len(a.prog)
}

// ld loads the 32-bit word at offset off of struct seccomp_data.
func (a *bpfAsm) ld(off uint32) { a.prog = append(a.prog, unix.SockFilter{Code: bpfLd, K: off}) }

// jeq, jge and jset compare the loaded word with k and go to jt if the
// comparison holds, else to jf.
func (a *bpfAsm) jeq(k uint32, jt, jf string)  { a.jump(bpfJeq, k, jt, jf) }
func (a *bpfAsm) jge(k uint32, jt, jf string)  { a.jump(bpfJge, k, jt, jf) }
func (a *bpfAsm) jset(k uint32, jt, jf string) { a.jump(bpfJset, k, jt, jf) }

func (a *bpfAsm) jump(code uint16, k uint32, jt, jf string) {
	a.jumps = append(a.jumps, bpfJump{i: len(a.prog), jt: jt, jf: jf})
	a.prog = append(a.prog, unix.SockFilter{Code: code, K: k})
}

// ja goes to label.
func (a *bpfAsm) ja(label string) {
	a.jumps = append(a.jumps, bpfJump{i: len(a.prog), ja: label})
	a.prog = append(a.prog, unix.SockFilter{Code: bpfJa})
}

// ret ends the program with seccomp's answer k.
func (a *bpfAsm) ret(k uint32) { a.prog = append(a.prog, unix.SockFilter{Code: bpfRet, K: k}) }

// assemble resolves the jumps and returns the program. A label that is
// missing, behind its jump, out of its reach or past the last instruction
// (the kernel refuses a jump off the program's end, but only as the
// filter is installed) is the filter's author's mistake, found by any
// test that builds the filter: it panics.
func (a *bpfAsm) assemble() []unix.SockFilter {
	to := func(i int, label string, limit int) uint32 {
		if label == "" {
			return 0
		}
		at, ok := a.labels[label]
		if !ok || at <= i || at-i-1 > limit || at >= len(a.prog) {
			panic(fmt.Sprintf("contain: bpf: jump from %d to %s (%d, known %v)", i, label, at, ok))
		}
		return uint32(at - i - 1)
	}
	for _, j := range a.jumps {
		if j.ja != "" {
			a.prog[j.i].K = to(j.i, j.ja, len(a.prog))
			continue
		}
		a.prog[j.i].Jt = uint8(to(j.i, j.jt, 255))
		a.prog[j.i].Jf = uint8(to(j.i, j.jf, 255))
	}
	return a.prog
}
