package objectstore

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"
)

// BenchmarkFSListRecords lists functions/ in a store laid out as a node's
// with 1,000 functions: their records, the records' lock files, and as
// many bundles beside them (what GET /v1/functions and each poll list).
func BenchmarkFSListRecords(b *testing.B) {
	root := b.TempDir()
	s, err := NewFS(root)
	if err != nil {
		b.Fatal(err)
	}
	for _, d := range []string{"functions", "bundles"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			b.Fatal(err)
		}
	}
	for i := range 1000 {
		for _, name := range []string{fmt.Sprintf("functions/fn-%04d.json", i), fmt.Sprintf("functions/.lock-fn-%04d.json", i), fmt.Sprintf("bundles/%064x.tar.zst", i)} {
			if err := os.WriteFile(filepath.Join(root, name), []byte("{}"), 0o644); err != nil {
				b.Fatal(err)
			}
		}
	}
	ctx := context.Background()
	cpu := cpuTime()
	for b.Loop() {
		l, err := s.List(ctx, "functions/")
		if err != nil || len(l) != 1000 {
			b.Fatalf("listed %d, %v; want 1000", len(l), err)
		}
	}
	b.ReportMetric(float64(cpuTime()-cpu)/1e6/float64(b.N), "cpu-ms/op")
}

// cpuTime is the CPU time this process has used, user and system: on a
// shared machine it swings with the load much less than the time.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// A listing's version tags are the ones Stat and GetTagged give for the
// same object (a node keeps records by the listed tag and compares), and
// change when the object is written again.
func TestFSListTagsMatchStat(t *testing.T) {
	ctx := context.Background()
	s, err := NewFS(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	keys := []string{"functions/a.json", "functions/b.json", "functions/sub/c.json", "bundles/x.tar.zst", "top"}
	for _, k := range keys {
		if err := s.Put(ctx, k, strings.NewReader(k), int64(len(k))); err != nil {
			t.Fatal(err)
		}
	}
	check := func() map[string]string {
		t.Helper()
		l, err := s.List(ctx, "")
		if err != nil || len(l) != len(keys) {
			t.Fatalf("list = %v, %v", l, err)
		}
		tags := map[string]string{}
		for _, in := range l {
			st, err := s.Stat(ctx, in.Key)
			if err != nil {
				t.Fatal(err)
			}
			rc, gt, err := s.GetTagged(ctx, in.Key)
			if err != nil {
				t.Fatal(err)
			}
			rc.Close()
			if in.ETag == "" || in.ETag != st.ETag || in.ETag != gt.ETag || in.Size != st.Size || !in.ModTime.Equal(st.ModTime) {
				t.Errorf("%s: listed %+v, stat %+v, get %+v", in.Key, in, st, gt)
			}
			tags[in.Key] = in.ETag
		}
		return tags
	}
	// Prefixes no key can have: under an object, outside the root.
	for _, prefix := range []string{"top/", "top/x", "../", "functions/../../", "nope/sub/"} {
		if l, err := s.List(ctx, prefix); err != nil || len(l) != 0 {
			t.Errorf("list %q = %v, %v; want nothing", prefix, l, err)
		}
	}
	before := check()
	if err := s.PutIf(ctx, "functions/a.json", strings.NewReader("new"), 3, before["functions/a.json"]); err != nil {
		t.Fatal(err)
	}
	after := check()
	for _, k := range keys {
		if changed := before[k] != after[k]; changed != (k == "functions/a.json") {
			t.Errorf("%s: tag %s -> %s", k, before[k], after[k])
		}
	}
}

// validSegment is the regexp it replaced.
func TestValidSegmentIsTheRegexp(t *testing.T) {
	re := regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9._-]*$`)
	cases := []string{"", "a", "A", "0", "_", ".", "-", "..", ".put-x", "a.b-c_d", "a/b", "é", "a\\x00", "a b", "-a", "a-", "Z9.", "x\n"}
	rnd := rand.New(rand.NewPCG(1, 2))
	alphabet := "aZ09_.-/ \x00\xff"
	for range 5000 {
		b := make([]byte, rnd.IntN(5))
		for i := range b {
			b[i] = alphabet[rnd.IntN(len(alphabet))]
		}
		cases = append(cases, string(b))
	}
	for _, c := range cases {
		if got, want := validSegment(c), re.MatchString(c); got != want {
			t.Errorf("validSegment(%q) = %v, the regexp %v", c, got, want)
		}
	}
}
