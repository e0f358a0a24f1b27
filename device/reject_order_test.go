package device_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/plover-run/plover/device"
	"github.com/plover-run/plover/internal/testkit"
)

// orderSource launches a kernel that cannot start (a block of 2048
// threads; under nvcc without a GPU, no device either) before or after
// plover_reject or plover_fail. It declares itself a host bundle under nvcc
// too, so that the host device runs its CUDA build's entries on the CPU,
// their launches failing there as they would on a GPU.
const orderSource = `#include "plover_kernel.h"
PLOVER_BUNDLE("host");
__global__ void touch(uint8_t *p) { p[0] = 1; }
#define BAD_LAUNCH(s) PLOVER_LAUNCH(touch, 1, 2048, s, (s)->out.dat)
#ifdef __CUDACC__
#define CLEAR() (void)cudaGetLastError() /* an author's cleanup, or a library's */
#else
#define CLEAR()
#endif
PLOVER_ENTRY(launch_then_reject) { BAD_LAUNCH(s); plover_reject(s, "bad input"); }
PLOVER_ENTRY(launch_then_fail) { BAD_LAUNCH(s); plover_fail(s, "failed after the launch"); }
PLOVER_ENTRY(launch_reject_clear) { BAD_LAUNCH(s); plover_reject(s, "bad input"); CLEAR(); }
PLOVER_ENTRY(launch_fail_clear) { BAD_LAUNCH(s); plover_fail(s, "failed after the launch"); CLEAR(); }
PLOVER_ENTRY(reject_then_launch) { plover_reject(s, "bad input"); BAD_LAUNCH(s); }
`

// The first failure or refusal of a run wins on both targets, whatever
// clears a CUDA error after it: a refusal
// after a launch that failed is the launch's failure (500), not the
// client's fault (422), as the host simulator, which records a failed
// launch at once, always had it; a refusal before one stays a refusal.
func TestFailedLaunchWinsOverLaterRefusal(t *testing.T) {
	for _, tt := range []struct {
		name  string
		build builder
	}{
		{"host simulator", buildHost},
		{"CUDA build", testkit.BuildCUDALib},
	} {
		t.Run(tt.name, func(t *testing.T) {
			prog := loadSource(t, "order", orderSource, "launch_then_reject", tt.build)
			inst := testkit.HostInstance(t, prog, 16, 16)
			run := func(entry string) *device.KernelError {
				idx, err := prog.Entry(entry)
				if err != nil {
					t.Fatal(err)
				}
				err = inst.Run(&device.Run{Input: []byte("x"), Output: make([]byte, 16), Chain: []device.Step{{Entry: idx, Grid: 1, Block: 1}}})
				var ke *device.KernelError
				if !errors.As(err, &ke) {
					t.Fatalf("%s: %v, want the bundle's error", entry, err)
				}
				return ke
			}
			var failed string
			// The launch's error is taken as the failure comes: an error
			// cleared after it (cudaGetLastError) lost both, and the
			// request succeeded.
			for _, entry := range []string{"launch_then_reject", "launch_then_fail", "launch_reject_clear", "launch_fail_clear"} {
				ke := run(entry)
				if ke.Rejected || !strings.Contains(ke.Msg, "cudaError") {
					t.Errorf("%s: %v, want the launch's failure", entry, ke)
				}
				failed = ke.Msg
			}
			// A GPU and the simulator refuse the launch itself; a CUDA
			// runtime without a device fails every call from its first,
			// so there its error comes before any refusal.
			if !strings.Contains(failed, "cudaErrorInvalidConfiguration") {
				t.Logf("no refusal before a failed launch to check: the CUDA runtime fails every call here (%s)", failed)
				return
			}
			if ke := run("reject_then_launch"); !ke.Rejected || ke.Msg != "bad input" {
				t.Errorf("reject_then_launch: %v, want the refusal, which came first", ke)
			}
		})
	}
}
