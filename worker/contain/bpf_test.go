package contain

import "testing"

// The assembler resolves forward jumps to their labels, and refuses (a
// panic, at the build of the filter) what the kernel would refuse only at
// its install, or what would jump where its author did not mean: a label
// missing, behind its jump, past a conditional jump's reach of 255, or
// past the last instruction.
func TestBPFAssemble(t *testing.T) {
	pad := func(a *bpfAsm, n int) {
		for range n {
			a.ld(0)
		}
	}
	for _, c := range []struct {
		name  string
		build func(a *bpfAsm)
		ok    bool
	}{
		{"forward, both branches", func(a *bpfAsm) {
			a.jeq(1, "yes", "")
			a.ret(0)
			a.label("yes")
			a.ret(1)
		}, true},
		{"at the reach", func(a *bpfAsm) { a.jeq(1, "far", ""); pad(a, 255); a.label("far"); a.ret(0) }, true},
		{"past the reach", func(a *bpfAsm) { a.jeq(1, "far", ""); pad(a, 256); a.label("far"); a.ret(0) }, false},
		{"missing", func(a *bpfAsm) { a.jeq(1, "nowhere", ""); a.ret(0) }, false},
		{"behind", func(a *bpfAsm) { a.label("back"); a.ld(0); a.ja("back"); a.ret(0) }, false},
		{"past the end", func(a *bpfAsm) { a.ja("end"); a.ret(0); a.label("end") }, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			var a bpfAsm
			c.build(&a)
			defer func() {
				if r := recover(); (r == nil) != c.ok {
					t.Fatalf("assembled: %v; want ok %v", r, c.ok)
				}
			}()
			prog := a.assemble()
			if c.name == "forward, both branches" && (prog[0].Jt != 1 || prog[0].Jf != 0) {
				t.Errorf("jt %d jf %d, want 1 and 0", prog[0].Jt, prog[0].Jf)
			}
			if c.name == "at the reach" && prog[0].Jt != 255 {
				t.Errorf("jt %d, want 255", prog[0].Jt)
			}
		})
	}
}
