package worker

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/internal/testkit"
)

// A sibling's run lost with its tenant's worker to another program's
// crash is told so: its error says the loss was another function's
// doing, not its own (a sibling's client learns no name of it), and the
// server's log names the function at fault. The crasher's own error
// says nothing of another.
func TestTenantCollateralLossSaysWhose(t *testing.T) {
	d, s := tenantOutputDevice(t)
	mh := testkit.Manifest("hostile")
	mh.Library = "hostile.so"
	mh.Chain = []abi.Launch{{Kernel: "segv", Grid: 1, Block: 1}}
	h := loadFor(t, d, "t", testkit.HostileSource(), mh, s.Sink("hostile"))
	ms := testkit.Slow("slow", 1)
	slow := loadFor(t, d, "t", "", ms, s.Sink("slow"))
	slowDone := startSlow(t, slow, ms, 5000)
	own := runOnce(t, h, mh, nil, 10*time.Second)
	sib := <-slowDone
	var pe *ProcessExit
	if !errors.As(sib, &pe) || !pe.Shared {
		t.Fatalf("the sibling's run: %v, want a collateral loss", sib)
	}
	if msg := sib.Error(); !strings.Contains(msg, "another function") || strings.Contains(msg, "hostile") {
		t.Errorf("the sibling's error %q: want it to say another function of its tenant caused it, naming none", msg)
	}
	if attrs := fmt.Sprint(pe.LogAttrs()...); !strings.Contains(attrs, "hostile") {
		t.Errorf("the sibling's loss logs %v: want the function at fault named", attrs)
	}
	if own == nil || strings.Contains(own.Error(), "another function") {
		t.Errorf("the crasher's own error: %v", own)
	}
}
