package manifesttest

import (
	"net"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// serveGo is the file whose flag definitions the runtime's args must match.
const serveGo = "../../../cli/serve.go"

// pending are flags of `plover serve` being added alongside this runtime,
// which it may name before cli/serve.go defines them; none now. A flag
// stays here only until serve.go defines it (TestRuntimeArgsCatchARemovedFlag):
// after that the allowance would hide its rename.
var pending []string

var flagDef = regexp.MustCompile(`\bfs\.(?:String|Bool|Int|Int64|Uint|Uint64|Float64|Duration|Text|Func|BoolFunc)?Var\(\s*(?:&[\w.]+\s*,\s*)?"([a-z0-9][a-z0-9-]*)"`)

// serveFlags reads the names of plover serve's flags from cli/serve.go's
// text (fs.StringVar(&f.listen, "listen", ...) and the like), rather than
// building and running `plover serve --help`.
func serveFlags(t *testing.T) map[string]bool {
	t.Helper()
	b, err := os.ReadFile(serveGo)
	if err != nil {
		t.Fatalf("%v (the test reads the flag definitions from the repository's cli/serve.go)", err)
	}
	flags := map[string]bool{"help": true}
	for _, m := range flagDef.FindAllStringSubmatch(string(b), -1) {
		flags[m[1]] = true
	}
	// The reading must find the flags the runtime depends on; if it finds
	// none, the pattern no longer matches how serve.go declares them.
	for _, f := range []string{"listen", "grpc-listen", "metrics-listen", "auth-file", "insecure-no-auth", "data", "device", "log-format"} {
		if !flags[f] {
			t.Fatalf("cli/serve.go: flag --%s not found among %d read; has the way flags are declared changed?", f, len(flags))
		}
	}
	return flags
}

// argFlags returns the flag names in args (--name, --name=value) and
// anything else that is not a flag's value.
func argFlags(args []string) (names, stray []string) {
	boolish := map[string]bool{"insecure-no-auth": true, "checked": true, "mps": true, "help": true}
	for i := 0; i < len(args); i++ {
		a := args[i]
		if !strings.HasPrefix(a, "--") {
			stray = append(stray, a)
			continue
		}
		name, _, hasValue := strings.Cut(a[2:], "=")
		names = append(names, name)
		if !hasValue && !boolish[name] && i+1 < len(args) && !strings.HasPrefix(args[i+1], "--") {
			i++ // --name value
		}
	}
	return names, stray
}

// unknownFlags is what the args test asserts: flags neither serve.go
// defines nor pending allows.
func unknownFlags(args []string, known map[string]bool) []string {
	names, stray := argFlags(args)
	var bad []string
	for _, n := range names {
		if !known[n] && !slices.Contains(pending, n) {
			bad = append(bad, "--"+n)
		}
	}
	return append(bad, stray...)
}

func strs(t *testing.T, v any) []string {
	t.Helper()
	a, ok := v.([]any)
	if !ok {
		t.Fatalf("%v: not a list", v)
	}
	out := make([]string, len(a))
	for i, x := range a {
		s, ok := x.(string)
		if !ok {
			t.Fatalf("%v: item %d is not a string", v, i)
		}
		out[i] = s
	}
	return out
}

// TestRuntimeArgsAreServeFlags: every flag the runtime's container passes
// is one plover serve defines (cli/serve.go), or one pending.
func TestRuntimeArgsAreServeFlags(t *testing.T) {
	known := serveFlags(t)
	rt := one(t, "ClusterServingRuntime")
	c := obj(t, rt, "spec", "containers", 0)
	if _, ok := c["command"]; ok {
		t.Errorf("the container sets command: the image's entry point (tini -- plover serve) takes flags as args")
	}
	args := strs(t, c["args"])
	if bad := unknownFlags(args, known); len(bad) > 0 {
		t.Errorf("args %q: not flags of plover serve (cli/serve.go): %q", args, bad)
	}
	// The check itself can fail.
	if bad := unknownFlags([]string{"--listen=0.0.0.0:8080", "--grpc-port=8081", "--model-store", "/mnt/models", "stray"}, known); !slices.Equal(bad, []string{"--grpc-port", "--model-store", "stray"}) {
		t.Errorf("unknownFlags on made-up flags: %q", bad)
	}
}

func flagValue(args []string, name string) (string, bool) {
	for i, a := range args {
		if v, ok := strings.CutPrefix(a, "--"+name+"="); ok {
			return v, true
		}
		if a == "--"+name {
			if i+1 < len(args) && !strings.HasPrefix(args[i+1], "--") {
				return args[i+1], true
			}
			return "", true
		}
	}
	return "", false
}

func port(t *testing.T, addr string) string {
	t.Helper()
	_, p, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatalf("address %q: %v", addr, err)
	}
	return p
}

// TestRuntimeFitsKServe: what the schema cannot say. The runtime serves
// /mnt/models on the ports it declares, probes the port --listen binds,
// scrapes the port --metrics-listen binds, asks for a GPU, has auth, and the
// InferenceService would select it.
func TestRuntimeFitsKServe(t *testing.T) {
	rt := one(t, "ClusterServingRuntime")
	isvc := one(t, "InferenceService")
	spec := obj(t, rt, "spec")
	c := obj(t, rt, "spec", "containers", 0)
	if c["name"] != "kserve-container" {
		t.Errorf("container %v: KServe merges the predictor into the container named kserve-container", c["name"])
	}
	args := strs(t, c["args"])
	get := func(name string) string {
		v, ok := flagValue(args, name)
		if !ok {
			t.Errorf("args %q: no --%s", args, name)
		}
		return v
	}
	if v := get("repository"); v != "/mnt/models" {
		t.Errorf("--repository=%s, want /mnt/models (where the storage initializer puts the model)", v)
	}
	httpPort, grpcPort, metricsPort := port(t, get("listen")), port(t, get("grpc-listen")), port(t, get("metrics-listen"))
	if httpPort != "8080" {
		t.Errorf("--listen port %s: KServe routes HTTP to 8080", httpPort)
	}
	// Ports: HTTP first (KServe's Service maps its port 80 to the first
	// container port), gRPC named so that KServe marks it h2c, then the
	// metrics port, declared because a PodMonitor's port or portNumber
	// selects declared ports only (prometheus-operator drops the others).
	ports := at(t, c, "ports").([]any)
	if len(ports) != 3 {
		t.Fatalf("ports %v: want HTTP, gRPC, then metrics", ports)
	}
	p0, p1, p2 := ports[0].(map[string]any), ports[1].(map[string]any), ports[2].(map[string]any)
	if show(p0["containerPort"]) != httpPort || show(p1["containerPort"]) != grpcPort || show(p2["containerPort"]) != metricsPort {
		t.Errorf("container ports %v, %v, %v; want --listen's %s, --grpc-listen's %s, --metrics-listen's %s",
			p0["containerPort"], p1["containerPort"], p2["containerPort"], httpPort, grpcPort, metricsPort)
	}
	if n, _ := p1["name"].(string); !strings.Contains(n, "grpc") && !strings.Contains(n, "h2c") {
		t.Errorf("gRPC port named %q: KServe gives h2c only to ports whose name holds grpc or h2c", n)
	}
	if p2["name"] != "metrics" {
		t.Errorf("metrics port named %v, want metrics (what the README's PodMonitor selects)", p2["name"])
	}
	// Liveness and startup on /healthz, which answers 503 once a device has
	// failed (httpapi/control.go) and needs no token; /v2/health/live
	// answers 200 whenever the process does, so a liveness probe there
	// could never restart a pod with a dead GPU.
	for _, probe := range []struct{ name, path string }{{"readinessProbe", "/v2/health/ready"}, {"livenessProbe", "/healthz"}, {"startupProbe", "/healthz"}} {
		g := obj(t, c, probe.name, "httpGet")
		if g["path"] != probe.path || show(g["port"]) != httpPort {
			t.Errorf("%s: %v, want GET %s on %s", probe.name, g, probe.path, httpPort)
		}
	}
	// Knative mode puts its queue-proxy in the same pod (one network
	// namespace), listening on the ports Knative reserves
	// (knative.dev/serving pkg/apis/serving/k8s_validation.go's
	// reservedPorts: 8012, 8013, 8022, 9090 and 9091, 8008 for profiling;
	// 8112 for its HTTPS), and KServe adds its own in some setups (9081, the
	// agent for logging and batching; 9088, the queue-proxy's aggregated
	// metrics): plover binding one of them would exit "address already in
	// use". Knative's webhook checks declared ports only, not what a flag
	// binds.
	reserved := map[string]string{"8012": "Knative's queue-proxy (HTTP)", "8013": "Knative's queue-proxy (HTTP/2)", "8022": "Knative's queue-proxy (admin)",
		"8112": "Knative's queue-proxy (HTTPS)", "9090": "Knative's queue-proxy (autoscaler metrics)", "9091": "Knative's queue-proxy (user metrics)",
		"8008": "Knative's queue-proxy (profiling)", "9081": "KServe's agent", "9088": "KServe's queue-proxy extension (aggregated metrics)"}
	for _, p := range []struct{ flag, port string }{{"listen", httpPort}, {"grpc-listen", grpcPort}, {"metrics-listen", metricsPort}} {
		if who, ok := reserved[p.port]; ok {
			t.Errorf("--%s binds port %s, which %s listens on in the same pod", p.flag, p.port, who)
		}
	}
	ann := obj(t, spec, "annotations")
	if ann["prometheus.kserve.io/port"] != metricsPort || ann["prometheus.kserve.io/path"] != "/metrics" {
		t.Errorf("prometheus annotations %v: want port %s (--metrics-listen: no token there) and path /metrics", ann, metricsPort)
	}
	for _, kind := range []string{"requests", "limits"} {
		if q := obj(t, c, "resources", kind)["nvidia.com/gpu"]; q == nil {
			t.Errorf("resources.%s: no nvidia.com/gpu", kind)
		}
	}
	if d, _ := flagValue(args, "device"); d == "host" {
		t.Errorf("--device=host with a GPU requested")
	}
	// Auth: an auth file from a mounted Secret, not --insecure-no-auth.
	if _, ok := flagValue(args, "insecure-no-auth"); ok {
		t.Errorf("the runtime passes --insecure-no-auth: anyone reaching the pod could deploy native code")
	}
	authFile := get("auth-file")
	volumes := map[string]map[string]any{}
	for _, v := range at(t, spec, "volumes").([]any) {
		m := v.(map[string]any)
		volumes[m["name"].(string)] = m
	}
	covered := false
	for _, m := range at(t, c, "volumeMounts").([]any) {
		vm := m.(map[string]any)
		vol := volumes[vm["name"].(string)]
		if vol == nil {
			t.Errorf("volumeMount %v: no volume of that name in spec.volumes", vm["name"])
			continue
		}
		if dir := vm["mountPath"].(string); strings.HasPrefix(authFile, dir+"/") {
			covered = vol["secret"] != nil && vm["readOnly"] == true
		}
	}
	if !covered {
		t.Errorf("--auth-file=%s is not under a read-only mount of a Secret volume", authFile)
	}
	// The InferenceService selects this runtime: a format it supports with
	// autoSelect (or the runtime named), a protocol it lists (KServe
	// assumes v1 when the predictor names none).
	model := obj(t, isvc, "spec", "predictor", "model")
	format := obj(t, model, "modelFormat")["name"]
	selectable := false
	for _, f := range at(t, spec, "supportedModelFormats").([]any) {
		m := f.(map[string]any)
		if m["name"] == format && (m["autoSelect"] == true || model["runtime"] == at(t, rt, "metadata", "name")) {
			selectable = true
		}
	}
	if !selectable {
		t.Errorf("modelFormat %v: the runtime does not support it with autoSelect", format)
	}
	if r, ok := model["runtime"]; ok && r != at(t, rt, "metadata", "name") {
		t.Errorf("the InferenceService names runtime %v, the runtime is %v", r, at(t, rt, "metadata", "name"))
	}
	protocols := strs(t, spec["protocolVersions"])
	if !slices.Contains(protocols, "v2") || !slices.Contains(protocols, "grpc-v2") {
		t.Errorf("protocolVersions %q: want v2 and grpc-v2", protocols)
	}
	if pv, _ := model["protocolVersion"].(string); !slices.Contains(protocols, pv) {
		t.Errorf("the InferenceService's protocolVersion %q is not among the runtime's %q", pv, protocols)
	}
	// Two ports: Knative mode would refuse the pod, so the example asks for
	// Standard (RawDeployment before KServe 0.16; the default install's mode
	// is Knative).
	if m := obj(t, isvc, "metadata", "annotations")["serving.kserve.io/deploymentMode"]; m != "Standard" && m != "RawDeployment" {
		t.Errorf("serving.kserve.io/deploymentMode %v: want Standard (or RawDeployment), the mode that exposes both ports", m)
	}
	if u, _ := model["storageUri"].(string); !strings.HasPrefix(u, "s3://") {
		t.Errorf("storageUri %q: the example reads from S3", u)
	}
}
