package frontdoor

import (
	"bytes"
	"errors"
	"log/slog"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/plover-run/plover/apierr"
	"github.com/plover-run/plover/call"
	"github.com/plover-run/plover/errdefs"
	"github.com/plover-run/plover/reqmetrics"
)

// refusals is a Runner that records only what Refused is told.
type refusals struct {
	Runner
	names    []string
	statuses []int
}

func (r *refusals) Refused(name string, status int) {
	r.names, r.statuses = append(r.names, name), append(r.statuses, status)
}

// End is the one place an invoke's outcome is classified, logged and
// counted, whichever transport saw it; a transport's own 4xx, and any
// error marked as a refusal before the engine (Refusal: a full queue
// found before the body, a body without room or past its deadline), which
// the engine never saw, are counted in the function's requests there
// (Runner.Refused, with the status), and nothing else is.
func TestEnd(t *testing.T) {
	for _, tc := range []struct {
		name      string
		err       error
		status    int
		msg, log  string // what the client reads; what the log holds ("": nothing)
		label     string
		transport string
		refused   bool
		version   string // the version Invoke resolved ("": the request never reached it)
	}{
		{"ok", nil, 200, "", "", "echo", "http", false, ""},
		{"unknown function", &errdefs.Error{Kind: errdefs.KindNotFound, Msg: "function nope not found"}, 404, "function nope not found", "", "_unknown", "grpc", false, ""},
		{"kernel failure", &errdefs.Error{Kind: errdefs.KindKernel, Msg: "vecadd: bad input"}, 500, "vecadd: bad input", "level=WARN msg=\"request failed\" transport=http", "echo", "http", false, ""},
		{"refused by the function", &errdefs.Error{Kind: errdefs.KindRejected, Msg: "echo refused its input"}, 422, "echo refused its input", "", "echo", "grpc", false, ""},
		{"transport refusal", &apierr.Error{Status: apierr.UnsupportedMedia, Msg: "Content-Type text/plain"}, 415, "Content-Type text/plain", "", "echo", "http", true, ""},
		{"bad tensors", &apierr.Error{Status: apierr.BadRequest, Msg: "input \"x\" is missing"}, 400, "input \"x\" is missing", "", "echo", "grpc", true, ""},
		{"output it cannot encode", &apierr.Error{Status: apierr.BadOutput, Msg: "NaN"}, 500, "NaN", "level=WARN msg=\"request failed\" transport=http", "echo", "http", false, ""},
		{"foreign error", errors.New("disk on fire"), 500, "internal error", "level=ERROR msg=\"request failed\" transport=grpc", "echo", "grpc", false, ""},
		{"full queue before the body", Refusal(&errdefs.Error{Kind: errdefs.KindBusy, Msg: "echo is busy"}), 429, "echo is busy", "", "echo", "http", true, ""},
		{"no room for the body", Refusal(&apierr.Error{Status: apierr.Unavailable, Msg: "--max-body-memory"}), 503, "--max-body-memory", "level=WARN msg=\"request failed\" transport=http", "echo", "http", true, ""},
		{"body past its deadline", Refusal(&errdefs.Error{Kind: errdefs.KindTimeout, Msg: "still arriving"}), 504, "still arriving", "level=WARN msg=\"request failed\" transport=http", "echo", "http", true, ""},
		// The engine ran it and counted it; /v2 then could not answer in JSON.
		{"answer over JSON's bound after the run", &apierr.Error{Status: apierr.BadRequest, Msg: "ask for them in binary"}, 400, "ask for them in binary", "", "echo", "http", false, "v1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var logs bytes.Buffer
			reg := prometheus.NewRegistry()
			m := reqmetrics.New(reg)
			m.Record(call.NameOf("echo"), 200, errdefs.KindInternal, &call.Request{}) // a function the metrics know
			run := &refusals{}
			d := New(Config{Runner: run, Metrics: m, Log: slog.New(slog.NewTextHandler(&logs, nil))})
			fn := "echo"
			if tc.label == "_unknown" {
				fn = "nope"
			}
			st, msg := d.End(&Outcome{Transport: tc.transport, Route: "r", Function: call.NameOf(fn), Req: &call.Request{Version: tc.version}, Err: tc.err})
			if st.HTTP != tc.status || msg != tc.msg {
				t.Fatalf("%d %q, want %d %q", st.HTTP, msg, tc.status, tc.msg)
			}
			if tc.log == "" && logs.Len() > 0 || !strings.Contains(logs.String(), tc.log) {
				t.Fatalf("log %q, want %q", logs.String(), tc.log)
			}
			want := 1.0
			if tc.label == "echo" && tc.status == 200 {
				want = 2 // the one recorded above, and this one
			}
			if got := requests(t, reg, tc.label, strconv.Itoa(tc.status)); got != want {
				t.Fatalf("plover_requests_total{function=%q,code=%d} = %v, want %v", tc.label, tc.status, got, want)
			}
			if refused := len(run.names) == 1 && run.names[0] == fn && run.statuses[0] == tc.status; refused != tc.refused || len(run.names) > 1 {
				t.Fatalf("Refused told %q %v, want it told %v", run.names, run.statuses, tc.refused)
			}
		})
	}
}

func requests(t *testing.T, reg *prometheus.Registry, fn, code string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "plover_requests_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			l := map[string]string{}
			for _, lp := range m.GetLabel() {
				l[lp.GetName()] = lp.GetValue()
			}
			if l["function"] == fn && l["code"] == code {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}

// timeouts is a Runner whose default deadline is timeout from the start.
type timeouts struct {
	Runner
	timeout time.Duration
}

func (r timeouts) Deadline(d, start time.Time) time.Time {
	if d.IsZero() {
		return start.Add(r.timeout)
	}
	return d
}

// Begin sets a request's start and its one deadline: the client's when it
// asked for one, else the runner's timeout from the start, whatever the
// request held before.
func TestBegin(t *testing.T) {
	start := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	asked := start.Add(250 * time.Millisecond)
	for _, tc := range []struct {
		name  string
		asked time.Time
		want  time.Time
	}{
		{"the client's", asked, asked},
		{"the server's", time.Time{}, start.Add(5 * time.Second)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := New(Config{Runner: timeouts{timeout: 5 * time.Second}})
			r := call.Request{Deadline: start.Add(time.Hour), Began: start.Add(-time.Hour)} // a pooled request's last values
			d.Begin(&r, start, tc.asked)
			if !r.Deadline.Equal(tc.want) || !r.Began.Equal(start) {
				t.Errorf("deadline %v, began %v; want %v, %v", r.Deadline, r.Began, tc.want, start)
			}
			if got := d.Deadline(start, tc.asked); !got.Equal(tc.want) {
				t.Errorf("Deadline = %v, want %v", got, tc.want)
			}
		})
	}
}

// A transport's 503 (no room in the body budget: the request never
// reached a function) for names the metrics have not met is counted under
// one label, as the engine's 503s are: probing 50 names made 50
// plover_requests_total series when it was classed Internal.
func TestUnavailableRefusalsShareOneSeries(t *testing.T) {
	reg := prometheus.NewRegistry()
	d := New(Config{Metrics: reqmetrics.New(reg)})
	for i := range 50 {
		err := Refusal(&apierr.Error{Status: apierr.Unavailable, Msg: "the server holds its limit of request bytes in memory"})
		d.End(&Outcome{Transport: "http", Route: "r", Function: call.NameOf("probe" + strconv.Itoa(i)), Req: &call.Request{}, Err: err})
	}
	n, err := testutil.GatherAndCount(reg, "plover_requests_total")
	if err != nil || n != 1 {
		t.Fatalf("50 unknown names answered 503: %d plover_requests_total series (%v), want 1 (_unknown)", n, err)
	}
}

// A client can make a function fail at its own rate (an input the
// function refuses with plover_fail, a deadline it cannot meet): the
// failure lines are one a second per function, not one a request, and a
// client's own errors (4xx) none, as before.
func TestFailureLinesAreThrottledPerFunction(t *testing.T) {
	var logs bytes.Buffer
	d := New(Config{Runner: &refusals{}, Log: slog.New(slog.NewTextHandler(&logs, nil))})
	for range 100 {
		for _, f := range []struct {
			fn  string
			err error
		}{
			{"a", &errdefs.Error{Kind: errdefs.KindKernel, Msg: "a: bad input"}},
			{"b", &errdefs.Error{Kind: errdefs.KindTimeout, Msg: "b: past its deadline"}},
			{"c", &errdefs.Error{Kind: errdefs.KindRejected, Msg: "c refused its input"}},
		} {
			d.End(&Outcome{Transport: "http", Route: "r", Function: call.NameOf(f.fn), Req: &call.Request{}, Err: f.err})
		}
	}
	lines := strings.Split(strings.TrimSpace(logs.String()), "\n")
	if len(lines) != 2 || !strings.Contains(lines[0], "function=a status=500") || !strings.Contains(lines[1], "function=b status=504") {
		t.Fatalf("100 failures of a (500), b (504) and c (422): %d lines, want a's and b's first alone:\n%s", len(lines), logs.String())
	}
}

// A failure of a request naming a function no function can have (a gRPC
// model_name may be as long as the body limit) is logged with its name's
// head quoted, and the throttle keeps that as its key: whole, each such
// name stayed in the throttle's keys after its request (a review found
// it).
func TestAFailureOfALongNameIsLoggedBounded(t *testing.T) {
	var logs bytes.Buffer
	d := New(Config{Runner: &refusals{}, Metrics: reqmetrics.New(prometheus.NewRegistry()), Log: slog.New(slog.NewTextHandler(&logs, nil))})
	name := strings.Repeat("q", 1<<20)
	d.End(&Outcome{Transport: "grpc", Route: "r", Function: call.NameOf(name), Req: &call.Request{},
		Err: &errdefs.Error{Kind: errdefs.KindUnavailable, Msg: "store unavailable"}})
	if !strings.Contains(logs.String(), `msg="request failed"`) || logs.Len() > 1024 || !strings.Contains(logs.String(), strings.Repeat("q", 64)) {
		t.Errorf("log of a failure of a 1 MiB name: %d bytes, %.300q", logs.Len(), logs.String())
	}
}
