// Package charttest checks the Helm chart in ../plover without a cluster: helm
// lint, then helm template for several value sets, every rendered document
// decoded strictly (an unknown or misplaced field is an error) into the
// official Kubernetes types, and the properties the chart promises asserted on
// those objects.
//
// It needs a helm binary: $HELM, else the pinned one scripts/install-helm.sh
// builds into its cache directory, else helm on PATH. Without one the
// tests skip, unless PLOVER_REQUIRE_HELM=1 (CI), when they fail.
package charttest

import (
	"bufio"
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8slabels "k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"
)

const (
	chartDir  = "../plover"
	namespace = "plover-test"
	// The real metric the autoscaler scales on; it must be one the server exports.
	queueMetric   = "plover_queue_depth"
	collectorFile = "../../../engine/collector.go"
)

// helmBin finds helm: $HELM, else the version scripts/install-helm.sh pins
// in its cache, else helm on PATH, else the newest other version in that
// cache.
func helmBin(t *testing.T) string {
	t.Helper()
	if h := os.Getenv("HELM"); h != "" {
		return h
	}
	base := os.Getenv("PLOVER_HELM_CACHE")
	if base == "" {
		if c, err := os.UserCacheDir(); err == nil {
			base = filepath.Join(c, "plover")
		}
	}
	pinned, err := pinnedHelmVersion(installHelm)
	if err != nil {
		t.Fatal(err)
	}
	if h := findHelm(base, pinned, exec.LookPath); h != "" {
		return h
	}
	msg := "helm not found ($HELM, PATH, or the cache of scripts/install-helm.sh): run `bash scripts/install-helm.sh` from the repository root (minutes, once)"
	if os.Getenv("PLOVER_REQUIRE_HELM") == "1" {
		t.Fatal(msg)
	}
	t.Skip(msg)
	return ""
}

// installHelm is the script that pins helm's version.
const installHelm = "../../../scripts/install-helm.sh"

// pinnedHelmVersion reads HELM_VERSION=... from the install script.
func pinnedHelmVersion(script string) (string, error) {
	b, err := os.ReadFile(script)
	if err != nil {
		return "", fmt.Errorf("the pinned helm version: %w", err)
	}
	for line := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "HELM_VERSION="); ok {
			return strings.Trim(v, `"'`), nil
		}
	}
	return "", fmt.Errorf("no HELM_VERSION= in %s", script)
}

// findHelm chooses helm: the pinned version in the cache base, else what
// lookPath finds, else the cache's newest version by number (v3.22 after
// v3.9); "" if none.
func findHelm(base, pinned string, lookPath func(string) (string, error)) string {
	executable := func(p string) bool {
		fi, err := os.Stat(p)
		return err == nil && !fi.IsDir() && fi.Mode()&0o111 != 0
	}
	if base != "" && pinned != "" {
		if p := filepath.Join(base, "helm-"+pinned, "helm"); executable(p) {
			return p
		}
	}
	if h, err := lookPath("helm"); err == nil {
		return h
	}
	if base == "" {
		return ""
	}
	found, _ := filepath.Glob(filepath.Join(base, "helm-v3*", "helm"))
	slices.SortFunc(found, func(a, b string) int {
		return compareVersions(filepath.Base(filepath.Dir(a)), filepath.Base(filepath.Dir(b)))
	})
	for i := len(found) - 1; i >= 0; i-- {
		if executable(found[i]) {
			return found[i]
		}
	}
	return ""
}

// compareVersions orders helm-vX.Y.Z names by their numbers, part by part
// (a part's leading digits; a name without them sorts first).
func compareVersions(a, b string) int {
	pa := strings.Split(strings.TrimPrefix(a, "helm-v"), ".")
	pb := strings.Split(strings.TrimPrefix(b, "helm-v"), ".")
	num := func(s string) int {
		i := 0
		for i < len(s) && s[i] >= '0' && s[i] <= '9' {
			i++
		}
		n, err := strconv.Atoi(s[:i])
		if err != nil {
			return -1
		}
		return n
	}
	for i := range max(len(pa), len(pb)) {
		x, y := -1, -1
		if i < len(pa) {
			x = num(pa[i])
		}
		if i < len(pb) {
			y = num(pb[i])
		}
		if c := cmp.Compare(x, y); c != 0 {
			return c
		}
	}
	return strings.Compare(a, b)
}

// values is a Helm values tree; set(v, "a.b.c", x) fills it.
type values map[string]any

func (v values) set(path string, x any) values {
	m := map[string]any(v)
	keys := strings.Split(path, ".")
	for _, k := range keys[:len(keys)-1] {
		next, ok := m[k].(map[string]any)
		if !ok {
			next = map[string]any{}
			m[k] = next
		}
		m = next
	}
	m[keys[len(keys)-1]] = x
	return v
}

// required is the least a real install must set: where the store is, its
// credentials, and the auth file.
func required() values {
	return values{}.
		set("s3.bucket", "plover-bundles").
		set("s3.prefix", "prod").
		set("s3.endpoint", "minio.storage.svc:9000").
		set("s3.region", "us-east-1").
		set("s3.existingSecret", "plover-s3").
		set("auth.existingSecret", "plover-auth")
}

func writeValues(t *testing.T, v values) string {
	t.Helper()
	b, err := yaml.Marshal(map[string]any(v))
	if err != nil {
		t.Fatal(err)
	}
	// Not t.TempDir(): its name comes from the test's, and helm splits -f on
	// commas, which subtest names may hold.
	dir, err := os.MkdirTemp("", "charttest")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	f := filepath.Join(dir, "values.yaml")
	if err := os.WriteFile(f, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return f
}

func runHelm(t *testing.T, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	var o, e bytes.Buffer
	cmd := exec.Command(helmBin(t), args...)
	cmd.Stdout, cmd.Stderr = &o, &e
	// No repositories, plugins or caches of the user's: nothing to download.
	home := t.TempDir()
	cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+home+"/cache", "HELM_CONFIG_HOME="+home+"/config",
		"HELM_DATA_HOME="+home+"/data", "KUBECONFIG="+home+"/no-kubeconfig")
	err = cmd.Run()
	return o.String(), e.String(), err
}

// objects is what one helm template produced, decoded.
type objects struct {
	deployments     map[string]*appsv1.Deployment
	daemonSets      map[string]*appsv1.DaemonSet
	services        map[string]*corev1.Service
	secrets         map[string]*corev1.Secret
	serviceAccounts map[string]*corev1.ServiceAccount
	pdbs            map[string]*policyv1.PodDisruptionBudget
	hpas            map[string]*autoscalingv2.HorizontalPodAutoscaler
	ingresses       map[string]*networkingv1.Ingress
	serviceMonitors map[string]*serviceMonitor
	kinds           []string
}

// serviceMonitor is the part of monitoring.coreos.com/v1 ServiceMonitor the
// chart uses (k8s.io/api has no type for it); decoded strictly too, so a field
// the chart writes that is not here fails the test.
type serviceMonitor struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              struct {
		Selector          metav1.LabelSelector `json:"selector"`
		NamespaceSelector struct {
			MatchNames []string `json:"matchNames"`
		} `json:"namespaceSelector"`
		Endpoints []struct {
			Port          string `json:"port"`
			Path          string `json:"path"`
			Scheme        string `json:"scheme"`
			Interval      string `json:"interval"`
			ScrapeTimeout string `json:"scrapeTimeout"`
			Relabelings   []struct {
				TargetLabel string `json:"targetLabel"`
				Replacement string `json:"replacement"`
			} `json:"relabelings"`
		} `json:"endpoints"`
	} `json:"spec"`
}

// template renders the chart with v, lints it with the same values, and
// decodes every document.
func template(t *testing.T, release string, v values) *objects {
	t.Helper()
	return decodeAll(t, render(t, release, v))
}

// render lints the chart with v and returns what helm template renders with
// it, as text.
func render(t *testing.T, release string, v values) string {
	t.Helper()
	f := writeValues(t, v)
	if out, errOut, err := runHelm(t, "lint", chartDir, "--strict", "--namespace", namespace, "-f", f); err != nil {
		t.Fatalf("helm lint: %v\n%s%s", err, out, errOut)
	}
	out, errOut, err := runHelm(t, "template", release, chartDir, "--namespace", namespace, "-f", f)
	if err != nil {
		t.Fatalf("helm template: %v\n%s", err, errOut)
	}
	return out
}

// templateFails renders with v and returns helm's error output; rendering must fail.
func templateFails(t *testing.T, v values) string {
	t.Helper()
	out, errOut, err := runHelm(t, "template", "bad", chartDir, "--namespace", namespace, "-f", writeValues(t, v))
	if err == nil {
		t.Fatalf("helm template succeeded; want a refusal. Output:\n%s", out)
	}
	return errOut
}

func decodeAll(t *testing.T, stream string) *objects {
	t.Helper()
	o := &objects{
		deployments: map[string]*appsv1.Deployment{}, daemonSets: map[string]*appsv1.DaemonSet{},
		services: map[string]*corev1.Service{}, secrets: map[string]*corev1.Secret{},
		serviceAccounts: map[string]*corev1.ServiceAccount{}, pdbs: map[string]*policyv1.PodDisruptionBudget{},
		hpas: map[string]*autoscalingv2.HorizontalPodAutoscaler{}, ingresses: map[string]*networkingv1.Ingress{},
		serviceMonitors: map[string]*serviceMonitor{},
	}
	r := utilyaml.NewYAMLReader(bufio.NewReader(strings.NewReader(stream)))
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("splitting the rendered YAML: %v", err)
		}
		// Strict: duplicate keys are errors too.
		js, err := yaml.YAMLToJSONStrict(doc)
		if err != nil {
			t.Fatalf("YAML: %v\n%s", err, doc)
		}
		if s := strings.TrimSpace(string(js)); s == "null" || s == "" {
			continue // comments only
		}
		var tm metav1.TypeMeta
		if err := json.Unmarshal(js, &tm); err != nil {
			t.Fatalf("%v\n%s", err, doc)
		}
		id := tm.APIVersion + " " + tm.Kind
		o.kinds = append(o.kinds, tm.Kind)
		switch id {
		case "apps/v1 Deployment":
			x := new(appsv1.Deployment)
			strict(t, id, js, x)
			o.deployments[x.Name] = x
		case "apps/v1 DaemonSet":
			x := new(appsv1.DaemonSet)
			strict(t, id, js, x)
			o.daemonSets[x.Name] = x
		case "v1 Service":
			x := new(corev1.Service)
			strict(t, id, js, x)
			o.services[x.Name] = x
		case "v1 Secret":
			x := new(corev1.Secret)
			strict(t, id, js, x)
			o.secrets[x.Name] = x
		case "v1 ServiceAccount":
			x := new(corev1.ServiceAccount)
			strict(t, id, js, x)
			o.serviceAccounts[x.Name] = x
		case "policy/v1 PodDisruptionBudget":
			x := new(policyv1.PodDisruptionBudget)
			strict(t, id, js, x)
			o.pdbs[x.Name] = x
		case "autoscaling/v2 HorizontalPodAutoscaler":
			x := new(autoscalingv2.HorizontalPodAutoscaler)
			strict(t, id, js, x)
			o.hpas[x.Name] = x
		case "networking.k8s.io/v1 Ingress":
			x := new(networkingv1.Ingress)
			strict(t, id, js, x)
			o.ingresses[x.Name] = x
		case "monitoring.coreos.com/v1 ServiceMonitor":
			x := new(serviceMonitor)
			strict(t, id, js, x)
			o.serviceMonitors[x.Name] = x
		default:
			t.Fatalf("unexpected object %s in the rendered chart", id)
		}
	}
	sort.Strings(o.kinds)
	return o
}

// strict decodes js into x, refusing unknown fields and trailing data.
func strict(t *testing.T, id string, js []byte, x any) {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader(js))
	dec.DisallowUnknownFields()
	if err := dec.Decode(x); err != nil {
		t.Fatalf("%s does not decode strictly: %v\n%s", id, err, js)
	}
	if dec.More() {
		t.Fatalf("%s: trailing data", id)
	}
}

func (o *objects) wantKinds(t *testing.T, want ...string) {
	t.Helper()
	sort.Strings(want)
	if !slices.Equal(o.kinds, want) {
		t.Fatalf("rendered kinds %v, want %v", o.kinds, want)
	}
}

// flagValue returns the value of --name=V in args, and whether it is there.
func flagValue(args []string, name string) (string, bool) {
	for _, a := range args {
		if a == "--"+name {
			return "", true
		}
		if v, ok := strings.CutPrefix(a, "--"+name+"="); ok {
			return v, true
		}
	}
	return "", false
}

type podWant struct {
	gpu      bool // an nvidia.com/gpu limit of 1
	device   string
	scheme   corev1.URIScheme
	authFile string // the --auth-file path, mounted from authSecret
	authSec  string
	s3Secret string // the Secret AWS_* come from ("" for none)
	store    string
	tls      string // the TLS Secret ("" for none)
	grpc     int32  // the --grpc-listen port, 0 for none
	tracing  bool   // OTEL_* variables expected
}

// checkPod asserts what every Plover pod must be, whatever the values.
func checkPod(t *testing.T, tpl corev1.PodTemplateSpec, w podWant) {
	t.Helper()
	ps := tpl.Spec
	if len(ps.Containers) != 1 {
		t.Fatalf("%d containers, want 1", len(ps.Containers))
	}
	c := ps.Containers[0]

	// Flags plover serve gets (the image's entrypoint is plover serve).
	if len(c.Command) != 0 {
		t.Errorf("command %q overrides the image's entrypoint (tini -- plover serve)", c.Command)
	}
	wantFlags := map[string]string{
		"listen": "0.0.0.0:8080", "data": "/var/lib/plover", "device": w.device, "store": w.store,
		"metrics-listen": "0.0.0.0:9090", "auth-file": w.authFile,
	}
	for k, want := range wantFlags {
		got, ok := flagValue(c.Args, k)
		if !ok || got != want {
			t.Errorf("--%s = %q (present %v), want %q; args %q", k, got, ok, want, c.Args)
		}
	}
	if _, ok := flagValue(c.Args, "insecure-no-auth"); ok {
		t.Errorf("--insecure-no-auth with an auth file: %q", c.Args)
	}
	_, hasCert := flagValue(c.Args, "tls-cert")
	_, hasKey := flagValue(c.Args, "tls-key")
	if hasCert != (w.tls != "") || hasKey != (w.tls != "") {
		t.Errorf("--tls-cert/--tls-key present %v/%v, want %v: %q", hasCert, hasKey, w.tls != "", c.Args)
	}

	// Ports, probes.
	ports := map[string]int32{}
	for _, p := range c.Ports {
		ports[p.Name] = p.ContainerPort
	}
	if ports["http"] != 8080 || ports["metrics"] != 9090 {
		t.Errorf("container ports %v, want http 8080 and metrics 9090", ports)
	}
	// gRPC: the flag and the named port together, or neither.
	grpcListen, hasGRPC := flagValue(c.Args, "grpc-listen")
	switch {
	case w.grpc == 0 && (hasGRPC || ports["grpc"] != 0):
		t.Errorf("gRPC off, yet --grpc-listen %q (present %v), container port grpc %d", grpcListen, hasGRPC, ports["grpc"])
	case w.grpc != 0 && (grpcListen != fmt.Sprintf("0.0.0.0:%d", w.grpc) || ports["grpc"] != w.grpc):
		t.Errorf("--grpc-listen %q (present %v), container port grpc %d; want 0.0.0.0:%d and %d", grpcListen, hasGRPC, ports["grpc"], w.grpc, w.grpc)
	}
	for _, p := range c.Ports {
		if p.Protocol != corev1.ProtocolTCP {
			t.Errorf("container port %s protocol %q, want TCP", p.Name, p.Protocol)
		}
	}
	probe := func(name string, p *corev1.Probe, path string) {
		if p == nil || p.HTTPGet == nil {
			t.Errorf("%s probe missing or not httpGet", name)
			return
		}
		g := p.HTTPGet
		if g.Path != path || g.Port != intstr.FromString("http") || g.Scheme != w.scheme {
			t.Errorf("%s probe %s %s %s, want %s on port http, scheme %s", name, g.Scheme, g.Port.String(), g.Path, path, w.scheme)
		}
	}
	probe("startup", c.StartupProbe, "/healthz")
	probe("liveness", c.LivenessProbe, "/healthz")
	// Readiness counts the devices' health, as /readyz does not (a pod
	// with a failed GPU would stay in the endpoints answering 503).
	probe("readiness", c.ReadinessProbe, "/v2/health/ready")

	// The GPU.
	q, has := c.Resources.Limits["nvidia.com/gpu"]
	if has != w.gpu || (w.gpu && !q.Equal(resource.MustParse("1"))) {
		t.Errorf("nvidia.com/gpu limit %v (present %v), want present %v with 1", q.String(), has, w.gpu)
	}
	if _, has := c.Resources.Requests["nvidia.com/gpu"]; has && !w.gpu {
		t.Errorf("nvidia.com/gpu requested on a CPU-only pod")
	}

	// Security.
	psc, sc := ps.SecurityContext, c.SecurityContext
	if psc == nil || sc == nil {
		t.Fatal("pod or container securityContext missing")
	}
	if psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot || sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot {
		t.Error("runAsNonRoot is not true on the pod and the container")
	}
	if sc.RunAsUser == nil || *sc.RunAsUser != 10001 || psc.RunAsUser == nil || *psc.RunAsUser != 10001 {
		t.Error("runAsUser is not 10001")
	}
	if sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
		t.Error("allowPrivilegeEscalation is not false")
	}
	if sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
		t.Error("readOnlyRootFilesystem is not true")
	}
	if sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) || len(sc.Capabilities.Add) != 0 {
		t.Errorf("capabilities %+v, want drop [ALL] and no add", sc.Capabilities)
	}
	if psc.SeccompProfile == nil || psc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("pod seccompProfile %+v, want RuntimeDefault", psc.SeccompProfile)
	}
	if ps.AutomountServiceAccountToken == nil || *ps.AutomountServiceAccountToken {
		t.Error("the service account token is mounted; plover never uses the API")
	}

	// Volumes: data writable, secrets read-only where plover is told to look.
	vols := map[string]corev1.Volume{}
	for _, v := range ps.Volumes {
		vols[v.Name] = v
	}
	mounts := map[string]corev1.VolumeMount{}
	for _, m := range c.VolumeMounts {
		mounts[m.MountPath] = m
	}
	if m, ok := mounts["/var/lib/plover"]; !ok || m.ReadOnly {
		t.Errorf("no writable volume at /var/lib/plover (the root filesystem is read-only): %+v", c.VolumeMounts)
	} else if v := vols[m.Name]; v.EmptyDir == nil && v.Ephemeral == nil {
		t.Errorf("/var/lib/plover is volume %+v, want an emptyDir or ephemeral one", v)
	}
	secretAt := func(dir, file, secret string) {
		m, ok := mounts[dir]
		if !ok {
			t.Errorf("nothing mounted at %s", dir)
			return
		}
		if !m.ReadOnly {
			t.Errorf("%s is not mounted read-only", dir)
		}
		if m.SubPath != "" {
			t.Errorf("%s mounted with subPath: kubelet would never refresh it", dir)
		}
		v := vols[m.Name]
		if v.Secret == nil || v.Secret.SecretName != secret {
			t.Errorf("%s is volume %+v, want Secret %s", dir, v.VolumeSource, secret)
		}
		if filepath.Dir(file) != dir {
			t.Errorf("%s is not under %s", file, dir)
		}
	}
	secretAt("/etc/plover/auth", w.authFile, w.authSec)
	if w.tls != "" {
		cert, _ := flagValue(c.Args, "tls-cert")
		key, _ := flagValue(c.Args, "tls-key")
		secretAt("/etc/plover/tls", cert, w.tls)
		secretAt("/etc/plover/tls", key, w.tls)
	}

	// Store credentials from a Secret, never literal.
	env := map[string]corev1.EnvVar{}
	for _, e := range c.Env {
		env[e.Name] = e
		if (strings.HasPrefix(e.Name, "AWS_") || e.Name == "OTEL_EXPORTER_OTLP_HEADERS") && e.Value != "" {
			t.Errorf("%s given as a literal value", e.Name)
		}
		if !w.tracing && (strings.HasPrefix(e.Name, "OTEL_") || strings.HasPrefix(e.Name, "K8S_")) {
			t.Errorf("%s set with tracing off", e.Name)
		}
	}
	if _, ok := env["OTEL_EXPORTER_OTLP_ENDPOINT"]; ok != w.tracing {
		t.Errorf("OTEL_EXPORTER_OTLP_ENDPOINT present %v, want %v", ok, w.tracing)
	}
	for _, k := range []string{"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"} {
		e, ok := env[k]
		switch {
		case w.s3Secret == "" && ok:
			t.Errorf("%s set without an s3 store", k)
		case w.s3Secret != "" && (!ok || e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil ||
			e.ValueFrom.SecretKeyRef.Name != w.s3Secret || e.ValueFrom.SecretKeyRef.Key != k):
			t.Errorf("%s = %+v, want key %s of Secret %s", k, e, k, w.s3Secret)
		}
	}

	// Shutdown: the pod must outlive preStop's sleep plus plover's --grace.
	pre := c.Lifecycle
	if pre == nil || pre.PreStop == nil || pre.PreStop.Exec == nil || len(pre.PreStop.Exec.Command) != 2 || pre.PreStop.Exec.Command[0] != "sleep" {
		t.Fatalf("preStop %+v, want exec [sleep N]", pre)
	}
	sleep, err := strconv.Atoi(pre.PreStop.Exec.Command[1])
	if err != nil || sleep < 1 {
		t.Errorf("preStop sleep %q", pre.PreStop.Exec.Command[1])
	}
	g, _ := flagValue(c.Args, "grace")
	grace, err := time.ParseDuration(g)
	if err != nil {
		t.Fatalf("--grace %q: %v", g, err)
	}
	if ps.TerminationGracePeriodSeconds == nil {
		t.Fatal("no terminationGracePeriodSeconds")
	}
	need := time.Duration(sleep)*time.Second + grace
	if got := time.Duration(*ps.TerminationGracePeriodSeconds) * time.Second; got < need {
		t.Errorf("terminationGracePeriodSeconds %v < preStop %ds + --grace %v", got, sleep, grace)
	}
	// And --grace must cover the request deadline, or a rollout cuts
	// requests still within it: a --timeout, else PLOVER_TIMEOUT, else
	// plover's default.
	timeout := serveDuration(t, "defaultTimeout")
	for _, e := range c.Env {
		if e.Name == "PLOVER_TIMEOUT" && e.ValueFrom != nil {
			timeout = 0 // read at run time: nothing to check here
		} else if e.Name == "PLOVER_TIMEOUT" {
			if timeout, err = time.ParseDuration(e.Value); err != nil {
				t.Fatalf("PLOVER_TIMEOUT %q: %v", e.Value, err)
			}
		}
	}
	for i, a := range c.Args { // the last --timeout wins, in either spelling
		d, ok := strings.CutPrefix(a, "--timeout=")
		if a == "--timeout" && i+1 < len(c.Args) {
			d, ok = c.Args[i+1], true
		}
		if ok {
			if timeout, err = time.ParseDuration(d); err != nil {
				t.Fatalf("--timeout %q: %v", d, err)
			}
		}
	}
	if grace < timeout {
		t.Errorf("--grace %v is shorter than the request deadline --timeout %v", grace, timeout)
	}
}

// TestDrainCoversTheRequestTimeout: the default --grace covers plover's
// default request deadline with time to spare, and an explicit --timeout
// (server.extraArgs, either spelling, or PLOVER_TIMEOUT in env) longer than
// server.graceSeconds is refused, saying what to raise; so is a grace
// below plover's default --timeout where none is given.
func TestDrainCoversTheRequestTimeout(t *testing.T) {
	c := template(t, "plover", required()).deployments["plover"].Spec.Template.Spec.Containers[0]
	g, _ := flagValue(c.Args, "grace")
	if grace, err := time.ParseDuration(g); err != nil || grace <= serveDuration(t, "defaultTimeout") {
		t.Errorf("default --grace %q, want more than plover serve's default --timeout %v", g, serveDuration(t, "defaultTimeout"))
	}
	env := func(v string) []any { return []any{map[string]any{"name": "PLOVER_TIMEOUT", "value": v}} }
	def := serveDuration(t, "defaultTimeout")
	defSecs := int(def.Seconds())
	for _, tc := range []struct {
		name string
		v    values
		want string // "": renders
	}{
		{"--timeout=35s, the grace", required().set("server.extraArgs", []any{"--timeout=35s"}), ""},
		{"--timeout=10s", required().set("server.extraArgs", []any{"--max-instances=8", "--timeout=10s"}), ""},
		{"--timeout=1500ms", required().set("server.extraArgs", []any{"--timeout=1500ms"}), ""},
		{"--timeout=36s", required().set("server.extraArgs", []any{"--timeout=36s"}),
			"server.extraArgs --timeout 36s is longer than server.graceSeconds (35): a rollout would cut requests still within their deadline; set server.graceSeconds to 36 or more"},
		{"--timeout=35.5s rounds up", required().set("server.extraArgs", []any{"--timeout=35.5s"}), "set server.graceSeconds to 36 or more"},
		{"--timeout 1m30s, two args", required().set("server.extraArgs", []any{"--timeout", "1m30s"}), "set server.graceSeconds to 90 or more"},
		{"the last --timeout wins", required().set("server.extraArgs", []any{"--timeout=5m", "--timeout=20s"}), ""},
		{"a raised grace", required().set("server.graceSeconds", 120).set("server.extraArgs", []any{"--timeout=2m"}), ""},
		{"PLOVER_TIMEOUT", required().set("env", env("1m")), "env PLOVER_TIMEOUT 1m is longer than server.graceSeconds (35)"},
		{"the flag wins over PLOVER_TIMEOUT", required().set("env", env("1h")).set("server.extraArgs", []any{"--timeout=30s"}), ""},
		{"not a duration", required().set("server.extraArgs", []any{"--timeout=45"}), `server.extraArgs --timeout "45": want a Go duration`},
		// What time.ParseDuration takes, the chart takes.
		{"--timeout=.5s", required().set("server.extraArgs", []any{"--timeout=.5s"}), ""},
		{"--timeout=+30s", required().set("server.extraArgs", []any{"--timeout=+30s"}), ""},
		{"--timeout=1.5m", required().set("server.extraArgs", []any{"--timeout=1.5m"}), "set server.graceSeconds to 90 or more"},
		{"--timeout in μs (Greek mu)", required().set("server.extraArgs", []any{"--timeout=40000000μs"}), "set server.graceSeconds to 40 or more"},
		{"--timeout=.", required().set("server.extraArgs", []any{"--timeout=.s"}), "want a Go duration"},
		{"a negative --timeout", required().set("server.extraArgs", []any{"--timeout=-30s"}), "want a Go duration"},
		{"-timeout, one dash", required().set("server.extraArgs", []any{"-timeout=36s"}), "set server.graceSeconds to 36 or more"},
		{"-timeout D, one dash", required().set("server.extraArgs", []any{"-timeout", "2m"}), "set server.graceSeconds to 120 or more"},
		// No --timeout: plover's default is the deadline, and a grace
		// lowered below it cut requests as a longer --timeout did.
		{"no --timeout, a grace below plover's default", required().set("server.graceSeconds", defSecs-1),
			fmt.Sprintf("plover serve's default --timeout %v is longer than server.graceSeconds (%d): a rollout would cut requests still within their deadline; set server.graceSeconds to %d or more", def, defSecs-1, defSecs)},
		{"no --timeout, the grace at plover's default", required().set("server.graceSeconds", defSecs), ""},
		{"a shorter --timeout under a lowered grace", required().set("server.graceSeconds", 10).set("server.extraArgs", []any{"--timeout=10s"}), ""},
		{"a shorter PLOVER_TIMEOUT under a lowered grace", required().set("server.graceSeconds", 10).set("env", env("10s")), ""},
		// Read at run time: the chart cannot check it, and does not hold it
		// to the default's 30 s (it refused a grace of 15 s so).
		{"PLOVER_TIMEOUT from a ConfigMap under a lowered grace", required().set("server.graceSeconds", 15).set("env", []any{map[string]any{"name": "PLOVER_TIMEOUT",
			"valueFrom": map[string]any{"configMapKeyRef": map[string]any{"name": "plover-timeouts", "key": "timeout"}}}}), ""},
		// plover serve refuses --timeout 0 at start, saying so.
		{"--timeout=0 left to plover", required().set("server.graceSeconds", 10).set("server.extraArgs", []any{"--timeout=0"}), ""},
		// --grace is the chart's: the pods' termination grace is computed
		// from server.graceSeconds, so one in extraArgs would be cut.
		{"--grace in extraArgs", required().set("server.extraArgs", []any{"--grace=60s"}), "server.extraArgs --grace=60s: set server.graceSeconds instead"},
		{"-grace D in extraArgs", required().set("server.extraArgs", []any{"-grace", "60s"}), "server.extraArgs -grace: set server.graceSeconds instead"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.want == "" {
				d := template(t, "plover", tc.v).deployments["plover"]
				checkPod(t, d.Spec.Template, podWant{
					gpu: true, device: "cuda", scheme: corev1.URISchemeHTTP,
					authFile: "/etc/plover/auth/tokens", authSec: "plover-auth", s3Secret: "plover-s3",
					store: "s3://plover-bundles/prod",
				})
				return
			}
			if out := templateFails(t, tc.v); !strings.Contains(out, tc.want) {
				t.Errorf("helm template failed without %q:\n%s", tc.want, out)
			}
		})
	}
}

// checkService: the API's Service selects the pods and maps to their named
// ports, never to the metrics port (checkMetricsService).
func checkService(t *testing.T, o *objects, name string, podLabels map[string]string, port int32, portName string) *corev1.Service {
	t.Helper()
	s := o.services[name]
	if s == nil {
		t.Fatalf("no Service %s", name)
	}
	if s.Spec.Type != corev1.ServiceTypeClusterIP {
		t.Errorf("Service type %s", s.Spec.Type)
	}
	for k, v := range s.Spec.Selector {
		if podLabels[k] != v {
			t.Errorf("Service selector %v does not select pods labelled %v", s.Spec.Selector, podLabels)
		}
	}
	ports := map[string]corev1.ServicePort{}
	for _, p := range s.Spec.Ports {
		ports[p.Name] = p
	}
	if p := ports[portName]; p.Port != port || p.TargetPort != intstr.FromString("http") {
		t.Errorf("Service port %s = %+v, want %d -> http", portName, p, port)
	}
	for _, p := range s.Spec.Ports {
		if p.Name == "metrics" || p.TargetPort == intstr.FromString("metrics") || p.Port == 9090 {
			t.Errorf("the API's Service %s has port %+v: the unauthenticated metrics port belongs on its own ClusterIP Service", name, p)
		}
	}
	return s
}

// checkMetricsService: the metrics port's own Service, NAME-metrics, is
// ClusterIP whatever service.type is, selects the pods and maps 9090 to
// their metrics port, and nothing else.
func checkMetricsService(t *testing.T, o *objects, name string, podLabels map[string]string) *corev1.Service {
	t.Helper()
	s := o.services[name+"-metrics"]
	if s == nil {
		t.Fatalf("no Service %s-metrics: %v", name, slices.Sorted(maps.Keys(o.services)))
	}
	if s.Spec.Type != corev1.ServiceTypeClusterIP {
		t.Errorf("metrics Service type %s, want ClusterIP: its port has no authentication", s.Spec.Type)
	}
	if len(s.Spec.Selector) == 0 {
		t.Errorf("metrics Service selects nothing")
	}
	for k, v := range s.Spec.Selector {
		if podLabels[k] != v {
			t.Errorf("metrics Service selector %v does not select pods labelled %v", s.Spec.Selector, podLabels)
		}
	}
	if len(s.Spec.Ports) != 1 {
		t.Fatalf("metrics Service ports %+v, want metrics only", s.Spec.Ports)
	}
	if p := s.Spec.Ports[0]; p.Name != "metrics" || p.Port != 9090 || p.TargetPort != intstr.FromString("metrics") || p.Protocol != corev1.ProtocolTCP {
		t.Errorf("metrics Service port %+v, want metrics 9090 -> metrics, TCP", p)
	}
	return s
}

// checkGRPCService: the Service's grpc port maps port -> the pods' grpc port
// (port 0: no such Service port).
func checkGRPCService(t *testing.T, s *corev1.Service, port int32, appProtocol string) {
	t.Helper()
	var got []corev1.ServicePort
	for _, p := range s.Spec.Ports {
		if p.Name == "grpc" || p.TargetPort == intstr.FromString("grpc") || (port != 0 && p.Port == port) {
			got = append(got, p)
		}
	}
	if port == 0 {
		if len(got) != 0 {
			t.Errorf("Service %s has gRPC ports %+v with gRPC off", s.Name, got)
		}
		return
	}
	if len(got) != 1 {
		t.Fatalf("Service %s gRPC ports %+v, want one", s.Name, got)
	}
	p := got[0]
	if p.Name != "grpc" || p.Port != port || p.TargetPort != intstr.FromString("grpc") || p.Protocol != corev1.ProtocolTCP {
		t.Errorf("Service gRPC port %s %d -> %s %s, want grpc %d -> grpc, TCP", p.Name, p.Port, p.TargetPort.String(), p.Protocol, port)
	}
	gotApp := ""
	if p.AppProtocol != nil {
		gotApp = *p.AppProtocol
	}
	if gotApp != appProtocol {
		t.Errorf("Service gRPC port appProtocol %q, want %q", gotApp, appProtocol)
	}
}

func checkPDB(t *testing.T, o *objects, name string, podLabels map[string]string) {
	t.Helper()
	p := o.pdbs[name]
	if p == nil {
		t.Fatalf("no PodDisruptionBudget %s", name)
	}
	if p.Spec.MaxUnavailable == nil || *p.Spec.MaxUnavailable != intstr.FromInt32(1) || p.Spec.MinAvailable != nil {
		t.Errorf("PDB maxUnavailable %v minAvailable %v, want maxUnavailable 1", p.Spec.MaxUnavailable, p.Spec.MinAvailable)
	}
	sel, err := metav1.LabelSelectorAsSelector(p.Spec.Selector)
	if err != nil || sel.Empty() {
		t.Fatalf("PDB selector %v: %v", p.Spec.Selector, err)
	}
	if !selects(p.Spec.Selector, podLabels) {
		t.Errorf("PDB selector %v does not select pods labelled %v", p.Spec.Selector, podLabels)
	}
}

func selects(s *metav1.LabelSelector, labels map[string]string) bool {
	sel, err := metav1.LabelSelectorAsSelector(s)
	if err != nil {
		return false
	}
	return sel.Matches(k8slabels.Set(labels))
}

func TestDefaults(t *testing.T) {
	o := template(t, "plover", required())
	o.wantKinds(t, "Deployment", "Service", "Service", "PodDisruptionBudget", "ServiceAccount")
	d := o.deployments["plover"]
	if d == nil {
		t.Fatalf("no Deployment plover (release plover must not become plover-plover): %v", o.deployments)
	}
	if d.Spec.Replicas == nil || *d.Spec.Replicas != 2 {
		t.Errorf("replicas %v, want 2", d.Spec.Replicas)
	}
	if !selects(d.Spec.Selector, d.Spec.Template.Labels) {
		t.Errorf("Deployment selector %v does not select its own pods %v", d.Spec.Selector, d.Spec.Template.Labels)
	}
	if ru := d.Spec.Strategy.RollingUpdate; ru == nil || ru.MaxSurge == nil || *ru.MaxSurge != intstr.FromInt32(0) {
		t.Errorf("rolling update %+v, want maxSurge 0 (no spare GPU needed)", ru)
	}
	checkPod(t, d.Spec.Template, podWant{
		gpu: true, device: "cuda", scheme: corev1.URISchemeHTTP,
		authFile: "/etc/plover/auth/tokens", authSec: "plover-auth", s3Secret: "plover-s3",
		store: "s3://plover-bundles/prod",
	})
	args := d.Spec.Template.Spec.Containers[0].Args
	for k, want := range map[string]string{"s3-endpoint": "minio.storage.svc:9000", "s3-region": "us-east-1", "grace": "35s"} {
		if got, _ := flagValue(args, k); got != want {
			t.Errorf("--%s = %q, want %q", k, got, want)
		}
	}
	if got := *d.Spec.Template.Spec.TerminationGracePeriodSeconds; got != 45 {
		t.Errorf("terminationGracePeriodSeconds %d, want 5 + 35 + 5", got)
	}
	svc := checkService(t, o, "plover", d.Spec.Template.Labels, 80, "http")
	checkMetricsService(t, o, "plover", d.Spec.Template.Labels)
	checkGRPCService(t, svc, 0, "")
	checkPDB(t, o, "plover", d.Spec.Template.Labels)
	if sa := o.serviceAccounts["plover"]; sa == nil || d.Spec.Template.Spec.ServiceAccountName != "plover" {
		t.Errorf("ServiceAccount plover missing or not used (%q)", d.Spec.Template.Spec.ServiceAccountName)
	}
}

func TestCPUOnly(t *testing.T) {
	v := required().set("gpu.enabled", false).set("kind", "Deployment").
		set("data.type", "ephemeral").set("data.storageClassName", "local-ssd").set("data.sizeLimit", "50Gi")
	o := template(t, "edge", v)
	d := o.deployments["edge-plover"]
	if d == nil {
		t.Fatalf("no Deployment edge-plover: %v", o.deployments)
	}
	checkPod(t, d.Spec.Template, podWant{
		gpu: false, device: "host", scheme: corev1.URISchemeHTTP,
		authFile: "/etc/plover/auth/tokens", authSec: "plover-auth", s3Secret: "plover-s3",
		store: "s3://plover-bundles/prod",
	})
	if d.Spec.Template.Spec.RuntimeClassName != nil {
		t.Errorf("runtimeClassName %q on a CPU-only pod", *d.Spec.Template.Spec.RuntimeClassName)
	}
	for _, vol := range d.Spec.Template.Spec.Volumes {
		if vol.Name != "data" {
			continue
		}
		e := vol.Ephemeral
		if e == nil || e.VolumeClaimTemplate == nil {
			t.Fatalf("data volume %+v, want a generic ephemeral volume", vol.VolumeSource)
		}
		spec := e.VolumeClaimTemplate.Spec
		if spec.StorageClassName == nil || *spec.StorageClassName != "local-ssd" ||
			!spec.Resources.Requests.Storage().Equal(resource.MustParse("50Gi")) {
			t.Errorf("data claim %+v, want 50Gi of local-ssd", spec)
		}
	}
}

func TestDaemonSet(t *testing.T) {
	v := required().
		set("kind", "DaemonSet").
		set("gpu.runtimeClassName", "nvidia").
		set("nodeSelector", map[string]any{"nvidia.com/gpu.present": "true"}).
		set("tolerations", []any{map[string]any{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}})
	o := template(t, "gpu", v)
	o.wantKinds(t, "DaemonSet", "Service", "Service", "PodDisruptionBudget", "ServiceAccount")
	ds := o.daemonSets["gpu-plover"]
	if ds == nil {
		t.Fatalf("no DaemonSet gpu-plover: %v", o.daemonSets)
	}
	ps := ds.Spec.Template.Spec
	if ps.NodeSelector["nvidia.com/gpu.present"] != "true" || len(ps.Tolerations) != 1 {
		t.Errorf("nodeSelector %v tolerations %v not passed through", ps.NodeSelector, ps.Tolerations)
	}
	if ps.RuntimeClassName == nil || *ps.RuntimeClassName != "nvidia" {
		t.Errorf("runtimeClassName %v, want nvidia", ps.RuntimeClassName)
	}
	if ds.Spec.UpdateStrategy.Type != appsv1.RollingUpdateDaemonSetStrategyType {
		t.Errorf("update strategy %v", ds.Spec.UpdateStrategy)
	}
	checkPod(t, ds.Spec.Template, podWant{
		gpu: true, device: "cuda", scheme: corev1.URISchemeHTTP,
		authFile: "/etc/plover/auth/tokens", authSec: "plover-auth", s3Secret: "plover-s3",
		store: "s3://plover-bundles/prod",
	})
	checkPDB(t, o, "gpu-plover", ds.Spec.Template.Labels)
}

// TestFull: TLS, the ingress, the ServiceMonitor, the autoscaler, and Secrets
// the chart creates itself.
func TestFull(t *testing.T) {
	tokens := "ci deploy 4f2c0000000000000000000000000000000000000000000000000000000000aa cnn,vec*\n"
	v := values{}.
		set("s3.bucket", "plover-bundles").
		set("s3.createSecret", true).
		set("s3.accessKeyId", "AKIAEXAMPLE").
		set("s3.secretAccessKey", "secret/example").
		set("auth.tokens", tokens).
		set("tls.enabled", true).
		set("tls.secretName", "plover-tls").
		set("server.graceSeconds", 40).
		set("preStopSleepSeconds", 10).
		set("serviceMonitor.enabled", true).
		set("serviceMonitor.labels", map[string]any{"release": "prometheus"}).
		set("autoscaling.enabled", true).
		set("ingress.enabled", true).
		set("ingress.hashBySubsetSize", 2).
		set("ingress.tls", []any{map[string]any{"secretName": "plover-ingress-tls", "hosts": []any{"plover.example.com"}}})
	o := template(t, "plover", v)
	o.wantKinds(t, "Deployment", "Service", "Service", "PodDisruptionBudget", "ServiceAccount", "Secret", "Secret",
		"HorizontalPodAutoscaler", "Ingress", "ServiceMonitor")

	d := o.deployments["plover"]
	if d == nil {
		t.Fatal("no Deployment plover")
	}
	if d.Spec.Replicas != nil {
		t.Errorf("replicas %d set with an autoscaler: every helm upgrade would undo its scaling", *d.Spec.Replicas)
	}
	checkPod(t, d.Spec.Template, podWant{
		gpu: true, device: "cuda", scheme: corev1.URISchemeHTTPS,
		authFile: "/etc/plover/auth/tokens", authSec: "plover-auth", s3Secret: "plover-s3",
		store: "s3://plover-bundles", tls: "plover-tls",
	})
	if got := *d.Spec.Template.Spec.TerminationGracePeriodSeconds; got < 50 {
		t.Errorf("terminationGracePeriodSeconds %d < 10 + 40", got)
	}
	ann := d.Spec.Template.Annotations
	if ann["checksum/auth"] == "" || ann["checksum/s3"] == "" {
		t.Errorf("pod annotations %v: want checksums of the Secrets the chart makes, so changing them rolls the pods", ann)
	}

	// Secrets made from values.
	if s := o.secrets["plover-auth"]; s == nil || string(s.Data["tokens"]) != tokens {
		t.Errorf("auth Secret %+v, want key tokens = the auth file", s)
	}
	if s := o.secrets["plover-s3"]; s == nil || string(s.Data["AWS_ACCESS_KEY_ID"]) != "AKIAEXAMPLE" || string(s.Data["AWS_SECRET_ACCESS_KEY"]) != "secret/example" {
		t.Errorf("S3 Secret %+v", s)
	}

	svc := checkService(t, o, "plover", d.Spec.Template.Labels, 443, "https")
	metricsSvc := checkMetricsService(t, o, "plover", d.Spec.Template.Labels)
	checkGRPCService(t, svc, 0, "")
	checkPDB(t, o, "plover", d.Spec.Template.Labels)

	// The autoscaler: the Deployment, on the queue-depth metric the server exports.
	h := o.hpas["plover"]
	if h == nil {
		t.Fatal("no HorizontalPodAutoscaler plover")
	}
	if r := h.Spec.ScaleTargetRef; r.Kind != "Deployment" || r.Name != d.Name || r.APIVersion != "apps/v1" {
		t.Errorf("scaleTargetRef %+v, want apps/v1 Deployment %s", r, d.Name)
	}
	if h.Spec.MinReplicas == nil || *h.Spec.MinReplicas < 1 || h.Spec.MaxReplicas < *h.Spec.MinReplicas {
		t.Errorf("replicas %v..%d", h.Spec.MinReplicas, h.Spec.MaxReplicas)
	}
	if len(h.Spec.Metrics) != 1 || h.Spec.Metrics[0].Type != autoscalingv2.PodsMetricSourceType || h.Spec.Metrics[0].Pods == nil {
		t.Fatalf("HPA metrics %+v, want one Pods metric", h.Spec.Metrics)
	}
	pm := h.Spec.Metrics[0].Pods
	if pm.Metric.Name != queueMetric || pm.Target.Type != autoscalingv2.AverageValueMetricType || pm.Target.AverageValue == nil {
		t.Errorf("HPA metric %+v, want %s with an AverageValue target", pm, queueMetric)
	}
	exportedMetric(t, pm.Metric.Name)

	// The ServiceMonitor scrapes the metrics Service's port, and keeps the
	// series' service label the release's fullname (the External HPA's
	// selector, KEDA's query in the README).
	checkServiceMonitor(t, o, "plover", metricsSvc, svc)
	sm := o.serviceMonitors["plover"]
	if sm.Labels["release"] != "prometheus" {
		t.Errorf("ServiceMonitor labels %v lack serviceMonitor.labels", sm.Labels)
	}
	if !slices.Equal(sm.Spec.NamespaceSelector.MatchNames, []string{namespace}) {
		t.Errorf("ServiceMonitor namespaces %v", sm.Spec.NamespaceSelector.MatchNames)
	}

	// The ingress: hashed per function, HTTPS to the pods, bodies up to --max-body.
	ing := o.ingresses["plover"]
	if ing == nil {
		t.Fatal("no Ingress plover")
	}
	a := ing.Annotations
	for k, want := range map[string]string{
		"nginx.ingress.kubernetes.io/upstream-hash-by":             "$uri",
		"nginx.ingress.kubernetes.io/upstream-hash-by-subset":      "true",
		"nginx.ingress.kubernetes.io/upstream-hash-by-subset-size": "2",
		"nginx.ingress.kubernetes.io/backend-protocol":             "HTTPS",
		"nginx.ingress.kubernetes.io/proxy-body-size":              "256m",
		"nginx.ingress.kubernetes.io/proxy-read-timeout":           "610",
	} {
		if a[k] != want {
			t.Errorf("Ingress annotation %s = %q, want %q", k, a[k], want)
		}
	}
	if ing.Spec.IngressClassName == nil || *ing.Spec.IngressClassName != "nginx" {
		t.Errorf("ingressClassName %v", ing.Spec.IngressClassName)
	}
	if len(ing.Spec.TLS) != 1 || ing.Spec.TLS[0].SecretName != "plover-ingress-tls" {
		t.Errorf("Ingress TLS %+v", ing.Spec.TLS)
	}
	if len(ing.Spec.Rules) != 1 || ing.Spec.Rules[0].HTTP == nil || len(ing.Spec.Rules[0].HTTP.Paths) != 1 {
		t.Fatalf("Ingress rules %+v", ing.Spec.Rules)
	}
	b := ing.Spec.Rules[0].HTTP.Paths[0].Backend.Service
	if b == nil || b.Name != svc.Name || b.Port.Number != 443 {
		t.Errorf("Ingress backend %+v, want Service %s port 443", b, svc.Name)
	}
}

// checkServiceMonitor: ServiceMonitor NAME selects the metrics Service and
// not the API's, scrapes its metrics port at /metrics, and relabels the
// series' service label to NAME.
func checkServiceMonitor(t *testing.T, o *objects, name string, metricsSvc, apiSvc *corev1.Service) {
	t.Helper()
	sm := o.serviceMonitors[name]
	if sm == nil {
		t.Fatalf("no ServiceMonitor %s", name)
	}
	if !selects(&sm.Spec.Selector, metricsSvc.Labels) {
		t.Errorf("ServiceMonitor selector %v does not select the metrics Service (labels %v)", sm.Spec.Selector, metricsSvc.Labels)
	}
	if selects(&sm.Spec.Selector, apiSvc.Labels) {
		t.Errorf("ServiceMonitor selector %v selects the API's Service too (labels %v)", sm.Spec.Selector, apiSvc.Labels)
	}
	if len(sm.Spec.Endpoints) != 1 || sm.Spec.Endpoints[0].Port != "metrics" || sm.Spec.Endpoints[0].Path != "/metrics" {
		t.Fatalf("ServiceMonitor endpoints %+v, want port metrics, /metrics", sm.Spec.Endpoints)
	}
	r := sm.Spec.Endpoints[0].Relabelings
	if len(r) != 1 || r[0].TargetLabel != "service" || r[0].Replacement != name {
		t.Errorf("ServiceMonitor relabelings %+v, want service=%s", r, name)
	}
}

// TestMetricsServiceStaysInTheCluster: the unauthenticated metrics port is on
// a ClusterIP Service of its own, whatever type the API's Service has, so that
// service.type=LoadBalancer publishes the API (whose /metrics needs a read
// token) and not it; metrics.enabled=false makes no such Service.
func TestMetricsServiceStaysInTheCluster(t *testing.T) {
	for _, typ := range []corev1.ServiceType{corev1.ServiceTypeClusterIP, corev1.ServiceTypeLoadBalancer, corev1.ServiceTypeNodePort} {
		t.Run(string(typ), func(t *testing.T) {
			o := template(t, "edge", required().set("service.type", string(typ)).set("serviceMonitor.enabled", true))
			d := o.deployments["edge-plover"]
			if d == nil {
				t.Fatalf("no Deployment edge-plover: %v", o.deployments)
			}
			api := o.services["edge-plover"]
			if api == nil || api.Spec.Type != typ {
				t.Fatalf("API Service %+v, want type %s", api, typ)
			}
			for _, p := range api.Spec.Ports {
				if p.Name == "metrics" || p.TargetPort == intstr.FromString("metrics") || p.Port == 9090 {
					t.Errorf("the %s API Service has port %+v: the metrics port would go out with it", typ, p)
				}
			}
			m := checkMetricsService(t, o, "edge-plover", d.Spec.Template.Labels)
			checkServiceMonitor(t, o, "edge-plover", m, api)
		})
	}
	t.Run("metrics off", func(t *testing.T) {
		o := template(t, "plover", required().set("metrics.enabled", false).set("service.type", "LoadBalancer"))
		o.wantKinds(t, "Deployment", "Service", "PodDisruptionBudget", "ServiceAccount")
		if _, ok := o.services["plover-metrics"]; ok {
			t.Errorf("a metrics Service with metrics.enabled=false")
		}
	})
}

// TestExternalMetric: the autoscaler on an External metric, scoped to this release.
func TestExternalMetric(t *testing.T) {
	v := required().
		set("serviceMonitor.enabled", true).
		set("autoscaling.enabled", true).
		set("autoscaling.metricType", "External").
		set("autoscaling.extraMetrics", []any{map[string]any{
			"type": "Resource", "resource": map[string]any{"name": "cpu", "target": map[string]any{"type": "Utilization", "averageUtilization": 80}},
		}})
	o := template(t, "plover", v)
	h := o.hpas["plover"]
	if h == nil || len(h.Spec.Metrics) != 2 {
		t.Fatalf("HPA %+v, want the external metric and the extra one", h)
	}
	e := h.Spec.Metrics[0].External
	if e == nil || e.Metric.Name != queueMetric || e.Metric.Selector == nil || e.Metric.Selector.MatchLabels["service"] != "plover" {
		t.Errorf("external metric %+v, want %s for service plover", e, queueMetric)
	}
	if r := h.Spec.Metrics[1].Resource; r == nil || r.Name != corev1.ResourceCPU {
		t.Errorf("extra metric %+v", h.Spec.Metrics[1])
	}
}

// TestReplicaCountNull: replicaCount null leaves replicas to an external
// autoscaler (KEDA), as autoscaling.enabled does for the chart's own HPA.
func TestReplicaCountNull(t *testing.T) {
	o := template(t, "plover", required().set("replicaCount", nil))
	if r := o.deployments["plover"].Spec.Replicas; r != nil {
		t.Errorf("replicas %d with replicaCount null", *r)
	}
	if len(o.hpas) != 0 {
		t.Errorf("an HPA without autoscaling.enabled")
	}
}

// exportedMetric fails unless the server registers a metric of that name.
func exportedMetric(t *testing.T, name string) {
	t.Helper()
	src, err := os.ReadFile(collectorFile)
	if err != nil {
		t.Fatalf("reading the server's collector to check the metric name: %v", err)
	}
	if !bytes.Contains(src, []byte(strconv.Quote(name))) {
		t.Errorf("the autoscaler scales on %s, which %s does not export", name, collectorFile)
	}
}

// TestRefusals: values that would deploy something broken or unsafe fail the
// render with a message that says what to set.
func TestRefusals(t *testing.T) {
	cases := []struct {
		name string
		v    values
		want string
	}{
		{"no store", values{}.set("auth.existingSecret", "a"), "set s3.bucket"},
		{"no S3 credentials", values{}.set("s3.bucket", "b").set("auth.existingSecret", "a"), "needs credentials"},
		{"no auth", values{}.set("s3.bucket", "b").set("s3.existingSecret", "s"), "needs an auth file"},
		{"TLS without a Secret", required().set("tls.enabled", true), "tls.secretName"},
		{"autoscaling a DaemonSet", required().set("kind", "DaemonSet").set("autoscaling.enabled", true), "needs kind Deployment"},
		{"grace period too short", required().set("terminationGracePeriodSeconds", 20), "killed mid-drain"},
		{"ServiceMonitor without the metrics port", required().set("serviceMonitor.enabled", true).set("metrics.enabled", false), "metrics.enabled"},
		{"unknown kind", required().set("kind", "StatefulSet"), "want Deployment or DaemonSet"},
		{"gRPC port 0", required().set("grpc.enabled", true).set("grpc.port", 0), "grpc.port 0: want a port number"},
		{"gRPC port too high", required().set("grpc.enabled", true).set("grpc.port", 70000), "grpc.port 70000: want a port number"},
		{"gRPC port not a number", required().set("grpc.enabled", true).set("grpc.port", "grpc"), "want a port number"},
		{"gRPC port not an integer", required().set("grpc.enabled", true).set("grpc.port", 8001.5), "want a port number"},
		{"gRPC on the API port", required().set("grpc.enabled", true).set("grpc.port", 8080), "is server.port too"},
		{"gRPC on the metrics port", required().set("grpc.enabled", true).set("grpc.port", 9090), "is metrics.port too"},
		{"OTLP endpoint without a scheme", required().set("tracing.otlpEndpoint", "otel-collector:4318"), "with its scheme"},
		{"unknown OTLP protocol", tracingOn().set("tracing.protocol", "http/json"), "want http/protobuf or grpc"},
		{"unknown sampler", tracingOn().set("tracing.sampler", "probabilistic"), "tracing.sampler \"probabilistic\""},
		{"sampler ratio above 1", tracingOn().set("tracing.samplerArg", "1.5"), "want a ratio from 0 to 1"},
		{"sampler ratio not a number", tracingOn().set("tracing.sampler", "traceidratio").set("tracing.samplerArg", "ten percent"), "want a ratio from 0 to 1"},
		{"headers Secret without a key", tracingOn().set("tracing.headersSecret.name", "otel").set("tracing.headersSecret.key", ""), "needs tracing.headersSecret.key"},
		{"unknown worker scope", required().set("server.workerScope", "process"), `server.workerScope "process": want function or tenant`},
		{"image tag a number", required().set("image.tag", 1.1), "image.tag: a number"},
		{"image tag an integer", required().set("image.tag", 20260101), "image.tag: a number"},
		{"metrics on the API port", required().set("metrics.port", 8080), "metrics.port 8080 is server.port too"},
		// Listeners the probes, the Service, the Ingress and the
		// ServiceMonitor are derived from: one in extraArgs would win
		// (plover takes the last) and move a listener away from them.
		{"--listen in extraArgs", required().set("server.extraArgs", []any{"--listen=0.0.0.0:9000"}), "server.extraArgs --listen=0.0.0.0:9000: set server.port instead"},
		{"-listen D in extraArgs", required().set("server.extraArgs", []any{"-listen", "0.0.0.0:9000"}), "server.extraArgs -listen: set server.port instead"},
		{"--metrics-listen in extraArgs", required().set("server.extraArgs", []any{"--max-instances=8", "--metrics-listen=0.0.0.0:9100"}), "server.extraArgs --metrics-listen=0.0.0.0:9100: set metrics.enabled and metrics.port instead"},
		{"--metrics-listen D, metrics off", required().set("metrics.enabled", false).set("server.extraArgs", []any{"--metrics-listen", ":9100"}), "server.extraArgs --metrics-listen: set metrics.enabled and metrics.port instead"},
		{"--grpc-listen in extraArgs", required().set("grpc.enabled", true).set("server.extraArgs", []any{"--grpc-listen=0.0.0.0:9001"}), "server.extraArgs --grpc-listen=0.0.0.0:9001: set grpc.enabled and grpc.port instead"},
		{"-grpc-listen, gRPC off", required().set("server.extraArgs", []any{"-grpc-listen=:8001"}), "server.extraArgs -grpc-listen=:8001: set grpc.enabled and grpc.port instead"},
		// Flags the chart derives the probes' scheme, a memory check and the
		// Ingress's body limit from: one in extraArgs would slip past them.
		{"--tls-cert in extraArgs", required().set("server.extraArgs", []any{"--tls-cert=/c.pem", "--tls-key=/k.pem"}), "server.extraArgs --tls-cert=/c.pem: set tls.enabled and tls.secretName instead"},
		{"-tls-key D in extraArgs", required().set("server.extraArgs", []any{"-tls-key", "/k.pem"}), "server.extraArgs -tls-key: set tls.enabled and tls.secretName instead"},
		{"--tls-key, TLS on", required().set("tls.enabled", true).set("tls.secretName", "t").set("server.extraArgs", []any{"--tls-key=/k.pem"}), "server.extraArgs --tls-key=/k.pem: set tls.enabled and tls.secretName instead"},
		{"--cache-limit in extraArgs", required().set("server.extraArgs", []any{"--cache-limit=100000"}), "server.extraArgs --cache-limit=100000: set server.cacheLimitMiB instead"},
		{"--cache-limit D past a tmpfs", required().set("data.medium", "Memory").set("resources.limits.memory", "32Gi").set("server.extraArgs", []any{"--cache-limit", "100000"}), "server.extraArgs --cache-limit: set server.cacheLimitMiB instead"},
		{"--max-body in extraArgs", required().set("server.extraArgs", []any{"--max-body=1024"}), "server.extraArgs --max-body=1024: set server.maxBodyMiB instead"},
		{"-max-body D in extraArgs", required().set("server.extraArgs", []any{"-max-body", "1024"}), "server.extraArgs -max-body: set server.maxBodyMiB instead"},
		// plover serve reads a flag not on its command line from
		// PLOVER_<FLAG>: the same flags through env.
		{"PLOVER_TLS_CERT in env", required().set("env", []any{map[string]any{"name": "PLOVER_TLS_CERT", "value": "/c.pem"}}), "env PLOVER_TLS_CERT: set tls.enabled and tls.secretName instead"},
		{"PLOVER_METRICS_LISTEN in env", required().set("env", []any{map[string]any{"name": "PLOVER_METRICS_LISTEN", "value": ":1"}}), "env PLOVER_METRICS_LISTEN: set metrics.enabled and metrics.port instead"},
		{"PLOVER_GRPC_LISTEN from a Secret", required().set("env", []any{map[string]any{"name": "PLOVER_GRPC_LISTEN", "valueFrom": map[string]any{"secretKeyRef": map[string]any{"name": "s", "key": "k"}}}}), "env PLOVER_GRPC_LISTEN: set grpc.enabled and grpc.port instead"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if out := templateFails(t, c.v); !strings.Contains(out, c.want) {
				t.Errorf("helm template failed without %q:\n%s", c.want, out)
			}
		})
	}
}

// TestWorkerScope: server.workerScope tenant passes --worker-scope=tenant;
// the default passes nothing (plover's own default), so an image older
// than the flag still starts.
func TestWorkerScope(t *testing.T) {
	for _, c := range []struct {
		scope, want string // want "": no flag
	}{
		{"function", ""},
		{"tenant", "tenant"},
	} {
		t.Run(c.scope, func(t *testing.T) {
			d := template(t, "plover", required().set("server.workerScope", c.scope)).deployments["plover"]
			got, ok := flagValue(d.Spec.Template.Spec.Containers[0].Args, "worker-scope")
			if got != c.want || ok != (c.want != "") {
				t.Errorf("--worker-scope %q (present %v), want %q", got, ok, c.want)
			}
		})
	}
}

// TestGRPC: grpc.enabled adds --grpc-listen, the container's grpc port and the
// Service's, beside (never instead of) the HTTP API, with TLS or without.
func TestGRPC(t *testing.T) {
	cases := []struct {
		name        string
		v           values
		port        int32
		appProtocol string
		tls         string
	}{
		{"default port", required().set("grpc.enabled", true), 8001, "grpc", ""},
		{"port and TLS", required().set("grpc.enabled", true).set("grpc.port", 9001).
			set("tls.enabled", true).set("tls.secretName", "plover-tls"), 9001, "grpc", "plover-tls"},
		{"h2c appProtocol", required().set("grpc.enabled", true).set("grpc.appProtocol", "kubernetes.io/h2c"), 8001, "kubernetes.io/h2c", ""},
		{"no appProtocol", required().set("grpc.enabled", true).set("grpc.appProtocol", ""), 8001, "", ""},
		{"port set but gRPC off", required().set("grpc.port", 9001), 0, "", ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			o := template(t, "plover", c.v)
			d := o.deployments["plover"]
			if d == nil {
				t.Fatal("no Deployment plover")
			}
			scheme, svcPort, svcName := corev1.URISchemeHTTP, int32(80), "http"
			if c.tls != "" {
				scheme, svcPort, svcName = corev1.URISchemeHTTPS, 443, "https"
			}
			// checkPod: the flag, the port, probes still on http, and the
			// TLS flags (which the server applies to the gRPC listener too).
			checkPod(t, d.Spec.Template, podWant{
				gpu: true, device: "cuda", scheme: scheme,
				authFile: "/etc/plover/auth/tokens", authSec: "plover-auth", s3Secret: "plover-s3",
				store: "s3://plover-bundles/prod", tls: c.tls, grpc: c.port,
			})
			svc := checkService(t, o, "plover", d.Spec.Template.Labels, svcPort, svcName)
			checkGRPCService(t, svc, c.port, c.appProtocol)
		})
	}
}

// tracingOn: required values with an OTLP endpoint, so tracing is on.
func tracingOn() values {
	return required().set("tracing.otlpEndpoint", "http://otel-collector.observability:4318")
}

// TestTracing: an OTLP endpoint renders the standard OTEL_* variables (and
// only then: TestDefaults checks there are none by default); headers only
// from a Secret.
func TestTracing(t *testing.T) {
	const k8sAttrs = "k8s.namespace.name=" + namespace + ",k8s.node.name=$(K8S_NODE_NAME),k8s.pod.name=$(K8S_POD_NAME)"
	// defaults is what tracingOn() renders for service name svc, changed by
	// edits (an empty value: the variable is absent).
	defaults := func(svc string, edits map[string]string) map[string]string {
		m := map[string]string{
			"OTEL_EXPORTER_OTLP_ENDPOINT": "http://otel-collector.observability:4318",
			"OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
			"OTEL_SERVICE_NAME":           svc,
			"OTEL_TRACES_SAMPLER":         "parentbased_traceidratio",
			"OTEL_TRACES_SAMPLER_ARG":     "0.1",
			"OTEL_RESOURCE_ATTRIBUTES":    k8sAttrs,
		}
		for k, v := range edits {
			if v == "" {
				delete(m, k)
			} else {
				m[k] = v
			}
		}
		return m
	}
	cases := []struct {
		name     string
		release  string
		fullname string // the workload's name, and the default OTEL_SERVICE_NAME
		v        values
		want     map[string]string // OTEL_* literal values; every other OTEL_* but the headers is refused
		headers  *corev1.SecretKeySelector
	}{
		{"defaults", "plover", "plover", tracingOn(), defaults("plover", nil), nil},
		{"service name from the release", "edge", "edge-plover", tracingOn(), defaults("edge-plover", nil), nil},
		{"everything set", "inference", "inference-plover", values{}.
			set("s3.bucket", "plover-bundles").set("s3.prefix", "prod").set("s3.existingSecret", "plover-s3").
			set("auth.existingSecret", "plover-auth").
			set("tracing.otlpEndpoint", "https://otlp.example.com:4317").
			set("tracing.protocol", "grpc").
			set("tracing.sampler", "traceidratio").
			set("tracing.samplerArg", 0.25).
			set("tracing.serviceName", "plover-eu").
			set("tracing.resourceAttributes", map[string]any{"deployment.environment.name": "prod", "k8s.cluster.name": "gpu-eu-1", "k8s.node.name": "pinned"}).
			set("tracing.headersSecret.name", "plover-otel").
			set("tracing.headersSecret.key", "headers"),
			map[string]string{
				"OTEL_EXPORTER_OTLP_ENDPOINT": "https://otlp.example.com:4317",
				"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
				"OTEL_SERVICE_NAME":           "plover-eu",
				"OTEL_TRACES_SAMPLER":         "traceidratio",
				"OTEL_TRACES_SAMPLER_ARG":     "0.25",
				"OTEL_RESOURCE_ATTRIBUTES": "k8s.namespace.name=" + namespace + ",k8s.pod.name=$(K8S_POD_NAME)," +
					"deployment.environment.name=prod,k8s.cluster.name=gpu-eu-1,k8s.node.name=pinned",
			}, &corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "plover-otel"}, Key: "headers"}},
		{"headers Secret with the default key", "plover", "plover", tracingOn().set("tracing.headersSecret.name", "plover-otel"), defaults("plover", nil),
			&corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "plover-otel"}, Key: "OTEL_EXPORTER_OTLP_HEADERS"}},
		{"always_on: no sampler argument", "plover", "plover", tracingOn().set("tracing.sampler", "always_on"),
			defaults("plover", map[string]string{"OTEL_TRACES_SAMPLER": "always_on", "OTEL_TRACES_SAMPLER_ARG": ""}), nil},
		{"no sampler: the SDK's", "plover", "plover", tracingOn().set("tracing.sampler", ""),
			defaults("plover", map[string]string{"OTEL_TRACES_SAMPLER": "", "OTEL_TRACES_SAMPLER_ARG": ""}), nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			o := template(t, c.release, c.v)
			d := o.deployments[c.fullname]
			if d == nil {
				t.Fatalf("no Deployment %s: %v", c.fullname, o.deployments)
			}
			checkPod(t, d.Spec.Template, podWant{
				gpu: true, device: "cuda", scheme: corev1.URISchemeHTTP,
				authFile: "/etc/plover/auth/tokens", authSec: "plover-auth", s3Secret: "plover-s3",
				store: "s3://plover-bundles/prod", tracing: true,
			})
			env := d.Spec.Template.Spec.Containers[0].Env
			got := map[string]string{}
			index := map[string]int{}
			for i, e := range env {
				index[e.Name] = i
				if !strings.HasPrefix(e.Name, "OTEL_") {
					continue
				}
				if e.Name == "OTEL_EXPORTER_OTLP_HEADERS" {
					if e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil || c.headers == nil ||
						e.ValueFrom.SecretKeyRef.Name != c.headers.Name || e.ValueFrom.SecretKeyRef.Key != c.headers.Key {
						t.Errorf("OTEL_EXPORTER_OTLP_HEADERS = %+v, want a secretKeyRef to %+v", e, c.headers)
					}
					continue
				}
				if e.ValueFrom != nil {
					t.Errorf("%s from %+v, want a literal", e.Name, e.ValueFrom)
				}
				if _, dup := got[e.Name]; dup {
					t.Errorf("%s set twice", e.Name)
				}
				got[e.Name] = e.Value
			}
			if _, ok := index["OTEL_EXPORTER_OTLP_HEADERS"]; ok != (c.headers != nil) {
				t.Errorf("OTEL_EXPORTER_OTLP_HEADERS present %v, want %v", ok, c.headers != nil)
			}
			for k, want := range c.want {
				if got[k] != want {
					t.Errorf("%s = %q, want %q", k, got[k], want)
				}
			}
			for k, v := range got {
				if _, ok := c.want[k]; !ok {
					t.Errorf("unexpected %s = %q", k, v)
				}
			}
			// The kubelet expands $(K8S_*) in OTEL_RESOURCE_ATTRIBUTES only
			// from variables defined before it, from the downward API.
			for name, field := range map[string]string{"K8S_POD_NAME": "metadata.name", "K8S_NODE_NAME": "spec.nodeName"} {
				i, ok := index[name]
				if !ok {
					t.Errorf("%s not set", name)
					continue
				}
				if f := env[i].ValueFrom; f == nil || f.FieldRef == nil || f.FieldRef.FieldPath != field {
					t.Errorf("%s = %+v, want fieldRef %s", name, env[i], field)
				}
				if i > index["OTEL_RESOURCE_ATTRIBUTES"] {
					t.Errorf("%s defined after OTEL_RESOURCE_ATTRIBUTES: the kubelet would not expand $(%s)", name, name)
				}
			}
		})
	}
}

// TestInsecureNoAuth: the explicit opt-out renders --insecure-no-auth and mounts no auth Secret.
func TestInsecureNoAuth(t *testing.T) {
	v := values{}.set("store.url", "file:///var/lib/plover/store").set("auth.insecureNoAuth", true).set("replicaCount", 1)
	o := template(t, "plover", v)
	c := o.deployments["plover"].Spec.Template.Spec.Containers[0]
	if _, ok := flagValue(c.Args, "insecure-no-auth"); !ok {
		t.Errorf("args %q lack --insecure-no-auth", c.Args)
	}
	if _, ok := flagValue(c.Args, "auth-file"); ok {
		t.Errorf("args %q have --auth-file", c.Args)
	}
	for _, e := range c.Env {
		if strings.HasPrefix(e.Name, "AWS_") {
			t.Errorf("%s set for a file store", e.Name)
		}
	}
	if got, _ := flagValue(c.Args, "store"); got != "file:///var/lib/plover/store" {
		t.Errorf("--store %q", got)
	}
}

// TestFileStoreOnePod: a file:// store lives on each pod's own data volume,
// so with more than one pod a deploy reaches one of them and the others never
// serve it; the chart refuses that unless a model repository fills every
// pod's store with the same functions.
func TestFileStoreOnePod(t *testing.T) {
	file := func() values {
		return values{}.set("store.url", "file:///var/lib/plover/store").set("auth.existingSecret", "plover-auth")
	}
	withRepo := func(v values) values {
		return v.set("repository.enabled", true).set("repository.existingClaim", "models")
	}
	const refusal = "store.url file:///var/lib/plover/store is a store on each pod's own data volume, and with "
	for _, tc := range []struct {
		name string
		v    values
		want string // "": renders
	}{
		{"one replica", file().set("replicaCount", 1), ""},
		{"no replicas", file().set("replicaCount", 0), ""},
		{"two replicas (the default)", file(), refusal + "replicaCount 2 there are several pods"},
		{"replicaCount null", file().set("replicaCount", nil), refusal + "replicaCount null (an external autoscaler's)"},
		{"autoscaling", file().set("replicaCount", 1).set("autoscaling.enabled", true), refusal + "autoscaling.enabled"},
		{"DaemonSet", file().set("kind", "DaemonSet"), refusal + "kind DaemonSet (a pod per node)"},
		{"any file:// path", file().set("store.url", "file:///srv/store").set("replicaCount", 3), "store.url file:///srv/store is a store on each pod's own data volume"},
		{"a repository, three replicas", withRepo(file().set("replicaCount", 3)), ""},
		{"a repository, autoscaling", withRepo(file().set("autoscaling.enabled", true)), ""},
		{"a repository, DaemonSet", withRepo(file().set("kind", "DaemonSet")), ""},
		{"S3, three replicas", required().set("replicaCount", 3), ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.want == "" {
				render(t, "plover", tc.v)
				return
			}
			out := templateFails(t, tc.v)
			if !strings.Contains(out, tc.want) || !strings.Contains(out, "repository.enabled") {
				t.Errorf("helm template failed without %q and the ways out:\n%s", tc.want, out)
			}
		})
	}
}

// TestMemoryDataVolume: with data.medium Memory the data volume is a tmpfs
// that counts toward the pod's memory, so data.sizeLimit and
// server.cacheLimitMiB above resources.limits.memory are refused (binary
// suffixes Ki, Mi, Gi, Ti; other forms are not checked).
func TestMemoryDataVolume(t *testing.T) {
	mem := func(size, limit string, cache int) values {
		return required().set("data.medium", "Memory").set("data.sizeLimit", size).
			set("resources.limits.memory", limit).set("server.cacheLimitMiB", cache)
	}
	for _, tc := range []struct {
		name string
		v    values
		want string // "": renders
	}{
		{"within the limit", mem("4Gi", "8Gi", 2048), ""},
		{"equal", mem("8192Mi", "8Gi", 8192), ""},
		{"size above", mem("20Gi", "8Gi", 2048), "data.sizeLimit 20Gi is more than resources.limits.memory 8Gi"},
		{"size a little above", mem("8193Mi", "8Gi", 2048), "data.sizeLimit 8193Mi is more than"},
		{"fractional", mem("1.5Gi", "1536Mi", 1024), ""},
		{"cache above (the default 10240 MiB)", required().set("data.medium", "Memory").set("data.sizeLimit", "8Gi"), "server.cacheLimitMiB 10240 is more than resources.limits.memory 8Gi (8192 MiB)"},
		{"the default medium: disk", required().set("data.sizeLimit", "20Gi"), ""},
		{"a decimal suffix: not checked", mem("20G", "8G", 2048), ""},
		{"no memory limit", mem("20Gi", "8Gi", 2048).set("resources.limits.memory", nil), ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.want == "" {
				render(t, "plover", tc.v)
				return
			}
			if out := templateFails(t, tc.v); !strings.Contains(out, tc.want) {
				t.Errorf("helm template failed without %q:\n%s", tc.want, out)
			}
		})
	}
}

func TestMain(m *testing.M) {
	if _, err := os.Stat(filepath.Join(chartDir, "Chart.yaml")); err != nil {
		fmt.Fprintln(os.Stderr, "charttest: run from deploy/helm/charttest:", err)
		os.Exit(1)
	}
	os.Exit(m.Run())
}

// TestPodsPreferDistinctNodes: a Deployment's pods prefer distinct nodes by
// default (two on one node share uid 10001's RLIMIT_NPROC, README), by a
// preferred podAntiAffinity on the release's own pods; affinity's other keys
// go beside it, and a podAntiAffinity of the user's (even {}) replaces it.
func TestPodsPreferDistinctNodes(t *testing.T) {
	nodeAffinity := map[string]any{"requiredDuringSchedulingIgnoredDuringExecution": map[string]any{
		"nodeSelectorTerms": []any{map[string]any{"matchExpressions": []any{map[string]any{
			"key": "nvidia.com/gpu.present", "operator": "In", "values": []any{"true"}}}}}}}
	users := map[string]any{"requiredDuringSchedulingIgnoredDuringExecution": []any{map[string]any{
		"labelSelector": map[string]any{"matchLabels": map[string]any{"team": "ml"}}, "topologyKey": "kubernetes.io/hostname"}}}
	for _, tc := range []struct {
		name        string
		v           values
		wantDefault bool // the chart's preferred anti-affinity
		wantNode    bool // the nodeAffinity above passed through
		wantUsers   bool // the required term above, as given
	}{
		{"defaults", required(), true, false, false},
		{"beside a nodeAffinity", required().set("affinity.nodeAffinity", nodeAffinity), true, true, false},
		{"podAntiAffinity {}: none", required().set("affinity.podAntiAffinity", map[string]any{}), false, false, false},
		{"the user's podAntiAffinity", required().set("affinity.podAntiAffinity", users).set("affinity.nodeAffinity", nodeAffinity), false, true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := template(t, "plover", tc.v).deployments["plover"]
			ps := d.Spec.Template.Spec
			a := ps.Affinity
			if a == nil {
				t.Fatal("no affinity")
			}
			if (a.NodeAffinity != nil) != tc.wantNode {
				t.Errorf("nodeAffinity %+v, want present %v", a.NodeAffinity, tc.wantNode)
			}
			var pref []corev1.WeightedPodAffinityTerm
			var req []corev1.PodAffinityTerm
			if a.PodAntiAffinity != nil {
				pref, req = a.PodAntiAffinity.PreferredDuringSchedulingIgnoredDuringExecution, a.PodAntiAffinity.RequiredDuringSchedulingIgnoredDuringExecution
			}
			users := len(req) == 1 && req[0].LabelSelector != nil && req[0].LabelSelector.MatchLabels["team"] == "ml"
			if users != tc.wantUsers || (!tc.wantUsers && len(req) != 0) {
				t.Errorf("required anti-affinity %+v, want the user's %v", req, tc.wantUsers)
			}
			if !tc.wantDefault {
				if len(pref) != 0 {
					t.Errorf("preferred anti-affinity %+v with the user's podAntiAffinity", pref)
				}
				return
			}
			if len(pref) != 1 {
				t.Fatalf("preferred anti-affinity %+v, want one term", pref)
			}
			term := pref[0].PodAffinityTerm
			if pref[0].Weight != 100 || term.TopologyKey != "kubernetes.io/hostname" {
				t.Errorf("anti-affinity weight %d topologyKey %q, want 100 and kubernetes.io/hostname", pref[0].Weight, term.TopologyKey)
			}
			if term.LabelSelector == nil || !selects(term.LabelSelector, d.Spec.Template.Labels) {
				t.Errorf("anti-affinity selector %v does not select the release's pods %v", term.LabelSelector, d.Spec.Template.Labels)
			}
			other := maps.Clone(d.Spec.Template.Labels)
			other["app.kubernetes.io/instance"] = "another-release"
			if selects(term.LabelSelector, other) {
				t.Errorf("anti-affinity selector %v selects another release's pods", term.LabelSelector)
			}
		})
	}
	t.Run("DaemonSet: one per node already", func(t *testing.T) {
		ds := template(t, "gpu", required().set("kind", "DaemonSet")).daemonSets["gpu-plover"]
		if a := ds.Spec.Template.Spec.Affinity; a != nil {
			t.Errorf("DaemonSet affinity %+v, want none by default", a)
		}
	})
}
