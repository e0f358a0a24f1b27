// Package pipedef checks pipeline definitions against the function records
// in a store: that every step's function (and pinned version) exists, that
// no pipeline reaches itself through the pipelines it names, that a
// deployer may invoke every function a pipeline runs; and it finds the
// pipelines that use a function. It reads records only, never bundles:
// records carry each version's kind and steps (api.Version).
package pipedef

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/api"
	"github.com/plover-run/plover/errdefs"
)

// MaxDepth bounds how deeply pipelines nest (a pipeline naming a pipeline
// is depth 2): a walk at request time stops there whatever the store says,
// so a cycle formed by a race between two nodes' deploys cannot recurse.
const MaxDepth = 8

// MaxFunctions bounds the function steps one request runs, nested
// pipelines and parallel steps multiplied out: each limit alone (32 steps,
// 16 in parallel, 8 levels) would let one request fan out to millions.
const MaxFunctions = 256

// Records reads function records by name (registry.Registry.Get).
type Records func(ctx context.Context, name string) (*api.Record, error)

// StepError is a definition a deploy refuses: the step (its JSON path in
// plover.json) and why. Store outages are returned as they come instead.
type StepError struct {
	Field  string // steps[1], steps[2].parallel[0]
	Reason string
	// Err is the cause, when one is worth keeping: errdefs.NoFunction for
	// a step naming no function (the front door's did-you-mean).
	Err error
}

func (e *StepError) Error() string { return e.Field + ": " + e.Reason }

func (e *StepError) Unwrap() error { return e.Err }

// ForbiddenError is a step whose function the deployer may not invoke.
type ForbiddenError struct{ StepError }

type authKey struct{}

// WithInvokeCheck returns ctx carrying allow, which Check asks for every
// function a pipeline names: deploying a pipeline must not give its
// deployer a way to run functions their token may not invoke.
func WithInvokeCheck(ctx context.Context, allow func(function string) error) context.Context {
	return context.WithValue(ctx, authKey{}, allow)
}

// Allowed asks ctx's invoke check (WithInvokeCheck) whether its caller may
// invoke function; nil when ctx carries none (a server without tokens, or
// a caller that is not a request's).
func Allowed(ctx context.Context, function string) error {
	if allow, _ := ctx.Value(authKey{}).(func(string) error); allow != nil {
		return allow(function)
	}
	return nil
}

// Check checks the pipeline name's steps against the records get reads:
// each function exists, a pinned version is one of its versions, nested
// pipelines (at their current or pinned versions) exist as well, no step
// leads back to name, and nesting stays within MaxDepth. isNotFound tells
// a missing record from a store failure, which Check returns unwrapped.
func Check(ctx context.Context, name string, steps []abi.Step, get Records, isNotFound func(error) bool) error {
	return check(ctx, name, steps, get, isNotFound, true)
}

// check is Check; auth asks ctx's invoke check of every function.
func check(ctx context.Context, name string, steps []abi.Step, get Records, isNotFound func(error) bool, auth bool) error {
	c := checker{ctx: ctx, get: get, notFound: isNotFound, recs: map[string]*api.Record{}, auth: auth}
	if err := c.steps(name, steps, []string{name}, "steps"); err != nil {
		return err
	}
	if c.functions > MaxFunctions {
		// The walk stops counting past the limit: "more than".
		return &StepError{"steps", fmt.Sprintf("the pipeline runs more than %d functions per request, nested pipelines and parallel steps included", MaxFunctions), nil}
	}
	return nil
}

type checker struct {
	ctx       context.Context
	get       Records
	notFound  func(error) bool
	recs      map[string]*api.Record // read once per check
	functions int                    // function steps a request would run
	auth      bool                   // ask Allowed of every function
}

// record reads name's record once per check.
func (c *checker) record(name string) (*api.Record, error) {
	if r, ok := c.recs[name]; ok {
		return r, nil
	}
	r, err := c.get(c.ctx, name)
	if err == nil {
		c.recs[name] = r
	}
	return r, err
}

func (c *checker) steps(top string, steps []abi.Step, path []string, field string) error {
	for i, s := range steps {
		f := fmt.Sprintf("%s[%d]", field, i)
		if s.Parallel != nil {
			if err := c.steps(top, s.Parallel, path, f+".parallel"); err != nil {
				return err
			}
			continue
		}
		if err := c.step(top, s, path, f); err != nil {
			return err
		}
	}
	return nil
}

func (c *checker) allowed(function string) error {
	if !c.auth {
		return nil
	}
	return Allowed(c.ctx, function)
}

// step checks one function step; field is where the top pipeline's
// plover.json names the step that leads here.
func (c *checker) step(top string, s abi.Step, path []string, field string) error {
	via := ""
	if len(path) > 1 {
		via = " (through " + strings.Join(path[1:], " -> ") + ")"
	}
	if slices.Contains(path, s.Function) {
		return &StepError{field, fmt.Sprintf("%s -> %s is a cycle: a pipeline may not run itself", strings.Join(path, " -> "), s.Function), nil}
	}
	if err := c.allowed(s.Function); err != nil {
		return &ForbiddenError{StepError{field, fmt.Sprintf("function %s%s: deploying a pipeline needs invoke on every function it runs: %v", s.Function, via, err), nil}}
	}
	if c.functions > MaxFunctions {
		return nil // reported once the walk ends; no need to read on
	}
	rec, err := c.record(s.Function)
	if err != nil && c.notFound(err) {
		return &StepError{field, fmt.Sprintf("function %q%s is not deployed: deploy it before the pipeline that runs it", s.Function, via),
			&errdefs.NoFunction{Name: s.Function, Err: err}}
	}
	if err != nil {
		return err
	}
	v, err := Pick(rec, s.Version)
	if err != nil {
		return &StepError{field, err.Error() + via, nil}
	}
	if v.Kind == abi.KindPipeline {
		// Depth counts pipelines (top is 1), as the runner does: a
		// function step of the deepest one adds no level.
		if len(path) >= MaxDepth {
			return &StepError{field, fmt.Sprintf("pipelines nest deeper than %d (%s -> %s)", MaxDepth, strings.Join(path, " -> "), s.Function), nil}
		}
		return c.steps(top, v.Steps, append(slices.Clip(path), s.Function), field+" -> "+s.Function+".steps")
	}
	c.functions++
	return nil
}

// Pick is the version of rec a step runs: the one ref names (an id or a
// prefix of 8 or more characters), or the current one for "".
func Pick(rec *api.Record, ref string) (api.Version, error) {
	if ref == "" {
		return rec.CurrentVersion()
	}
	switch v, n := rec.Find(ref); n {
	case 0:
		return api.Version{}, fmt.Errorf("function %s has no version %s (plover versions %s)", rec.Name, errdefs.QuoteName(ref), rec.Name)
	case 1:
		return v, nil
	}
	return api.Version{}, fmt.Errorf("version %s of %s is ambiguous: give more of its id (plover versions %s)", errdefs.QuoteName(ref), rec.Name, rec.Name)
}

// UsersError is a deploy that would break pipelines running the function
// it deploys: each such pipeline (Users, sorted) with what its check then
// says (Reasons, in the same order). A deploy checks only the pipeline it
// deploys (Check), so without this a nested pipeline deployed again with
// more steps or levels passes, and the pipelines running it fail at their
// requests instead.
type UsersError struct {
	Function string
	Users    []string
	Reasons  []string
	// Hidden counts the pipelines it breaks that its caller may not learn
	// of (WithSees), neither named nor their reasons said.
	Hidden int
}

func (e *UsersError) Error() string {
	var b strings.Builder
	for i, u := range e.Users[:min(len(e.Users), maxUsersSaid)] {
		if i > 0 {
			b.WriteString("; ")
		}
		fmt.Fprintf(&b, "pipeline %s runs %s, and with this version its requests would fail: %s", u, e.Function, e.Reasons[i])
	}
	if more := len(e.Users) - maxUsersSaid; more > 0 {
		fmt.Fprintf(&b, "; and %s", morePipelines(more))
	}
	if e.Hidden > 0 {
		if b.Len() > 0 {
			b.WriteString("; and ")
		}
		if e.Hidden == 1 {
			fmt.Fprintf(&b, "%s, which runs %s: with this version its requests would fail", Unseen(1), e.Function)
		} else {
			fmt.Fprintf(&b, "%s, which run %s: with this version their requests would fail", Unseen(e.Hidden), e.Function)
		}
	}
	return b.String()
}

// Landed is the warning of a change that landed past e, on a server or
// straight to the store, made how ("deployed with force", "rolled
// back").
func (e *UsersError) Landed(how string) string { return how + ": " + e.Error() }

// Say is pipelines named for a message: at most maxUsersSaid of them,
// and how many more.
func Say(pipelines []string) string {
	if len(pipelines) <= maxUsersSaid {
		return strings.Join(pipelines, ", ")
	}
	return strings.Join(pipelines[:maxUsersSaid], ", ") + " and " + morePipelines(len(pipelines)-maxUsersSaid)
}

func morePipelines(n int) string {
	if n == 1 {
		return "1 more pipeline"
	}
	return fmt.Sprintf("%d more pipelines", n)
}

// maxUsersSaid bounds the pipelines a UsersError's text names with their
// reasons: a function many pipelines nest would make an answer of any
// size.
const maxUsersSaid = 5

// CheckUsers checks, against recs (every record in the store), the
// pipeline versions requests reach by a name (served: each current one,
// and the newest with each label) that run name, as if steps were name's
// current version: one whose check passes now and would fail then (more
// functions per request than MaxFunctions, nesting past MaxDepth, a
// cycle) is a *UsersError, named "outer" or, not current, "outer
// (version 1)". A pipeline already failing its check (a step
// deleted with force) is left out: this deploy does not break it. Tokens
// are not asked: what the pipelines run was allowed to their deployers.
//
// label is the version's (a model repository's version folder: a step
// pinning it by its number runs the newest version so labelled); aside
// adds it beside the current version, which stays current.
func CheckUsers(ctx context.Context, recs []*api.Record, name string, steps []abi.Step, label string, aside bool) error {
	before := make(map[string]*api.Record, len(recs))
	after := make(map[string]*api.Record, len(recs)+1)
	for _, r := range recs {
		before[r.Name], after[r.Name] = r, r
	}
	// The version being deployed has no id yet: "" is never one a step
	// pins (Pick names a version by its id or an 8-character prefix).
	next := &api.Record{Name: name, Versions: []api.Version{{Kind: abi.KindPipeline, Steps: steps, Label: label}}}
	if r := before[name]; r != nil {
		next.Versions = append(slices.Clip(r.Versions), next.Versions...)
		if aside {
			next.Current = r.Current
		}
	}
	after[name] = next
	walk := users{recs: after, name: name, seen: map[string]walked{}}
	e := &UsersError{Function: name}
	sees := seesOf(ctx)
	hidden := map[string]bool{} // by record: a pipeline served by two labels is one
	byName := func(a, b *api.Record) int { return strings.Compare(a.Name, b.Name) }
	for _, r := range slices.SortedFunc(slices.Values(recs), byName) {
		if r.Name == name {
			continue
		}
		for _, v := range served(r) {
			if v.Kind != abi.KindPipeline || !walk.runs(v.Steps, MaxDepth) || checkIn(ctx, before, r.Name, v.Steps) != nil {
				continue
			}
			if err := checkIn(ctx, after, r.Name, v.Steps); err != nil {
				if sees != nil && !sees(r.Name) {
					hidden[r.Name] = true
					continue
				}
				e.Users = append(e.Users, said(r, v))
				e.Reasons = append(e.Reasons, reasonSeen(err.Error(), recs, sees))
			}
		}
	}
	e.Hidden = len(hidden)
	if len(e.Users) == 0 && e.Hidden == 0 {
		return nil
	}
	return e
}

// reasonSeen is reason, why a pipeline the caller sees would fail, where
// it names no pipeline or function the caller may not learn of; else a
// reason naming none. The reason names every pipeline on its path (a
// cycle, a nesting too deep), which may pass through another tenant's:
// any name of recs the caller does not see found in it (a name may be
// found inside another: then more is held back, never less) gives the
// bare reason.
func reasonSeen(reason string, recs []*api.Record, sees func(string) bool) string {
	if sees == nil {
		return reason
	}
	for _, r := range recs {
		if !sees(r.Name) && strings.Contains(reason, r.Name) {
			return "its steps would fail through a pipeline this token may not see (a cycle, nesting deeper than 8, or more than 256 functions a request)"
		}
	}
	return reason
}

// said names a version served: "outer" when current, "outer (version
// 1)" for the newest with label 1.
func said(r *api.Record, v api.Version) string {
	if v.ID == r.Current {
		return r.Name
	}
	return r.Name + " (version " + v.Label + ")"
}

// served is the versions of r that requests reach by a name: its current
// one, and the newest with each label (a model repository's version
// folder, served by its number) besides. Older ones, reached by their id
// alone, are rollback targets, which are not checked either.
func served(r *api.Record) []api.Version {
	var out []api.Version
	if v, err := r.CurrentVersion(); err == nil {
		out = append(out, v)
	}
	labels := map[string]bool{}
	for i := len(r.Versions) - 1; i >= 0; i-- {
		v := r.Versions[i]
		if v.Label == "" || labels[v.Label] {
			continue
		}
		labels[v.Label] = true
		if v.ID != r.Current {
			out = append(out, v)
		}
	}
	return out
}

var errNoRecord = errors.New("no record")

// checkIn is check against the records in recs, without tokens.
func checkIn(ctx context.Context, recs map[string]*api.Record, name string, steps []abi.Step) error {
	get := func(_ context.Context, n string) (*api.Record, error) {
		if r := recs[n]; r != nil {
			return r, nil
		}
		return nil, errNoRecord
	}
	return check(ctx, name, steps, get, func(err error) bool { return errors.Is(err, errNoRecord) }, false)
}

// UsersOf names the pipeline versions among recs that requests reach by
// a name (served: each current one, and the newest with each label, named
// as in CheckUsers) and that run the function name, sorted: as a step, or
// through a nested pipeline's steps at the version the step pins (an
// older one, whose steps no current version names) or its current one.
func UsersOf(recs []*api.Record, name string) []string {
	out, _ := usersOf(recs, name, nil)
	return out
}

// UsersSeen is UsersOf less the pipelines ctx's caller may not learn of
// (WithSees), which it counts in hidden.
func UsersSeen(ctx context.Context, recs []*api.Record, name string) (out []string, hidden int) {
	return usersOf(recs, name, seesOf(ctx))
}

func usersOf(recs []*api.Record, name string, sees func(string) bool) (out []string, hidden int) {
	u := users{recs: make(map[string]*api.Record, len(recs)), name: name, seen: map[string]walked{}}
	for _, r := range recs {
		u.recs[r.Name] = r
	}
	for _, r := range recs {
		if r.Name == name {
			continue
		}
		unseen := false
		for _, v := range served(r) {
			switch {
			case v.Kind != abi.KindPipeline || !u.runs(v.Steps, MaxDepth):
			case sees != nil && !sees(r.Name):
				unseen = true // counted once a record, however many labels serve it
			default:
				out = append(out, said(r, v))
			}
		}
		if unseen {
			hidden++
		}
	}
	slices.Sort(out)
	return out, hidden
}

type seesKey struct{}

// WithSees returns ctx carrying sees, which names the pipelines its caller
// may learn of (a token's globs: gate.View.Sees): a refusal or warning
// that lists the pipelines running a function (UsersSeen, CheckUsers)
// names those alone and counts the others, which may be another tenant's.
func WithSees(ctx context.Context, sees func(name string) bool) context.Context {
	return context.WithValue(ctx, seesKey{}, sees)
}

// seesOf is ctx's WithSees; nil (every name) where it has none.
func seesOf(ctx context.Context) func(string) bool {
	sees, _ := ctx.Value(seesKey{}).(func(string) bool)
	return sees
}

// Unseen says n pipelines the caller may not learn of ("" for none).
func Unseen(n int) string {
	switch n {
	case 0:
		return ""
	case 1:
		return "1 pipeline this token may not see"
	}
	return fmt.Sprintf("%d pipelines this token may not see", n)
}

// users is UsersOf's walk. seen holds the nested pipeline versions
// walked, by name and version id, with whether they run name and the
// depth looked: a version is walked once however many pipelines nest it,
// unless met again with more depth left than a walk that found nothing.
type users struct {
	recs map[string]*api.Record
	name string
	seen map[string]walked
}

// walked is a nested version's walk: found name within depth levels.
type walked struct {
	found bool
	depth int
}

// runs reports whether steps run u.name, looking depth levels of nested
// pipelines deep (deploys refuse deeper).
func (u *users) runs(steps []abi.Step, depth int) bool {
	for _, s := range steps {
		if s.Parallel != nil {
			if u.runs(s.Parallel, depth) {
				return true
			}
			continue
		}
		if s.Function == u.name {
			return true
		}
		r := u.recs[s.Function]
		if r == nil || depth <= 1 {
			continue
		}
		v, err := Pick(r, s.Version)
		if err != nil || v.Kind != abi.KindPipeline {
			continue
		}
		key := r.Name + "@" + v.ID
		w, ok := u.seen[key]
		if !ok || !w.found && w.depth < depth-1 {
			// A cycle, which deploys refuse, ends here: the walk under way
			// counts as one with all the depth.
			u.seen[key] = walked{depth: MaxDepth}
			w = walked{u.runs(v.Steps, depth-1), depth - 1}
			u.seen[key] = w
		}
		if w.found {
			return true
		}
	}
	return false
}
