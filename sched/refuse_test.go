package sched

import (
	"context"
	"errors"
	"testing"
	"time"
)

// Refuse (a node stopping) answers the runs waiting for the device with
// its error at once, of every flow, and every run that comes after, with
// a slot free or not; the run admitted before goes on and ends as usual,
// leaving nothing queued or held.
func TestRefuseAnswersWaitingRunsAndLaterOnes(t *testing.T) {
	errStop := errors.New("stopping")
	for _, tc := range []struct {
		name     string
		slotFree bool // the running run has ended when the next comes
	}{
		{"a later run, the slot taken", false},
		{"a later run, the slot free", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clk := newFakeClock()
			s := New(Config{MaxRuns: 1, Clock: clk})
			a, b := s.Flow("a"), s.Flow("b")
			ctx := context.Background()
			running, _, err := a.Admit(ctx, time.Time{}, nil)
			if err != nil {
				t.Fatal(err)
			}
			ca := admitAsync(a, ctx, time.Time{}, nil)
			cb := admitAsync(b, ctx, time.Time{}, nil)
			waitFor(t, "both queued", func() bool { return a.queued() == 1 && b.queued() == 1 })
			if n := s.Refuse(errStop); n != 2 {
				t.Errorf("Refuse answered %d waiting runs, want 2", n)
			}
			for _, c := range []<-chan result{ca, cb} {
				if r := got(t, c, "refused"); r.err != errStop || r.t.r != nil {
					t.Errorf("a waiting run: %v (ticket %v), want the refusal's error and no ticket", r.err, r.t.r != nil)
				}
			}
			if tc.slotFree {
				running.Done()
			}
			if r := got(t, admitAsync(b, ctx, time.Time{}, nil), "a run after the refusal"); r.err != errStop || r.t.r != nil {
				t.Errorf("a run after the refusal: %v, want the refusal's error and no ticket", r.err)
			}
			if !tc.slotFree {
				running.Done()
			}
			if s.running_() != 0 || a.queued()+b.queued() != 0 {
				t.Errorf("%d runs running, %d queued after the last ended; want none", s.running_(), a.queued()+b.queued())
			}
		})
	}
}
