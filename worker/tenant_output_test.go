package worker

import (
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/plover-run/plover/api"
	"github.com/plover-run/plover/device"
	"github.com/plover-run/plover/funclog"
	"github.com/plover-run/plover/internal/testkit"
)

// Two versions of one function in its tenant's worker (a redeploy while
// the old version's requests finish, a version a pipeline pinned beside
// the current one) print to the one function's output: a line printed
// while both are active is that function's, whichever wrote it, not kept
// out of its log as a line of two functions' would be.
func TestTenantOutputOfTwoVersionsIsTheFunctions(t *testing.T) {
	var logged testkit.LogBuffer
	d := NewDevice(Options{Exe: os.Args[0], Base: device.NewHost(0), Landlock: true, StageDir: t.TempDir(), Spawner: spawner, TenantScope: true,
		Log: slog.New(slog.NewTextHandler(&logged, nil))})
	t.Cleanup(func() { d.Close() })
	s := funclog.New(nil)
	out := s.Sink("talker") // the function's, as the engine gives each of its versions
	ms := testkit.Slow("talker", 1)
	old := loadFor(t, d, "t", "", ms, out)
	mt := testkit.OutputManifest("talker", "say", 1, 1)
	cur := loadFor(t, d, "t", testkit.OutputSource(), mt, out)
	if old.(*program).p != cur.(*program).p {
		t.Fatal("the two versions are in two workers")
	}
	oldDone := startSlow(t, old, ms, 2000)
	if err := runOnce(t, cur, mt, []byte("together"), 10*time.Second); err != nil {
		t.Fatal(err)
	}
	if err := <-oldDone; err != nil {
		t.Fatal(err)
	}
	// The line is read before the run's reply or soon after; both runs
	// are over now: wait for it in either place.
	waitFor(t, "the line in the function's log or the server's", func() bool {
		return hasLine(s.Lines("talker", time.Time{}), "stdout", "say: together") || strings.Contains(logged.String(), "say: together")
	})
	if !hasLine(s.Lines("talker", time.Time{}), "stdout", "say: together") {
		t.Errorf("a line printed while two versions of the function ran is not in its log: %+v\nserver log:\n%s", s.Lines("talker", time.Time{}), logged.String())
	}
}

// anyOutput is an output of a comparable type that can hold a value that
// is not (a slice in its interface field): == on two of them panics.
type anyOutput struct{ v any }

func (anyOutput) Add(api.LogLine) {}

// sameOutput compares only outputs whose values compare: it read the
// type's comparability, and two anyOutputs holding slices panicked in the
// output reader's goroutine.
func TestSameOutputNeverPanics(t *testing.T) {
	a, b := anyOutput{[]int{1}}, anyOutput{[]int{1}}
	if sameOutput(a, b) {
		t.Error("two outputs holding slices read as one")
	}
	s := &struct{ anyOutput }{}
	if !sameOutput(s, s) {
		t.Error("one pointer output read as two")
	}
}
