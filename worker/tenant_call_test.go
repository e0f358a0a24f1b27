package worker

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/device"
	"github.com/plover-run/plover/internal/testkit"
)

// An instance's creation that waited behind a sibling's call in its
// tenant's worker until less than minTenantCallTime of its time was left
// is not sent: its request fails with a deadline, and the worker and the
// sibling live on, where a plover_instance_init slower than what was left
// (300 ms here, against about 100) would have timed out and ended them.
// The sibling's call is the test holding the channel's token for 300 ms.
func TestTenantCallLeftLittleTimeIsNotSent(t *testing.T) {
	d := tenantDevice(t)
	ms := testkit.Manifest("sibling")
	sib := loadFor(t, d, "t", "", ms, nil).(*program)
	mh := testkit.Manifest("hooks")
	mh.Library, mh.Chain = "hooks.so", []abi.Launch{{Kernel: "report", Grid: 1, Block: 1}}
	hooks := loadBuilt(t, d, mh, "-DSLOW_INIT_MS=300")
	// Its time (the deadline and instanceGrace) ends 400 ms from now:
	// about 100 ms left when the channel is free, or none (a slow
	// machine), which fails it as well.
	deadline := time.Now().Add(400*time.Millisecond - instanceGrace)
	sib.p.ctlTok <- struct{}{} // as a sibling's load would hold the channel
	release := time.AfterFunc(300*time.Millisecond, func() { <-sib.p.ctlTok })
	defer release.Stop()
	in, err := hooks.NewInstance(device.InstanceConfig{MaxInput: mh.MaxInputBytes, Tmp: mh.TmpBytes, Out: mh.OutBytes, Deadline: deadline})
	if err == nil {
		in.Close()
		t.Fatal("an instance was made past its deadline")
	}
	if !errors.Is(err, device.ErrNotStarted) {
		t.Fatalf("instance creation: %v, want ErrNotStarted (a deadline error, the call never sent)", err)
	}
	echoes(t, sib, ms)
	if !sib.Alive() {
		t.Fatalf("the tenant's worker ended (%v): the call was sent with too little time and timed out", sib.Death())
	}
}

// loadBuilt loads the hooks bundle built with args for tenant t.
func loadBuilt(t *testing.T, d *Device, m *abi.Manifest, args ...string) device.Program {
	t.Helper()
	dir := t.TempDir()
	testkit.BuildLib(t, testkit.HooksSource(), dir, m.Library, args...)
	testkit.WriteManifest(t, dir, m)
	p, err := d.Load(context.Background(), device.ProgramSpec{Dir: dir, Manifest: m, Tenant: "t"})
	if err != nil {
		t.Fatalf("load %s: %v", m.Name, err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}
