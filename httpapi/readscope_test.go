package httpapi_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/plover-run/plover/api"
	"github.com/plover-run/plover/auth"
	"github.com/plover-run/plover/bundle"
	"github.com/plover-run/plover/engine"
	"github.com/plover-run/plover/httpapi"
	"github.com/plover-run/plover/internal/testkit"
)

// readScope is a node of two tenants: a-vec (deployed by adeploy) and
// a-pipe, a pipeline running a-vec and b-secret, another tenant's, which
// an admin offered through it; b-secret (deployed by bob) and b-pipe.
// Tokens: ops (admin), star (read, *), aread (read, a-*), adeploy (deploy,
// a-*: deploy implies read) and bob (deploy and invoke, b-*, a burst of
// one request: its second is refused 429, a series labelled bob).
type readScope struct {
	url  string
	toks map[string]string
}

func newReadScope(t *testing.T) readScope {
	t.Helper()
	e := testkit.Engine(t, engine.Config{})
	tab, toks := newLimitedTokens(t,
		limitedSpec{tokenSpec{"ops", auth.Admin, nil}, auth.Limits{}},
		limitedSpec{tokenSpec{"star", auth.Read, []string{"*"}}, auth.Limits{}},
		limitedSpec{tokenSpec{"aread", auth.Read, []string{"a-*"}}, auth.Limits{}},
		limitedSpec{tokenSpec{"adeploy", auth.Deploy, []string{"a-*"}}, auth.Limits{}},
		limitedSpec{tokenSpec{"bob", auth.Deploy | auth.Invoke, []string{"b-*"}}, auth.Limits{Rate: 0.001, Burst: 1}})
	// A series of each token, as the gate's plover_token_limited_total:
	// aread's is its own.
	reg := prometheus.NewRegistry()
	byToken := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "test_by_token_total", Help: "A series by token."}, []string{"token"})
	reg.MustRegister(byToken)
	byToken.WithLabelValues("aread").Inc()
	byToken.WithLabelValues("bob").Inc()
	url := testkit.ServeTokens(t, e, tab, httpapi.Options{Registry: reg, Repository: index{"a-vec", "b-secret"}})
	for _, d := range []struct{ token, name string }{{"adeploy", "a-vec"}, {"bob", "b-secret"}} {
		b, _, _, err := bundle.PackBytes(testkit.BundleDir(t, testkit.Manifest(d.name), nil))
		if err != nil {
			t.Fatal(err)
		}
		if code, out := tenantDo(t, "PUT", url+"/v1/functions/"+d.name, toks[d.token], b); code != 201 {
			t.Fatalf("deploy %s as %s: %d %s", d.name, d.token, code, out)
		}
	}
	if code, out := postAs(t, url+"/v1/functions/b-secret/invoke", toks["bob"], "application/octet-stream", "abcdefgh"); code != 429 {
		t.Fatalf("bob past its burst: %d %s, want 429", code, out)
	}
	testkit.Deploy(t, e, testkit.PipelineDir(t, "a-pipe", "a-vec", "b-secret"))
	testkit.Deploy(t, e, testkit.PipelineDir(t, "b-pipe", "b-secret"))
	for _, fn := range []string{"a-vec", "a-pipe", "b-pipe"} { // series of each
		if code, out := postAs(t, url+"/v1/functions/"+fn+"/invoke", toks["ops"], "application/octet-stream", "abcdefgh"); code != 200 {
			t.Fatalf("invoke %s: %d %s", fn, code, out)
		}
	}
	return readScope{url, toks}
}

// index is a model repository of the models named.
type index []string

func (ix index) Index(context.Context, bool) []api.RepositoryModel {
	var ms []api.RepositoryModel
	for _, n := range ix {
		ms = append(ms, api.RepositoryModel{Name: n, Version: "1", State: "READY"})
	}
	return ms
}
func (index) Load(context.Context, string) error   { return nil }
func (index) Unload(context.Context, string) error { return nil }

// A token of read (or deploy) limited to a-* reads a name outside its
// globs as a name of no function: the same status and message (but for
// the name it quotes) as for a name no function has, on every read that
// names one; before, it read b-secret's details, its versions and its
// model metadata as any token. A token that covers every function reads
// them.
func TestAGlobLimitedTokenReadsAnotherTenantsNameAsUnknown(t *testing.T) {
	rs := newReadScope(t)
	routes := []string{"/v1/functions/%s", "/v1/functions/%s/versions", "/v2/models/%s", "/v2/models/%s/ready", "/v2/models/%s/versions/1"}
	for _, tc := range []struct {
		token, hidden, unknown string // unknown: a name of no function, as long
	}{
		{"aread", "b-secret", "b-secrex"},
		{"aread", "b-pipe", "b-pipx"},
		{"adeploy", "b-secret", "b-secrex"},
	} {
		for _, route := range routes {
			t.Run(tc.token+" "+fmt.Sprintf(route, tc.hidden), func(t *testing.T) {
				code, out := tenantDo(t, "GET", rs.url+fmt.Sprintf(route, tc.hidden), rs.toks[tc.token], nil)
				ucode, uout := tenantDo(t, "GET", rs.url+fmt.Sprintf(route, tc.unknown), rs.toks[tc.token], nil)
				if want := strings.ReplaceAll(string(uout), tc.unknown, tc.hidden); code != 404 || ucode != 404 || string(out) != want {
					t.Fatalf("%d %s\nwant the unknown name's %d %s", code, out, ucode, want)
				}
			})
		}
	}
	for _, tc := range []struct{ token, path string }{
		{"aread", "/v1/functions/a-vec"}, {"aread", "/v1/functions/a-pipe/versions"}, {"aread", "/v2/models/a-vec/ready"},
		{"star", "/v1/functions/b-secret"}, {"star", "/v2/models/b-secret"}, {"ops", "/v1/functions/b-pipe/versions"},
	} {
		if code, out := tenantDo(t, "GET", rs.url+tc.path, rs.toks[tc.token], nil); code != 200 {
			t.Errorf("%s %s: %d %s, want 200", tc.token, tc.path, code, out)
		}
	}
}

// The listing and the repository's index show a token limited to a-* its
// functions alone, a-pipe's step of b-secret without its name; a version's
// tenant (its deployer's token) is shown only to a token that covers
// every function. Before, aread listed b-secret and b-pipe, read a-pipe's
// steps whole, and read adeploy's name on a-vec's version.
func TestAGlobLimitedTokenListsOnlyItsFunctions(t *testing.T) {
	rs := newReadScope(t)
	for _, tc := range []struct {
		token  string
		names  []string
		steps  string // a-pipe's
		tenant string // a-vec's version's
	}{
		{"aread", []string{"a-pipe", "a-vec"}, `["a-vec",""]`, ""},
		{"adeploy", []string{"a-pipe", "a-vec"}, `["a-vec",""]`, ""},
		{"star", []string{"a-pipe", "a-vec", "b-pipe", "b-secret"}, `["a-vec","b-secret"]`, "adeploy"},
		{"ops", []string{"a-pipe", "a-vec", "b-pipe", "b-secret"}, `["a-vec","b-secret"]`, "adeploy"},
	} {
		t.Run(tc.token, func(t *testing.T) {
			var list struct {
				Functions []struct {
					Name  string          `json:"name"`
					Steps json.RawMessage `json:"steps"`
				} `json:"functions"`
			}
			readJSON(t, rs, tc.token, "GET", "/v1/functions", &list)
			var names []string
			for _, f := range list.Functions {
				names = append(names, f.Name)
				if f.Name == "a-pipe" && string(f.Steps) != tc.steps {
					t.Errorf("listing: a-pipe's steps %s, want %s", f.Steps, tc.steps)
				}
			}
			if !slices.Equal(names, tc.names) {
				t.Errorf("listing: %q, want %q", names, tc.names)
			}
			var one struct{ Steps json.RawMessage }
			if readJSON(t, rs, tc.token, "GET", "/v1/functions/a-pipe", &one); string(one.Steps) != tc.steps {
				t.Errorf("a-pipe: steps %s, want %s", one.Steps, tc.steps)
			}
			var rec api.Record
			if readJSON(t, rs, tc.token, "GET", "/v1/functions/a-vec/versions", &rec); rec.Versions[0].Tenant != tc.tenant {
				t.Errorf("a-vec's version: tenant %q, want %q", rec.Versions[0].Tenant, tc.tenant)
			}
			var models []api.RepositoryModel
			readJSON(t, rs, tc.token, "POST", "/v2/repository/index", &models)
			var indexed []string
			for _, m := range models {
				indexed = append(indexed, m.Name)
			}
			if want := slices.DeleteFunc(slices.Clone(tc.names), func(n string) bool { return strings.HasSuffix(n, "-pipe") }); !slices.Equal(indexed, want) {
				t.Errorf("repository index: %q, want %q", indexed, want)
			}
		})
	}
}

func readJSON(t *testing.T, rs readScope, token, method, path string, v any) {
	t.Helper()
	code, out := tenantDo(t, method, rs.url+path, rs.toks[token], nil)
	if code != 200 {
		t.Fatalf("%s %s: %d %s", method, path, code, out)
	}
	if err := json.Unmarshal(out, v); err != nil {
		t.Fatalf("%s %s: %v in %s", method, path, err, out)
	}
}

// /metrics shows a token limited to a-* the series of its functions and
// pipelines (a-pipe's step of b-secret left out), its own token's, and the
// node's; not b-secret's, b-pipe's nor bob's. Each family it shows has
// its HELP, its TYPE and a series, a histogram each of its series' buckets,
// sum and count. Before, aread read every tenant's series and bob's name.
func TestAGlobLimitedTokenScrapesOnlyItsSeries(t *testing.T) {
	rs := newReadScope(t)
	for _, tc := range []struct {
		token       string
		want, never []string
	}{
		{"aread",
			[]string{`plover_requests_total{code="200",function="a-vec"}`, `plover_request_duration_seconds_bucket{function="a-vec",phase="total",le="+Inf"}`,
				`plover_request_duration_seconds_sum{function="a-vec",phase="total"}`, `plover_request_duration_seconds_count{function="a-vec",phase="total"}`,
				`plover_pipeline_step_seconds_count{function="a-vec",pipeline="a-pipe",step="0"}`,
				`test_by_token_total{token="aread"}`, `plover_auth_failures_total{reason="forbidden"}`},
			[]string{"b-secret", "b-pipe", `"bob"`}},
		{"ops",
			[]string{`plover_pipeline_step_seconds_count{function="b-secret",pipeline="a-pipe",step="1"}`, `plover_requests_total{code="200",function="b-pipe"}`,
				`plover_token_limited_total{limit="rate",token="bob"}`, `test_by_token_total{token="bob"}`},
			nil},
	} {
		t.Run(tc.token, func(t *testing.T) {
			code, out := tenantDo(t, "GET", rs.url+"/metrics", rs.toks[tc.token], nil)
			if code != 200 {
				t.Fatalf("%d %s", code, out)
			}
			text := string(out)
			for _, w := range tc.want {
				if !strings.Contains(text, "\n"+w+" ") {
					t.Errorf("no %s", w)
				}
			}
			for _, n := range tc.never {
				if strings.Contains(text, n) {
					t.Errorf("shows %s", n)
				}
			}
			checkFamilies(t, text)
		})
	}
}

// checkFamilies checks that each family of an exposition has its HELP,
// its TYPE and a sample, and that each histogram series has its +Inf
// bucket, sum and count.
func checkFamilies(t *testing.T, text string) {
	t.Helper()
	var family, kind string
	samples := 0
	end := func() {
		if family != "" && samples == 0 {
			t.Errorf("family %s: no sample", family)
		}
	}
	for line := range strings.Lines(text) {
		line = strings.TrimSuffix(line, "\n")
		switch f := strings.Fields(line); {
		case len(f) >= 3 && f[0] == "#" && f[1] == "HELP":
			end()
			family, kind, samples = f[2], "", 0
		case len(f) == 4 && f[0] == "#" && f[1] == "TYPE":
			if f[2] != family {
				t.Errorf("TYPE of %s after HELP of %s", f[2], family)
			}
			kind = f[3]
		case len(f) >= 2 && strings.HasPrefix(line, family):
			samples++
			if kind == "histogram" && strings.HasPrefix(line, family+"_count{") {
				series := strings.TrimSuffix(strings.TrimPrefix(f[0], family+"_count{"), "}")
				for _, w := range []string{family + "_sum{" + series + "}", family + `_bucket{` + series + `,le="+Inf"}`} {
					if !strings.Contains(text, "\n"+w+" ") {
						t.Errorf("histogram series %s: no %s", f[0], w)
					}
				}
			}
		default:
			t.Errorf("line %q outside its family %s", line, family)
		}
	}
	end()
}

// A pipeline whose step does not resolve (its function deleted with
// force) answers its metadata 503 naming the step, to a token that sees
// the step's function; to one that does not, without its name, which may
// be another tenant's. Before, aread read "step 1 (b-secret): function
// "b-secret" not found" in a-pipe's 503 (a review's probe).
func TestAPipelinesUnresolvedStepIsNotNamedToATokenThatDoesNotSeeIt(t *testing.T) {
	rs := newReadScope(t)
	if code, out := tenantDo(t, "DELETE", rs.url+"/v1/functions/b-secret?force=true", rs.toks["ops"], nil); code/100 != 2 {
		t.Fatalf("delete b-secret with force: %d %s", code, out)
	}
	for _, tc := range []struct {
		token string
		named bool
	}{{"aread", false}, {"adeploy", false}, {"star", true}, {"ops", true}} {
		code, out := tenantDo(t, "GET", rs.url+"/v2/models/a-pipe", rs.toks[tc.token], nil)
		if code != 503 || strings.Contains(string(out), "b-secret") != tc.named {
			t.Errorf("%s: a-pipe's metadata with its step gone: %d %s; want 503, the step named: %v", tc.token, code, out, tc.named)
		}
	}
}

// A delete refused because pipelines run the function (409) names those
// the token sees, and counts the others: a deploy token of a-* read the
// name of bob's pipeline running a-vec in it (a review's probe).
func TestADeletesConflictNamesOnlyThePipelinesTheTokenSees(t *testing.T) {
	rs := newReadScope(t)
	b, _, _, err := bundle.PackBytes(testkit.PipelineDir(t, "b-uses-a", "a-vec"))
	if err != nil {
		t.Fatal(err)
	}
	if code, out := tenantDo(t, "PUT", rs.url+"/v1/functions/b-uses-a", rs.toks["ops"], b); code != 201 {
		t.Fatalf("deploy b-uses-a: %d %s", code, out)
	}
	for _, tc := range []struct {
		token, want string
		named       bool
	}{
		{"adeploy", "function a-vec is a step of pipeline a-pipe and 1 pipeline this token may not see", false},
		{"ops", "function a-vec is a step of pipelines a-pipe, b-uses-a", true},
	} {
		code, out := tenantDo(t, "DELETE", rs.url+"/v1/functions/a-vec", rs.toks[tc.token], nil)
		if code != 409 || !strings.Contains(string(out), tc.want) || strings.Contains(string(out), "b-uses-a") != tc.named {
			t.Errorf("%s deleting a-vec: %d %s; want 409 saying %q", tc.token, code, out, tc.want)
		}
	}
}
