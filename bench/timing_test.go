package bench

import (
	"testing"
	"time"
)

func TestParseMillis(t *testing.T) {
	for _, c := range []struct {
		in   string
		want time.Duration
		ok   bool
	}{
		{"0", 0, true},
		{"0.000", 0, true},
		{"1", time.Millisecond, true},
		{"0.613", 613 * time.Microsecond, true},
		{"12.5", 12500 * time.Microsecond, true},
		{".5", 500 * time.Microsecond, true},
		{"3.", 3 * time.Millisecond, true},
		{"0.0000019", 1, true}, // below a nanosecond is truncated
		{"2155.740", 2155740 * time.Microsecond, true},
		{"", 0, false},
		{".", 0, false},
		{"-1", 0, false},
		{"1e3", 0, false},
		{"1.2.3", 0, false},
		{" 1", 0, false},
		{"1234567890123", 0, false}, // 10^12 ms and more
	} {
		got, ok := ParseMillis([]byte(c.in))
		if ok != c.ok || (ok && got != c.want) {
			t.Errorf("ParseMillis(%q) = %v, %v; want %v, %v", c.in, got, ok, c.want, c.ok)
		}
	}
}

func TestParseServerTiming(t *testing.T) {
	// What httpapi writes.
	h := "queue;dur=0.002, load;dur=9.118, copyin;dur=0.613, kernels;dur=1.697, copyout;dur=2.876, total;dur=15.163"
	var st ServerTiming
	if !ParseServerTiming([]byte(h), &st) {
		t.Fatalf("incomplete: %+v", st)
	}
	want := [NumMetrics]time.Duration{2 * time.Microsecond, 9118 * time.Microsecond, 613 * time.Microsecond,
		1697 * time.Microsecond, 2876 * time.Microsecond, 15163 * time.Microsecond}
	if st.Dur != want {
		t.Fatalf("got %v, want %v", st.Dur, want)
	}

	// A worker's run: dispatch's two parts, optional as dispatch is.
	h = "queue;dur=0, sched;dur=0, load;dur=0, copyin;dur=0.002, kernels;dur=0.1, copyout;dur=0, resolve;dur=0.001, dispatch;dur=0.05, handoff;dur=0.012, handback;dur=0.02, total;dur=0.153"
	if !ParseServerTiming([]byte(h), &st) || st.Dur[Handoff] != 12*time.Microsecond || st.Dur[Handback] != 20*time.Microsecond ||
		st.Has&(1<<Handoff|1<<Handback) != 1<<Handoff|1<<Handback || !st.Complete() {
		t.Fatalf("a worker's run: has=%b %v", st.Has, st.Dur)
	}

	// Other shapes the header grammar allows: unknown metrics, desc
	// parameters, quoted and upper-case dur, no spaces, missing metrics.
	h = `cdn;desc="edge", total;desc="all";DUR="3.5",kernels;dur=1 ,queue`
	if ParseServerTiming([]byte(h), &st) {
		t.Fatal("complete with load, copyin, copyout missing")
	}
	if st.Has != 1<<Total|1<<Kernels || st.Dur[Total] != 3500*time.Microsecond || st.Dur[Kernels] != time.Millisecond {
		t.Fatalf("got has=%b %v", st.Has, st.Dur)
	}
	if ParseServerTiming(nil, &st) || st.Has != 0 {
		t.Fatal("empty header")
	}
	if ParseServerTiming([]byte("total;dur=abc"), &st); st.Has != 0 {
		t.Fatal("bad dur accepted")
	}
}

func TestParseServerTimingAllocs(t *testing.T) {
	h := []byte("queue;dur=0.002, load;dur=0.000, copyin;dur=0.613, kernels;dur=1.697, copyout;dur=2.876, total;dur=5.163")
	var st ServerTiming
	if n := testing.AllocsPerRun(1000, func() { ParseServerTiming(h, &st) }); n != 0 {
		t.Fatalf("%v allocations per parse", n)
	}
}

func BenchmarkParseServerTiming(b *testing.B) {
	h := []byte("queue;dur=0.002, load;dur=0.000, copyin;dur=0.613, kernels;dur=1.697, copyout;dur=2.876, total;dur=5.163")
	var st ServerTiming
	b.ReportAllocs()
	for b.Loop() {
		if !ParseServerTiming(h, &st) {
			b.Fatal("incomplete")
		}
	}
}
