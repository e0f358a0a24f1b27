package apierr

import (
	"errors"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/errdefs"
	"google.golang.org/grpc/codes"
)

// Every engine kind has its own row (a kind added without one would answer
// 500/Internal on both transports), and the rows the issue names map as it
// says.
func TestEveryKindMapped(t *testing.T) {
	for k := errdefs.KindInternal; k <= errdefs.KindRejected; k++ {
		if int(k) >= len(byKind) || byKind[k].HTTP == 0 || byKind[k].Name == "" {
			t.Errorf("engine kind %d has no status", k)
		}
	}
	if int(errdefs.KindRejected)+1 != len(byKind) {
		t.Errorf("byKind has %d rows for %d kinds: a kind after KindRejected?", len(byKind), errdefs.KindRejected+1)
	}
	for _, tc := range []struct {
		k    errdefs.Kind
		http int
		grpc codes.Code
	}{
		{errdefs.KindNotFound, 404, codes.NotFound},
		{errdefs.KindBadRequest, 400, codes.InvalidArgument},
		{errdefs.KindRejected, 422, codes.InvalidArgument},
		{errdefs.KindBusy, 429, codes.ResourceExhausted},
		{errdefs.KindTimeout, 504, codes.DeadlineExceeded},
		{errdefs.KindUnavailable, 503, codes.Unavailable},
		{errdefs.KindForbidden, 403, codes.PermissionDenied},
		{errdefs.KindKernel, 500, codes.Internal},
		{errdefs.KindWorkerCrashed, 500, codes.Internal},
		{errdefs.Kind(99), 500, codes.Internal},
	} {
		if s := Of(tc.k); s.HTTP != tc.http || s.GRPC != tc.grpc {
			t.Errorf("kind %d: %d %v, want %d %v", tc.k, s.HTTP, s.GRPC, tc.http, tc.grpc)
		}
	}
}

// Classify: the transport's own refusals keep their class (a 5xx one
// counted as the server's failure), the engine's errors their kind, and a
// foreign error's text stays out of the client's message.
func TestClassify(t *testing.T) {
	for _, tc := range []struct {
		name  string
		err   error
		http  int
		kind  errdefs.Kind
		msg   string
		known bool
	}{
		{"refusal", fmt.Errorf("wrapped: %w", &Error{Status: NotFound, Msg: "model m version v"}), 404, errdefs.KindBadRequest, "model m version v", true},
		{"bad output", &Error{Status: BadOutput, Msg: "NaN"}, 500, errdefs.KindInternal, "NaN", true},
		// A transport's 503 (no room in the body budget) is the kind whose
		// class it is, as the engine's 503s are, not Internal.
		{"unavailable refusal", &Error{Status: Unavailable, Msg: "--max-body-memory"}, 503, errdefs.KindUnavailable, "--max-body-memory", true},
		{"engine", &errdefs.Error{Kind: errdefs.KindBusy, Msg: "queue full"}, 429, errdefs.KindBusy, "queue full", true},
		{"foreign", errors.New("secret path /var/x"), 500, errdefs.KindInternal, "internal error", false},
	} {
		st, k, msg, known := Classify(tc.err)
		if st.HTTP != tc.http || k != tc.kind || msg != tc.msg || known != tc.known {
			t.Errorf("%s: %d %v %q %v, want %d %v %q %v", tc.name, st.HTTP, k, msg, known, tc.http, tc.kind, tc.msg, tc.known)
		}
	}
}

// The one wording of a did-you-mean: a name within a typo of the one asked
// for, among those the caller may see, never the name itself.
func TestDidYouMean(t *testing.T) {
	names := []string{"saxpy", "cnn", "b-cnn", "a-vec"}
	all := func(string) bool { return true }
	onlyA := func(n string) bool { return strings.HasPrefix(n, "a-") }
	for _, tc := range []struct {
		name string
		sees func(string) bool
		want string
	}{
		{"saxpi", all, ` (did you mean "saxpy"?)`},
		{"Saxpy", all, ` (did you mean "saxpy"?)`},
		{"cnn", all, ` (did you mean "b-cnn"?)`}, // not itself
		{"zzzzzz", all, ""},
		{"a-cnn", all, ` (did you mean "b-cnn"?)`},
		{"a-cnn", onlyA, ""}, // another tenant's name is not offered
		{"a-vex", onlyA, ` (did you mean "a-vec"?)`},
	} {
		if got := DidYouMean(tc.name, names, tc.sees); got != tc.want {
			t.Errorf("DidYouMean(%q) = %q, want %q", tc.name, got, tc.want)
		}
	}
}

// A name longer than any function's gets no suggestion, and costs nothing
// near its length to refuse: a model name over gRPC may be as long as the
// body limit.
func TestDidYouMeanOfANameLongerThanAnyFunctionsIsNone(t *testing.T) {
	long := strings.Repeat("a", abi.MaxNameLen)
	names := []string{"saxpy", long}
	all := func(string) bool { return true }
	if got := DidYouMean(long+"b", names, all); got != "" {
		t.Errorf("DidYouMean(64 bytes) = %q, want none", got)
	}
	if got := DidYouMean(long[1:]+"b", names, all); got == "" {
		t.Errorf("DidYouMean(63 bytes a typo away) = none, want %q", long)
	}
	huge := strings.Repeat("Q", 1<<20)
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	DidYouMean(huge, names, all)
	runtime.ReadMemStats(&after)
	if n := after.TotalAlloc - before.TotalAlloc; n > 64<<10 {
		t.Errorf("DidYouMean of a 1 MiB name allocated %d bytes", n)
	}
}

// An error carrying when a retry may succeed (a crash back-off) tells the
// whole seconds until then, rounded up and at least 1, through wrapping;
// one carrying none tells 0 (no Retry-After).
func TestRetrySeconds(t *testing.T) {
	now := time.Unix(1000, 0)
	backoff := func(d time.Duration) error {
		return &errdefs.Error{Kind: errdefs.KindUnavailable, Msg: "backing off", RetryAt: now.Add(d)}
	}
	for _, tc := range []struct {
		name string
		err  error
		want int64
	}{
		{"none", errdefs.New(errdefs.KindUnavailable, nil, "store down"), 0},
		{"not ours", errors.New("x"), 0},
		{"a minute", backoff(time.Minute), 60},
		{"rounded up", backoff(59*time.Second + time.Millisecond), 60},
		{"under a second", backoff(time.Millisecond), 1},
		{"passed", backoff(-time.Second), 1},
		{"wrapped", fmt.Errorf("step 2: %w", backoff(30*time.Second)), 30},
		{"under another Error", errdefs.New(errdefs.KindUnavailable, backoff(5*time.Second), "pipeline p"), 5},
		{"joined", errors.Join(errors.New("a"), backoff(2*time.Second)), 2},
	} {
		if got := RetrySeconds(tc.err, now); got != tc.want {
			t.Errorf("%s: %d, want %d", tc.name, got, tc.want)
		}
	}
}
