package pipedef

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/api"
)

var errMissing = errors.New("no such function")

// store is records by name, each with one version (or the versions given).
type store map[string]*api.Record

func (s store) get(_ context.Context, name string) (*api.Record, error) {
	if name == "down" {
		return nil, errors.New("store unreachable")
	}
	r, ok := s[name]
	if !ok {
		return nil, fmt.Errorf("%s: %w", name, errMissing)
	}
	return r, nil
}

func fn(name string, ids ...string) *api.Record {
	if ids == nil {
		ids = []string{name + "-0000-0000"}
	}
	r := &api.Record{Name: name, Current: ids[len(ids)-1]}
	for _, id := range ids {
		r.Versions = append(r.Versions, api.Version{ID: id})
	}
	return r
}

func pipe(name string, steps ...abi.Step) *api.Record {
	id := name + "-pipe-0001"
	return &api.Record{Name: name, Current: id, Versions: []api.Version{{ID: id, Kind: abi.KindPipeline, Steps: steps}}}
}

func s(name string) abi.Step { return abi.Step{Function: name} }

func TestCheck(t *testing.T) {
	recs := store{
		"a":     fn("a", "aaaaaaaa-1111", "aaaaaaaa-2222", "bbbbbbbb-3333"),
		"b":     fn("b"),
		"inner": pipe("inner", s("a"), s("b")),
		"outer": pipe("outer", s("inner")),
		"loop":  pipe("loop", s("top")), // a record naming the pipeline being deployed
	}
	isMissing := func(err error) bool { return errors.Is(err, errMissing) }
	for _, tc := range []struct {
		name  string
		steps []abi.Step
		allow func(string) error
		want  string // "" ok; else the error contains it
		field string
	}{
		{"plain", []abi.Step{s("a"), s("b")}, nil, "", ""},
		{"nested", []abi.Step{s("outer"), {Parallel: []abi.Step{s("a"), s("inner")}}}, nil, "", ""},
		{"missing", []abi.Step{s("a"), s("nope")}, nil, `function "nope" is not deployed`, "steps[1]"},
		{"missing inside parallel", []abi.Step{{Parallel: []abi.Step{s("a"), s("nope")}}}, nil, "not deployed", "steps[0].parallel[1]"},
		{"pinned", []abi.Step{{Function: "a", Version: "bbbbbbbb"}}, nil, "", ""},
		{"pinned missing", []abi.Step{{Function: "a", Version: "cccccccc"}}, nil, `has no version "cccccccc"`, "steps[0]"},
		{"pinned ambiguous", []abi.Step{{Function: "a", Version: "aaaaaaaa"}}, nil, "ambiguous", "steps[0]"},
		{"cycle through a record", []abi.Step{s("b"), s("loop")}, nil, "top -> loop -> top is a cycle", "steps[1] -> loop.steps[0]"},
		{"store down", []abi.Step{s("down")}, nil, "store unreachable", ""},
		{"forbidden nested", []abi.Step{s("outer")}, func(f string) error {
			if f == "b" {
				return errors.New("token lacks invoke on b")
			}
			return nil
		}, "function b (through outer -> inner)", "steps[0] -> outer.steps[0] -> inner.steps[1]"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			if tc.allow != nil {
				ctx = WithInvokeCheck(ctx, tc.allow)
			}
			err := Check(ctx, "top", tc.steps, recs.get, isMissing)
			if tc.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want %q", err, tc.want)
			}
			var se *StepError
			var fe *ForbiddenError
			forbidden := errors.As(err, &fe)
			if forbidden {
				se = &fe.StepError
			} else {
				errors.As(err, &se)
			}
			if forbidden != (tc.allow != nil) {
				t.Fatalf("ForbiddenError %v for %v", forbidden, err)
			}
			if tc.field != "" && (se == nil || se.Field != tc.field) {
				t.Fatalf("field of %v: want %s", err, tc.field)
			}
		})
	}
}

// Depth counts pipelines, top included, as the runner does: 8 levels
// deploy, 9 do not.
func TestCheckDepth(t *testing.T) {
	for _, tc := range []struct {
		levels int
		ok     bool
	}{{MaxDepth - 1, true}, {MaxDepth, true}, {MaxDepth + 1, false}} {
		recs := store{"f": fn("f")}
		prev := "f"
		for i := 0; i < tc.levels-1; i++ { // top is one level
			name := fmt.Sprintf("p%d", i)
			recs[name] = pipe(name, s(prev))
			prev = name
		}
		err := Check(context.Background(), "top", []abi.Step{s(prev)}, recs.get, func(err error) bool { return errors.Is(err, errMissing) })
		if tc.ok && err != nil {
			t.Errorf("%d levels: %v", tc.levels, err)
		}
		if !tc.ok && (err == nil || !strings.Contains(err.Error(), "nest deeper than")) {
			t.Errorf("%d levels: err = %v, want nest deeper than", tc.levels, err)
		}
	}
}

func TestUsersOf(t *testing.T) {
	old := pipe("old", s("a"))
	old.Versions = append([]api.Version{{ID: "x", Kind: abi.KindPipeline, Steps: []abi.Step{s("b")}}}, old.Versions...)
	labelled := pipe("repo", s("a"))
	labelled.Versions[0].Label = "2"
	labelled.Versions = append([]api.Version{{ID: "y", Label: "1", Kind: abi.KindPipeline, Steps: []abi.Step{s("b")}}}, labelled.Versions...)
	recs := []*api.Record{
		pipe("p2", abi.Step{Parallel: []abi.Step{s("b"), s("c")}}),
		pipe("p1", s("a"), s("b")),
		fn("b"),
		old, // names b only in a version that is not current
		pipe("p3", abi.Step{Function: "old", Version: "x"}), // runs b through old's version x
		pipe("p4", s("old")), // old's current version: a, not b
		labelled,             // runs b in version folder 1, served by its number
	}
	if got := strings.Join(UsersOf(recs, "b"), ","); got != "p1,p2,p3,repo (version 1)" {
		t.Fatalf("UsersOf(b) = %s", got)
	}
	if got := strings.Join(UsersOf(recs, "a"), ","); got != "old,p1,p4,repo" {
		t.Fatalf("UsersOf(a) = %s", got)
	}
	if got := UsersOf(recs, "z"); got != nil {
		t.Fatalf("UsersOf(z) = %v", got)
	}
	// A caller that may learn of p* alone is told of the others by count.
	ctx := WithSees(context.Background(), func(name string) bool { return strings.HasPrefix(name, "p") })
	if got, hidden := UsersSeen(ctx, recs, "b"); strings.Join(got, ",") != "p1,p2,p3" || hidden != 1 {
		t.Fatalf("UsersSeen(b) for p* = %q and %d hidden, want p1,p2,p3 and 1", got, hidden)
	}
	if got, hidden := UsersSeen(context.Background(), recs, "b"); len(got) != 4 || hidden != 0 {
		t.Fatalf("UsersSeen(b) without a view = %q and %d hidden, want all 4", got, hidden)
	}
	for _, tc := range []struct {
		e    UsersError
		want string
	}{
		{UsersError{Function: "f", Users: []string{"p"}, Reasons: []string{"r"}, Hidden: 2}, "pipeline p runs f, and with this version its requests would fail: r; and 2 pipelines this token may not see, which run f: with this version their requests would fail"},
		{UsersError{Function: "f", Hidden: 1}, "1 pipeline this token may not see, which runs f: with this version its requests would fail"},
	} {
		if got := tc.e.Error(); got != tc.want {
			t.Errorf("%+v: %q, want %q", tc.e, got, tc.want)
		}
	}
}

// A nested pipeline first met at the end of the depth looked (through a
// pipeline nesting too deep, records changed since its deploy) is walked
// again where another pipeline reaches it with depth to spare: its first,
// cut-short walk was kept as "does not run it", and UsersOf(f) missed
// p2 -> x -> y -> f (so rm without --force was not refused for it).
func TestUsersOfWalksANestedPipelineAgainWithMoreDepth(t *testing.T) {
	recs := []*api.Record{fn("f"), pipe("y", s("f")), pipe("x", s("y"))}
	prev := "x"
	for i := MaxDepth - 2; i >= 1; i-- {
		name := fmt.Sprintf("l%d", i)
		recs = append(recs, pipe(name, s(prev)))
		prev = name
	}
	// p1 first: its walk meets x with one level left.
	recs = append([]*api.Record{pipe("p1", s(prev))}, append(recs, pipe("p2", s("x")))...)
	got := strings.Join(UsersOf(recs, "f"), ",")
	if !strings.Contains(got, "p2") {
		t.Errorf("UsersOf(f) = %s, want p2 among them", got)
	}
}

// A deploy checks the pipelines that run what it deploys: a nested
// pipeline deployed again with more steps or levels names each pipeline
// it would break, and only those its version breaks.
func TestCheckUsers(t *testing.T) {
	times := func(n int, st abi.Step) []abi.Step {
		out := make([]abi.Step, n)
		for i := range out {
			out[i] = st
		}
		return out
	}
	chain := []*api.Record{fn("f")} // d1 -> d2 -> ... -> d8 -> f: depth 8
	for i := 8; i >= 1; i-- {
		next := "f"
		if i < 8 {
			next = fmt.Sprintf("d%d", i+1)
		}
		chain = append(chain, pipe(fmt.Sprintf("d%d", i), s(next)))
	}
	inner := pipe("inner", times(16, s("f"))...)
	inner.Versions = append([]api.Version{{ID: "11111111-old", Kind: abi.KindPipeline, Steps: []abi.Step{s("f")}}}, inner.Versions...)
	recs := append(chain,
		inner,
		pipe("outer", times(16, s("inner"))...), // 256 functions
		pipe("top", s("outer")),                 // 256 through outer
		pipe("pinned", times(16, abi.Step{Function: "inner", Version: "11111111"})...), // 16
		pipe("broken", s("inner"), s("gone")),                                          // already failing
		pipe("par", abi.Step{Parallel: []abi.Step{s("inner"), s("f")}}),                // 17
	)
	for _, tc := range []struct {
		name  string
		steps []abi.Step
		users []string
		want  string
	}{
		{"inner", times(16, s("f")), nil, ""},
		{"inner", times(15, s("f")), nil, ""},
		{"inner", times(17, s("f")), []string{"outer", "top"}, "the pipeline runs more than 256 functions per request"},
		{"d8", []abi.Step{s("inner")}, []string{"d1"}, "pipelines nest deeper than 8"},
		{"d2", []abi.Step{s("inner")}, nil, ""},
		{"f", []abi.Step{s("d3")}, []string{"d1", "d2", "d3", "d4", "d5", "d6", "d7", "d8", "inner", "outer", "par", "pinned", "top"}, "is a cycle"},
		{"nobody", times(17, s("f")), nil, ""},
	} {
		t.Run(fmt.Sprintf("%s-%d", tc.name, len(tc.steps)), func(t *testing.T) {
			err := CheckUsers(context.Background(), recs, tc.name, tc.steps, "", false)
			if tc.users == nil {
				if err != nil {
					t.Fatalf("CheckUsers: %v, want nil", err)
				}
				return
			}
			var ue *UsersError
			if !errors.As(err, &ue) {
				t.Fatalf("CheckUsers: %v, want a *UsersError", err)
			}
			if fmt.Sprint(ue.Users) != fmt.Sprint(tc.users) {
				t.Errorf("users %v, want %v", ue.Users, tc.users)
			}
			if !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "pipeline "+tc.users[0]+" runs "+tc.name) {
				t.Errorf("error %q, want it to name %s and say %q", err, tc.users[0], tc.want)
			}
		})
	}
}

// A step pinning a version by its label (a model repository's version
// folder) runs the newest version so labelled: a version deployed again
// under that label, beside the current one or as it, is checked against
// the pipelines pinning it.
func TestCheckUsersFollowsALabel(t *testing.T) {
	inner := pipe("inner", s("f"))
	inner.Versions = append([]api.Version{{ID: "22222222-two", Label: "2", Kind: abi.KindPipeline, Steps: []abi.Step{s("f")}}}, inner.Versions...)
	outer := make([]abi.Step, 16)
	for i := range outer {
		outer[i] = abi.Step{Function: "inner", Version: "2"}
	}
	recs := []*api.Record{fn("f"), inner, pipe("outer", outer...)}
	seventeen := make([]abi.Step, 17)
	for i := range seventeen {
		seventeen[i] = s("f")
	}
	for _, tc := range []struct {
		label string
		aside bool
		users []string
	}{
		{"2", true, []string{"outer"}},
		{"2", false, []string{"outer"}},
		{"3", true, nil},
		{"", false, nil}, // current, unlabelled: outer pins 2
	} {
		err := CheckUsers(context.Background(), recs, "inner", seventeen, tc.label, tc.aside)
		var ue *UsersError
		if errors.As(err, &ue) != (tc.users != nil) || ue != nil && fmt.Sprint(ue.Users) != fmt.Sprint(tc.users) {
			t.Errorf("label %q aside %v: %v, want users %v", tc.label, tc.aside, err, tc.users)
		}
	}
}

// A pipeline's version that is not current but served by its label (a
// model repository's version folder, /v2/models/outer/versions/1) is
// checked as the current one is: outer/1 runs 16 x inner, and inner with
// 17 steps would take it to 272. It was left out (only current versions
// were), and its requests failed 500 from the deploy on. A version reached
// by its id alone (a rollback target) is not checked.
func TestCheckUsersSeesLabelledVersions(t *testing.T) {
	sixteen := make([]abi.Step, 16)
	for i := range sixteen {
		sixteen[i] = s("inner")
	}
	seventeen := make([]abi.Step, 17)
	for i := range seventeen {
		seventeen[i] = s("f")
	}
	for _, tc := range []struct {
		label string
		users []string
	}{
		{"1", []string{"outer (version 1)"}},
		{"", nil},
	} {
		outer := pipe("outer", s("inner"))
		outer.Versions = append([]api.Version{{ID: "33333333-one", Label: tc.label, Kind: abi.KindPipeline, Steps: sixteen}}, outer.Versions...)
		recs := []*api.Record{fn("f"), pipe("inner", seventeen[:16]...), outer} // inner: 16 x f
		err := CheckUsers(context.Background(), recs, "inner", seventeen, "", false)
		var ue *UsersError
		if errors.As(err, &ue) != (tc.users != nil) || ue != nil && fmt.Sprint(ue.Users) != fmt.Sprint(tc.users) {
			t.Errorf("outer's older version labelled %q: %v, want users %v", tc.label, err, tc.users)
		}
	}
}

// A UsersError names at most maxUsersSaid pipelines with their reasons,
// and counts the rest.
func TestUsersErrorIsBounded(t *testing.T) {
	e := &UsersError{Function: "f"}
	for i := range maxUsersSaid + 3 {
		e.Users = append(e.Users, fmt.Sprintf("p%d", i))
		e.Reasons = append(e.Reasons, "steps: too many")
	}
	msg := e.Error()
	if strings.Count(msg, "too many") != maxUsersSaid || !strings.HasSuffix(msg, "; and 3 more pipelines") {
		t.Errorf("error %q", msg)
	}
	for _, tc := range []struct {
		n    int
		want string
	}{{1, "p0"}, {5, "p0, p1, p2, p3, p4"}, {6, "p0, p1, p2, p3, p4 and 1 more pipeline"}, {8, "p0, p1, p2, p3, p4 and 3 more pipelines"}} {
		if got := Say(e.Users[:tc.n]); got != tc.want {
			t.Errorf("Say(%d pipelines) = %q, want %q", tc.n, got, tc.want)
		}
	}
}

// A caller that may learn of a-* alone (WithSees) is told the pipelines
// a change breaks that it sees, without a reason naming another's on
// their path, and a count of the others: a cycle through b-mid was told
// by name to a deploy token of a-*.
func TestCheckUsersNamesOnlyWhatTheCallerSees(t *testing.T) {
	recs := []*api.Record{
		fn("a-vec"),
		pipe("b-mid", s("a-vec")),
		pipe("a-pipe", s("b-mid")),
		pipe("b-top", s("a-vec")),
	}
	ctx := WithSees(context.Background(), func(name string) bool { return strings.HasPrefix(name, "a-") })
	err := CheckUsers(ctx, recs, "a-vec", []abi.Step{s("a-pipe")}, "", false) // a cycle for every user
	var ue *UsersError
	if !errors.As(err, &ue) {
		t.Fatalf("CheckUsers: %v, want a *UsersError", err)
	}
	if fmt.Sprint(ue.Users) != "[a-pipe]" || ue.Hidden != 2 || strings.Contains(ue.Error(), "b-") {
		t.Errorf("for a-*: users %v, %d hidden, %q; want a-pipe, 2 hidden, no b- name", ue.Users, ue.Hidden, ue.Error())
	}
	err = CheckUsers(context.Background(), recs, "a-vec", []abi.Step{s("a-pipe")}, "", false)
	if !errors.As(err, &ue) || fmt.Sprint(ue.Users) != "[a-pipe b-mid b-top]" || ue.Hidden != 0 || !strings.Contains(ue.Error(), "b-mid") {
		t.Errorf("without a view: %v, want all three named", err)
	}
}
