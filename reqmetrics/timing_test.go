package reqmetrics

import (
	"strings"
	"testing"
	"time"

	"github.com/plover-run/plover/call"
)

// Server-Timing names a worker run's handoff and handback after dispatch,
// and only for such a run; the whole header, a batch's entries and every
// part at its longest included, fits in ServerTimingCap.
func TestServerTimingParts(t *testing.T) {
	const long = 99_999*time.Millisecond + 999*time.Microsecond
	for _, tc := range []struct {
		name string
		tm   call.Timing
		n    int
		want string // a substring
		none string // absent
	}{
		{"in the server's process", call.Timing{Kernels: time.Millisecond, Dispatch: 20 * time.Microsecond, Total: 2 * time.Millisecond}, 0,
			"dispatch;dur=0.020, total;dur=2.000", "handoff"},
		{"in a worker", call.Timing{Dispatch: 90 * time.Microsecond, Handoff: 30 * time.Microsecond, Handback: 40 * time.Microsecond, Total: time.Millisecond}, 0,
			"dispatch;dur=0.090, handoff;dur=0.030, handback;dur=0.040, total;dur=1.000", ""},
		{"a handback alone", call.Timing{Dispatch: 90 * time.Microsecond, Handback: 40 * time.Microsecond}, 0,
			"handoff;dur=0.000, handback;dur=0.040", ""},
		{"every part at its longest, batched", call.Timing{Queue: long, Sched: long, Load: long, CopyIn: long, Kernels: long, CopyOut: long,
			Resolve: long, Dispatch: long, Handoff: long, Handback: long, Total: long, BatchWait: long}, 65_535,
			"batchwait;dur=99999.999, batch;desc=65535", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := &call.Request{Timing: tc.tm, BatchSize: tc.n}
			b := make([]byte, 0, ServerTimingCap)
			if n := testing.AllocsPerRun(100, func() { b = AppendServerTiming(b[:0], r, nil) }); n != 0 {
				t.Errorf("%v allocations; want none into %d bytes (the header is %d)", n, ServerTimingCap, len(b))
			}
			got := string(b)
			if !strings.Contains(got, tc.want) || (tc.none != "" && strings.Contains(got, tc.none)) {
				t.Errorf("%s\nwant %q in it%s", got, tc.want, map[bool]string{true: ", and no " + tc.none}[tc.none != ""])
			}
		})
	}
}

// A step is shown to its caller only where it sees every name in the
// step's path: a nested pipeline's step hides if either the pipeline or
// the function is another tenant's.
func TestStepShown(t *testing.T) {
	sees := func(name string) bool { return strings.HasPrefix(name, "a-") }
	for _, tc := range []struct {
		step string
		want bool
	}{
		{"a-cnn", true}, {"b-cnn", false}, {"a-inner/a-cnn", true}, {"a-inner/b-cnn", false}, {"b-inner/a-cnn", false},
	} {
		if got := StepShown(&call.StepTiming{Step: tc.step}, sees); got != tc.want {
			t.Errorf("%s: shown %v, want %v", tc.step, got, tc.want)
		}
		if !StepShown(&call.StepTiming{Step: tc.step}, nil) {
			t.Errorf("%s: hidden with no tokens", tc.step)
		}
	}
}
