package charttest

import (
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// serveGo is the file whose flag definitions the chart's args must match.
const serveGo = "../../../cli/serve.go"

var flagDef = regexp.MustCompile(`\bfs\.(?:String|Bool|Int|Int64|Uint|Uint64|Float64|Duration|Text|Func|BoolFunc)?Var\(\s*(?:&[\w.]+\s*,\s*)?"([a-z0-9][a-z0-9-]*)"`)

// serveFlags reads the names of plover serve's flags from cli/serve.go's
// text (fs.StringVar(&f.listen, "listen", ...) and the like), as
// deploy/kserve/manifesttest does, rather than building plover.
func serveFlags(t *testing.T) map[string]bool {
	t.Helper()
	b, err := os.ReadFile(serveGo)
	if err != nil {
		t.Fatalf("%v (the test reads the flag definitions from the repository's cli/serve.go)", err)
	}
	flags := map[string]bool{}
	for _, m := range flagDef.FindAllStringSubmatch(string(b), -1) {
		flags[m[1]] = true
	}
	// The reading must find flags the chart passes; if it finds none, the
	// pattern no longer matches how serve.go declares them.
	for _, f := range []string{"listen", "data", "store", "auth-file", "metrics-listen", "grace", "log-format"} {
		if !flags[f] {
			t.Fatalf("cli/serve.go: flag --%s not found among %d read; has the way flags are declared changed?", f, len(flags))
		}
	}
	return flags
}

// unknownArgs is every arg that is not --NAME or --NAME=VALUE with NAME a
// flag in known. The chart writes every flag as --name=value (or a bare
// boolean), never "--name value", so any other arg is an error too.
func unknownArgs(args []string, known map[string]bool) []string {
	var bad []string
	for _, a := range args {
		name, ok := strings.CutPrefix(a, "--")
		if !ok {
			bad = append(bad, a)
			continue
		}
		name, _, _ = strings.Cut(name, "=")
		if !known[name] {
			bad = append(bad, a)
		}
	}
	return bad
}

// TestArgsAreServeFlags: every flag the chart renders, with every value
// that adds one turned on, is a flag plover serve defines. A flag renamed or
// removed in cli/serve.go and not in the chart would crash-loop every pod
// (plover serve refuses an unknown flag).
func TestArgsAreServeFlags(t *testing.T) {
	known := serveFlags(t)
	sets := map[string]values{
		"defaults": required(),
		"everything": required().
			set("device", "auto").
			set("s3.insecure", true).
			set("tls.enabled", true).
			set("tls.secretName", "plover-tls").
			set("grpc.enabled", true).
			set("repository.enabled", true).
			set("repository.existingClaim", "models").
			set("server.workerScope", "tenant"),
		"insecure, no metrics": values{}.
			set("store.url", "file:///var/lib/plover/store").
			set("replicaCount", 1).
			set("auth.insecureNoAuth", true).
			set("metrics.enabled", false).
			set("gpu.enabled", false),
	}
	for name, v := range sets {
		t.Run(name, func(t *testing.T) {
			d := template(t, "plover", v).deployments["plover"]
			if d == nil {
				t.Fatal("no Deployment plover")
			}
			args := d.Spec.Template.Spec.Containers[0].Args
			if bad := unknownArgs(args, known); len(bad) > 0 {
				t.Errorf("args %q: not flags of plover serve (cli/serve.go): %q", args, bad)
			}
		})
	}
	// The check itself can fail.
	if bad := unknownArgs([]string{"--listen=0.0.0.0:8080", "--metrics-port=9090", "--s3-insecure", "stray"}, known); !slices.Equal(bad, []string{"--metrics-port=9090", "stray"}) {
		t.Errorf("unknownArgs on made-up flags: %q", bad)
	}
}

// serveDuration is the value of cli/serve.go's const NAME = N * time.Second
// (or Minute): one of plover serve's defaults, read from its text.
func serveDuration(t *testing.T, name string) time.Duration {
	t.Helper()
	b, err := os.ReadFile(serveGo)
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`const ` + name + ` = (\d+) \* time\.(Second|Minute)`).FindSubmatch(b)
	if m == nil {
		t.Fatalf("cli/serve.go: no const %s = N * time.Second|Minute", name)
	}
	n, _ := strconv.Atoi(string(m[1]))
	if string(m[2]) == "Minute" {
		return time.Duration(n) * time.Minute
	}
	return time.Duration(n) * time.Second
}

// TestIngressReadTimeoutAboveMaxTimeout: a client may ask for a deadline up
// to plover serve's --max-timeout; ingress-nginx's own proxy-read-timeout
// (60 s unless the Ingress says) would answer 504 first and cut every
// deadline past a minute. The chart's default must be above the server's
// default --max-timeout (cli/serve.go), and an annotation of the user's wins.
func TestIngressReadTimeoutAboveMaxTimeout(t *testing.T) {
	maxTimeout := int(serveDuration(t, "defaultMaxTimeout").Seconds())
	const key = "nginx.ingress.kubernetes.io/proxy-read-timeout"
	ing := template(t, "plover", required().set("ingress.enabled", true)).ingresses["plover"]
	if ing == nil {
		t.Fatal("no Ingress plover")
	}
	if got, err := strconv.Atoi(ing.Annotations[key]); err != nil || got <= maxTimeout {
		t.Errorf("Ingress %s = %q, want more than plover serve's default --max-timeout (%d s)", key, ing.Annotations[key], maxTimeout)
	}
	// The user's annotation replaces the chart's (one key, not two).
	v := required().set("ingress.enabled", true).set("ingress.annotations", map[string]any{key: "3600"})
	if out := render(t, "plover", v); strings.Count(out, key) != 1 {
		t.Errorf("with ingress.annotations[%s], the Ingress names it %d times, want once", key, strings.Count(out, key))
	}
	if ing := template(t, "plover", v).ingresses["plover"]; ing == nil || ing.Annotations[key] != "3600" {
		t.Errorf("ingress.annotations[%s]=3600 not applied", key)
	}
	// 0: the controller's default, no annotation.
	if ing := template(t, "plover", required().set("ingress.enabled", true).set("ingress.proxyReadTimeoutSeconds", 0)).ingresses["plover"]; ing == nil || ing.Annotations[key] != "" {
		t.Errorf("ingress.proxyReadTimeoutSeconds=0 still sets %s", key)
	}
}
