package grafana_test

import (
	"bytes"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/plover-run/plover/engine"
	"github.com/plover-run/plover/httpapi"
	"github.com/plover-run/plover/internal/testkit"
)

// The dashboard's datasource: an import input (__inputs) and a templating
// variable of the same name, so the file works both through the import UI
// and when provisioned as is (Grafana sidecar ConfigMap).
const dsUID = "${DS_PROMETHEUS}"

type datasource struct {
	Type string `json:"type"`
	UID  string `json:"uid"`
}

type target struct {
	RefID      string      `json:"refId"`
	Expr       *string     `json:"expr"`
	Datasource *datasource `json:"datasource"`
}

type panel struct {
	ID         *int        `json:"id"`
	Type       string      `json:"type"`
	Title      string      `json:"title"`
	Datasource *datasource `json:"datasource"`
	Targets    []target    `json:"targets"`
	Panels     []panel     `json:"panels"` // a collapsed row's panels
	GridPos    *struct {
		H, W, X, Y int
	} `json:"gridPos"`
}

type variable struct {
	Name       string          `json:"name"`
	Type       string          `json:"type"`
	Query      json.RawMessage `json:"query"` // a string, or {"query": ...} from the Prometheus editor
	Datasource *datasource     `json:"datasource"`
	Multi      bool            `json:"multi"`
	IncludeAll bool            `json:"includeAll"`
}

type dashboard struct {
	Inputs []struct {
		Name     string `json:"name"`
		Type     string `json:"type"`
		PluginID string `json:"pluginId"`
	} `json:"__inputs"`
	SchemaVersion int     `json:"schemaVersion"`
	Title         string  `json:"title"`
	UID           string  `json:"uid"`
	Panels        []panel `json:"panels"`
	Templating    struct {
		List []variable `json:"list"`
	} `json:"templating"`
}

func load(t *testing.T) dashboard {
	t.Helper()
	b, err := os.ReadFile("plover.json")
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	dec := json.NewDecoder(bytes.NewReader(b))
	if err := dec.Decode(&d); err != nil {
		t.Fatalf("plover.json: %v", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		t.Fatalf("plover.json: data after the dashboard object (%v)", err)
	}
	if len(d.Panels) == 0 {
		t.Fatal("plover.json: no panels")
	}
	return d
}

// walk yields every panel, rows and the panels of collapsed rows included.
func walk(ps []panel, f func(panel)) {
	for _, p := range ps {
		f(p)
		walk(p.Panels, f)
	}
}

func (v variable) queryString(t *testing.T) string {
	t.Helper()
	if len(v.Query) == 0 {
		return ""
	}
	var s string
	if json.Unmarshal(v.Query, &s) == nil {
		return s
	}
	var o struct{ Query string }
	if err := json.Unmarshal(v.Query, &o); err != nil {
		t.Fatalf("variable %s: query is neither a string nor {query}: %v", v.Name, err)
	}
	return o.Query
}

// exprs is every PromQL expression in the dashboard, keyed by where it is.
func exprs(t *testing.T, d dashboard) map[string]string {
	t.Helper()
	out := map[string]string{}
	walk(d.Panels, func(p panel) {
		for _, tg := range p.Targets {
			if tg.Expr != nil {
				out["panel "+p.Title+" target "+tg.RefID] = *tg.Expr
			}
		}
	})
	for _, v := range d.Templating.List {
		if v.Type == "query" {
			out["variable "+v.Name] = v.queryString(t)
		}
	}
	return out
}

// metricRE finds Plover metric names in PromQL. Label names and values
// never start with plover_ on this dashboard, so every hit is a metric.
var metricRE = regexp.MustCompile(`\bplover_[a-zA-Z0-9_:]*`)

func usedMetrics(t *testing.T, d dashboard) map[string][]string {
	t.Helper()
	used := map[string][]string{}
	for where, e := range exprs(t, d) {
		for _, m := range metricRE.FindAllString(e, -1) {
			used[m] = append(used[m], where)
		}
	}
	return used
}

func TestDashboardStructure(t *testing.T) {
	d := load(t)
	if d.SchemaVersion < 36 || d.Title == "" || d.UID == "" {
		t.Errorf("schemaVersion %d, title %q, uid %q: want >= 36 and both set", d.SchemaVersion, d.Title, d.UID)
	}
	if len(d.Inputs) != 1 || d.Inputs[0].Name != "DS_PROMETHEUS" || d.Inputs[0].PluginID != "prometheus" {
		t.Errorf("__inputs %+v: want one prometheus datasource input DS_PROMETHEUS", d.Inputs)
	}

	ids := map[int]string{}
	walk(d.Panels, func(p panel) {
		if p.ID == nil {
			t.Errorf("panel %q (%s) has no id", p.Title, p.Type)
			return
		}
		if prev, dup := ids[*p.ID]; dup {
			t.Errorf("panel id %d used by %q and %q", *p.ID, prev, p.Title)
		}
		ids[*p.ID] = p.Title
		if p.Title == "" || p.GridPos == nil {
			t.Errorf("panel %d: title %q, gridPos %v: want both", *p.ID, p.Title, p.GridPos)
		}
		if p.Type == "row" { // a row holds no query, so it needs no datasource
			return
		}
		if p.Datasource == nil || p.Datasource.UID != dsUID || p.Datasource.Type != "prometheus" {
			t.Errorf("panel %q: datasource %+v, want prometheus %s", p.Title, p.Datasource, dsUID)
		}
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no targets", p.Title)
		}
		for _, tg := range p.Targets {
			if tg.Expr == nil || strings.TrimSpace(*tg.Expr) == "" {
				t.Errorf("panel %q target %s has no expr", p.Title, tg.RefID)
			}
			if tg.Datasource != nil && tg.Datasource.UID != dsUID {
				t.Errorf("panel %q target %s: datasource %+v, want %s", p.Title, tg.RefID, tg.Datasource, dsUID)
			}
		}
	})

	vars := map[string]variable{}
	for _, v := range d.Templating.List {
		vars[v.Name] = v
	}
	for _, tc := range []struct {
		name, typ, query string // query "" = not checked
		multiAll         bool
	}{
		{"DS_PROMETHEUS", "datasource", "", false},
		{"function", "query", "label_values(plover_requests_total, function)", true},
		{"instance", "query", "", true},
	} {
		v, ok := vars[tc.name]
		if !ok {
			t.Errorf("no templating variable %s", tc.name)
			continue
		}
		if v.Type != tc.typ || (tc.multiAll && !(v.Multi && v.IncludeAll)) {
			t.Errorf("variable %s: type %s multi %v includeAll %v, want %s multi+all=%v", tc.name, v.Type, v.Multi, v.IncludeAll, tc.typ, tc.multiAll)
		}
		if tc.query != "" && v.queryString(t) != tc.query {
			t.Errorf("variable %s: query %q, want %q", tc.name, v.queryString(t), tc.query)
		}
		if v.Type == "query" && (v.Datasource == nil || v.Datasource.UID != dsUID) {
			t.Errorf("variable %s: datasource %+v, want %s", tc.name, v.Datasource, dsUID)
		}
	}
}

// How a metric the dashboard uses is shown to exist.
type source int

const (
	scraped   source = iota // in GET /metrics of an in-process server after one invoke
	described               // described by the engine's collector; series only for isolated workers
	frontDoor               // registered by plover serve's front door (cli/frontdoor.go)
)

// Metrics the in-process server cannot show, and why. Everything else the
// dashboard uses must be in a real scrape.
var notScraped = map[string]source{
	// One series per worker process: the in-process host device runs the
	// function without a worker, so the collector describes these but has
	// no series for them here (cli/plover/isolation_test.go sees them).
	"plover_worker_resident_bytes": described,
	"plover_worker_pss_bytes":      described,
	"plover_worker_threads":        described,
	// Registered by the CLI's front door on the serve registry, not by
	// httpapi.New, so an httpapi server in process does not export them:
	// these are checked against the source file instead.
	"plover_connections_open":           frontDoor,
	"plover_connections_rejected_total": frontDoor,
	"plover_accept_errors_total":        frontDoor,
}

// scrape starts an engine and HTTP server as cli/serve.go assembles them
// (engine collector on the server's registry), invokes echo once so the
// labelled series exist, and returns the metric families by TYPE.
func scrape(t *testing.T) map[string]string {
	families, _ := scrapeLabels(t)
	return families
}

// scrapeLabels is scrape, with the label names each series name carries
// (a histogram's _bucket, _sum and _count apart).
func scrapeLabels(t *testing.T) (map[string]string, map[string]map[string]bool) {
	t.Helper()
	eng := testkit.Engine(t, engine.Config{})
	testkit.Deploy(t, eng, testkit.BundleDir(t, testkit.Manifest("echo"), nil))
	reg := prometheus.NewRegistry()
	reg.MustRegister(eng.Collector())
	base := testkit.Serve(t, eng, httpapi.Options{Registry: reg})
	if resp, body := testkit.Post(t, "POST", base+"/v1/functions/echo/invoke", "application/octet-stream", []byte("hello")); resp.StatusCode != 200 {
		t.Fatalf("invoke echo: %d %s", resp.StatusCode, body)
	}
	resp, body := testkit.Post(t, "GET", base+"/metrics", "", nil)
	if resp.StatusCode != 200 {
		t.Fatalf("GET /metrics: %d", resp.StatusCode)
	}
	families := map[string]string{}
	labels := map[string]map[string]bool{}
	for _, line := range strings.Split(string(body), "\n") {
		if f := strings.Fields(line); len(f) == 4 && f[0] == "#" && f[1] == "TYPE" {
			families[f[2]] = f[3]
			continue
		}
		if line == "" || line[0] == '#' {
			continue
		}
		name, rest, _ := strings.Cut(line, "{")
		if !strings.Contains(line, "{") || strings.ContainsAny(name, " ") {
			name, _, _ = strings.Cut(line, " ")
			rest = ""
		}
		if labels[name] == nil {
			labels[name] = map[string]bool{}
		}
		for _, m := range sampleLabelRE.FindAllStringSubmatch(rest, -1) {
			labels[name][m[1]] = true
		}
	}
	if families["plover_requests_total"] == "" {
		t.Fatalf("/metrics has no plover_requests_total after an invoke:\n%s", body)
	}
	return families, labels
}

// sampleLabelRE finds the label names of a sample line's {...}.
var sampleLabelRE = regexp.MustCompile(`(?:^|,)([a-zA-Z_][a-zA-Z0-9_]*)="`)

// describedNames is the metric names the engine's collector describes.
func describedNames(t *testing.T) map[string]bool {
	t.Helper()
	eng := testkit.Engine(t, engine.Config{})
	ch := make(chan *prometheus.Desc, 64)
	go func() { eng.Collector().Describe(ch); close(ch) }()
	re := regexp.MustCompile(`fqName: "([^"]+)"`)
	out := map[string]bool{}
	for d := range ch {
		if m := re.FindStringSubmatch(d.String()); m != nil {
			out[m[1]] = true
		}
	}
	return out
}

// familyOf resolves a name used in PromQL to its scraped family: itself, or
// for a _bucket/_sum/_count series the histogram (or summary) it belongs to.
func familyOf(name string, families map[string]string) (string, bool) {
	if _, ok := families[name]; ok {
		return name, true
	}
	for suffix, types := range map[string][]string{"_bucket": {"histogram"}, "_sum": {"histogram", "summary"}, "_count": {"histogram", "summary"}} {
		base, ok := strings.CutSuffix(name, suffix)
		if !ok {
			continue
		}
		for _, typ := range types {
			if families[base] == typ {
				return base, true
			}
		}
	}
	return "", false
}

func TestDashboardMetricsExist(t *testing.T) {
	used := usedMetrics(t, load(t))
	if len(used) == 0 {
		t.Fatal("no plover_ metric in any expression")
	}
	families := scrape(t)
	desc := describedNames(t)
	frontdoorSrc, err := os.ReadFile(filepath.Join(testkit.Root(), "cli", "frontdoor.go"))
	if err != nil {
		t.Fatal(err)
	}

	names := make([]string, 0, len(used))
	for n := range used {
		names = append(names, n)
	}
	sort.Strings(names)
	onDashboard := map[string]bool{}
	for _, name := range names {
		t.Run(name, func(t *testing.T) {
			src, special := notScraped[name]
			if !special {
				fam, ok := familyOf(name, families)
				if !ok {
					t.Fatalf("not exported: no such family in /metrics (used by %v)", used[name])
				}
				onDashboard[fam] = true
				if strings.HasSuffix(name, "_bucket") && families[fam] != "histogram" {
					t.Errorf("%s is a %s, not a histogram", fam, families[fam])
				}
				return
			}
			onDashboard[name] = true
			switch src {
			case described:
				if !desc[name] {
					t.Errorf("the engine's collector does not describe %s (used by %v)", name, used[name])
				}
			case frontDoor:
				if !bytes.Contains(frontdoorSrc, []byte(`Name: "`+name+`"`)) {
					t.Errorf("cli/frontdoor.go registers no %s (used by %v)", name, used[name])
				}
			}
		})
	}
	// Not a failure: a new metric may reasonably wait for its panel.
	for fam := range families {
		if strings.HasPrefix(fam, "plover_") && !onDashboard[fam] {
			t.Logf("note: %s is exported but on no panel", fam)
		}
	}
}

// The extraction must see through PromQL: names inside functions, with
// selectors, histogram series suffixes, and not label values or legends.
func TestMetricExtraction(t *testing.T) {
	families := map[string]string{"plover_request_duration_seconds": "histogram", "plover_requests_total": "counter"}
	for _, tc := range []struct {
		expr string
		want []string
		fam  []string // familyOf each want; "" = not exported
	}{
		{`sum(rate(plover_requests_total{function=~"$function"}[5m]))`, []string{"plover_requests_total"}, []string{"plover_requests_total"}},
		{`histogram_quantile(0.99, sum by (le, phase) (rate(plover_request_duration_seconds_bucket[1m])))`,
			[]string{"plover_request_duration_seconds_bucket"}, []string{"plover_request_duration_seconds"}},
		{`plover_request_duration_seconds_sum / plover_request_duration_seconds_count`,
			[]string{"plover_request_duration_seconds_sum", "plover_request_duration_seconds_count"},
			[]string{"plover_request_duration_seconds", "plover_request_duration_seconds"}},
		{`plover_requests_total_bucket`, []string{"plover_requests_total_bucket"}, []string{""}}, // a counter has no buckets
		{`plover_nonexistent{x="y"}`, []string{"plover_nonexistent"}, []string{""}},
		{`up{job="plover"}`, nil, nil},
	} {
		got := metricRE.FindAllString(tc.expr, -1)
		if strings.Join(got, ",") != strings.Join(tc.want, ",") {
			t.Errorf("%s: extracted %v, want %v", tc.expr, got, tc.want)
			continue
		}
		for i, n := range got {
			fam, _ := familyOf(n, families)
			if fam != tc.fam[i] {
				t.Errorf("%s: family of %s is %q, want %q", tc.expr, n, fam, tc.fam[i])
			}
		}
	}
}

// describedLabels is the variable label names of each metric the engine's
// collector describes.
func describedLabels(t *testing.T) map[string]map[string]bool {
	t.Helper()
	eng := testkit.Engine(t, engine.Config{})
	ch := make(chan *prometheus.Desc, 64)
	go func() { eng.Collector().Describe(ch); close(ch) }()
	re := regexp.MustCompile(`fqName: "([^"]+)".*variableLabels: \{([^}]*)\}`)
	out := map[string]map[string]bool{}
	for d := range ch {
		m := re.FindStringSubmatch(d.String())
		if m == nil {
			t.Fatalf("cannot read the labels of %s", d)
		}
		out[m[1]] = map[string]bool{}
		for _, l := range strings.Split(m[2], ",") {
			if l != "" {
				out[m[1]][l] = true
			}
		}
	}
	return out
}

var (
	selectorRE    = regexp.MustCompile(`\{([^}]*)\}`)
	matcherRE     = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)\s*"`)
	groupingRE    = regexp.MustCompile(`\b(?:by|without)\s*\(([^)]*)\)`)
	labelValuesRE = regexp.MustCompile(`label_values\(\s*[a-zA-Z_:][a-zA-Z0-9_:]*\s*,\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\)`)
)

// exprLabels is the label names an expression selects, groups or asks the
// values of.
func exprLabels(e string) []string {
	var out []string
	for _, sel := range selectorRE.FindAllStringSubmatch(e, -1) {
		for _, m := range matcherRE.FindAllStringSubmatch(sel[1], -1) {
			out = append(out, m[1])
		}
	}
	for _, g := range groupingRE.FindAllStringSubmatch(e, -1) {
		for _, l := range strings.Split(g[1], ",") {
			if l = strings.TrimSpace(l); l != "" {
				out = append(out, l)
			}
		}
	}
	for _, m := range labelValuesRE.FindAllStringSubmatch(e, -1) {
		out = append(out, m[1])
	}
	return out
}

// missingLabels is "metric: label" for every label the expression uses
// that a metric in it does not carry. Prometheus adds instance and job to
// every series it scrapes; le is a _bucket series' own. Every metric of an
// expression must carry every label it names (the dashboard's expressions
// each use one metric, or one twice).
func missingLabels(e string, labelsOf func(string) map[string]bool) []string {
	var bad []string
	for _, m := range metricRE.FindAllString(e, -1) {
		have := labelsOf(m)
		for _, l := range exprLabels(e) {
			if l == "instance" || l == "job" || (l == "le" && strings.HasSuffix(m, "_bucket")) || have[l] {
				continue
			}
			bad = append(bad, m+": "+l)
		}
	}
	return bad
}

// TestDashboardLabelsExist: a metric that keeps its name but loses or
// renames a label leaves a panel as empty as a renamed metric does
// (function=~"$function" matches nothing, by (phase) makes one series).
func TestDashboardLabelsExist(t *testing.T) {
	_, scraped := scrapeLabels(t)
	desc := describedLabels(t)
	labelsOf := func(m string) map[string]bool {
		switch {
		case scraped[m] != nil:
			return scraped[m]
		case notScraped[m] == described:
			return desc[m]
		}
		return nil // the front door's: no labels of their own
	}
	for where, e := range exprs(t, load(t)) {
		if bad := missingLabels(e, labelsOf); len(bad) > 0 {
			t.Errorf("%s: %q uses labels its metrics do not have: %q", where, e, bad)
		}
	}
	// The check itself can fail, on each way an expression names a label.
	for _, e := range []string{
		`sum(rate(plover_requests_total{fn=~"$function"}[5m]))`,
		`sum by (fn) (rate(plover_requests_total[5m]))`,
		`label_values(plover_requests_total, fn)`,
		`histogram_quantile(0.99, sum by (le) (rate(plover_queue_depth[5m])))`,
		`sum by (function) (plover_worker_threads{state="busy"})`,
	} {
		if bad := missingLabels(e, labelsOf); len(bad) != 1 {
			t.Errorf("%s: missing %q, want one label", e, bad)
		}
	}
	if bad := missingLabels(`sum by (le, phase) (rate(plover_request_duration_seconds_bucket{function=~"$function",instance=~"$instance",code!~"x"}[5m]))`, labelsOf); !reflect.DeepEqual(bad, []string{"plover_request_duration_seconds_bucket: code"}) {
		t.Errorf("missingLabels on a histogram with a made-up code label: %q", bad)
	}
}
