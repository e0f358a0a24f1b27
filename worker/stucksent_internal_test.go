package worker

import "testing"

// A program whose load never reached its worker (its staging failed, say)
// mapped no library, and leaves no stuck copy: four such failures retired
// a healthy tenant worker, a process and a CUDA context more. One whose
// load was asked counts, loaded or failed (plover_load may fail after the
// dlopen).
func TestOnlyAnAskedLoadLeavesAStuckCopy(t *testing.T) {
	for _, tc := range []struct {
		name            string
		keepsLibs, sent bool
		want            int32
	}{
		{"staging failed, CUDA", true, false, 0},
		{"load asked, CUDA", true, true, 1},
		{"load asked, host (unloaded at close)", false, true, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := &proc{tenant: &tenancy{keepsLibs: tc.keepsLibs, progs: map[uint32]*program{}}}
			g := &program{p: p, id: 1, name: "fn", dir: "/cache/sha", memLimit: 64 << 20}
			p.tenant.progs[g.id] = g
			g.loadAsked.Store(tc.sent)
			p.unenroll(g, false)
			if got := p.tenant.stuck.Load(); got != tc.want {
				t.Errorf("stuck copies %d, want %d", got, tc.want)
			}
		})
	}
}
