package sched_test

import (
	"context"
	"testing"
	"time"

	"github.com/plover-run/plover/internal/testkit"
	"github.com/plover-run/plover/sched"
)

// A panic in the policy, which the Scheduler calls under its mutex, is
// recovered by a transport (500) and the node serves on: the mutex must not
// stay locked, the device must not lose a slot, and a run that waited while
// the panic dispatched must still get its answer. Before the fix every
// section unlocked without defer: the next admission blocked in Lock past
// its deadline, forever; and a panic in Started while dispatching a queued
// run (a Done's) had taken that run out of its queue first, so it waited
// for an answer that never came, its deadline no help (leave found it
// gone and waited on).
func TestPolicyPanicLeavesSchedulerUsable(t *testing.T) {
	admit := func(f *sched.Flow, within time.Duration) (sched.Ticket, error) {
		tk, _, err := f.Admit(context.Background(), time.Now().Add(within), nil)
		return tk, err
	}
	for _, tc := range []struct {
		name, method string
		// do arms the policy and makes the call that panics; it returns
		// nil or a channel that a call made after it (a queued run's
		// Admit, a held run's Done) answers once it returned.
		do func(t *testing.T, arm func(), f, g *sched.Flow) <-chan error
	}{
		{"admitted at once", "Started", func(t *testing.T, arm func(), f, g *sched.Flow) <-chan error {
			arm()
			mustPanic(t, func() { admit(f, time.Second) })
			return nil
		}},
		{"queued", "Woke", func(t *testing.T, arm func(), f, g *sched.Flow) <-chan error {
			held, err := admit(g, time.Second)
			if err != nil {
				t.Fatal(err)
			}
			arm()
			mustPanic(t, func() { admit(f, time.Second) })
			ch := make(chan error, 1)
			go func() { held.Done(); ch <- nil }()
			return ch
		}},
		{"done", "Ended", func(t *testing.T, arm func(), f, g *sched.Flow) <-chan error {
			held, err := admit(g, time.Second)
			if err != nil {
				t.Fatal(err)
			}
			arm()
			mustPanic(t, held.Done)
			return nil
		}},
		{"dispatching", "Pick", dispatchPanics},
		{"dispatching", "Started", dispatchPanics},
		{"charged", "Charged", func(t *testing.T, arm func(), f, g *sched.Flow) <-chan error {
			arm()
			mustPanic(t, func() { f.Charge(time.Millisecond) })
			return nil
		}},
		{"set", "Reweighed", func(t *testing.T, arm func(), f, g *sched.Flow) <-chan error {
			arm()
			mustPanic(t, func() { f.Set(2, sched.Default) })
			return nil
		}},
	} {
		t.Run(tc.method+" "+tc.name, func(t *testing.T) {
			base, err := sched.NewPolicy("wfq", 0)
			if err != nil {
				t.Fatal(err)
			}
			bug := &testkit.PolicyBug{}
			s := sched.New(sched.Config{MaxRuns: 1, Policy: bug.Policy(base)})
			queued := tc.do(t, func() { bug.Arm(tc.method) }, s.Flow("f"), s.Flow("g"))
			if queued != nil {
				select {
				case err := <-queued:
					t.Logf("the call after the panic: %v", err)
				case <-time.After(3 * time.Second):
					t.Fatal("the call after the panic (a run queued with a 300 ms deadline, or a Done) has not returned after 3 s")
				}
			}
			// Another function's run: the device's one slot is free.
			done := make(chan error, 1)
			go func() {
				tk, err := admit(s.Flow("h"), 200*time.Millisecond)
				tk.Done()
				done <- err
			}()
			select {
			case err := <-done:
				if err != nil {
					t.Fatalf("the next admission, the device idle: %v (a slot was lost to the panic)", err)
				}
			case <-time.After(3 * time.Second):
				t.Fatal("the next admission (200 ms deadline) still blocked after 3 s: the scheduler's mutex was left locked by the recovered panic")
			}
		})
	}
}

// dispatchPanics has the policy panic as a Done dispatches a queued run.
func dispatchPanics(t *testing.T, arm func(), f, g *sched.Flow) <-chan error {
	held, _, err := g.Admit(context.Background(), time.Now().Add(time.Second), nil)
	if err != nil {
		t.Fatal(err)
	}
	ch := make(chan error, 1)
	go func() {
		tk, _, err := f.Admit(context.Background(), time.Now().Add(300*time.Millisecond), nil)
		tk.Done()
		ch <- err
	}()
	for f.Waiting() == 0 {
		time.Sleep(time.Millisecond) // polls observed state
	}
	arm()
	mustPanic(t, held.Done)
	return ch
}

func mustPanic(t *testing.T, fn func()) {
	t.Helper()
	defer func() {
		if recover() == nil {
			t.Fatal("the armed policy did not panic")
		}
	}()
	fn()
}

// A panic in the policy's Ended, as a run gives its slot back with another
// run queued: the freed slot still goes to the queued run. Its dispatch
// came after Ended, and the panic skipped it: the queued run waited out
// its deadline (3 s) on an idle device (a review).
func TestEndedPanicStillDispatches(t *testing.T) {
	base, _ := sched.NewPolicy("wfq", 0)
	bug := &testkit.PolicyBug{}
	s := sched.New(sched.Config{MaxRuns: 1, Policy: bug.Policy(base)})
	f, g := s.Flow("f"), s.Flow("g")
	held, _, err := g.Admit(context.Background(), time.Now().Add(10*time.Second), nil)
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() {
		tk, _, err := f.Admit(context.Background(), time.Now().Add(3*time.Second), nil)
		tk.Done()
		got <- err
	}()
	for f.Waiting() == 0 { // observed: the run is queued
		time.Sleep(time.Millisecond)
	}
	bug.Arm("Ended")
	mustPanic(t, held.Done)
	if err := <-got; err != nil {
		t.Fatalf("the run queued behind a Done whose Ended panicked: %v, want its turn", err)
	}
}
