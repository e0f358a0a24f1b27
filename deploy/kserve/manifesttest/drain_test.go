package manifesttest

import (
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// kserveDefaultGrace is the terminationGracePeriodSeconds KServe gives a
// Standard-mode pod whose InferenceService sets none: Kubernetes' default,
// which setDefaultPodSpec writes (pkg/controller/v1beta1/inferenceservice/
// reconcilers/deployment/deployment_reconciler.go). A ServingRuntime has no
// such field, so the runtime must fit in it.
const kserveDefaultGrace = 30 * time.Second

// shutdownMargin is what a pod's grace must hold beyond the preStop sleep
// and --grace: after the drain plover still closes its workers and flushes
// its last spans (up to 5 s, cli/serve.go's flushSpans), and the kubelet's
// SIGKILL at the end of the grace would cut them. The Helm chart leaves the
// same 5 s.
const shutdownMargin = 5 * time.Second

// serveDefault is the value of cli/serve.go's const NAME = N * time.Second
// (or Minute): one of plover serve's defaults, read from its text.
func serveDefault(t *testing.T, name string) time.Duration {
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

// lastFlag is what plover serve ends up with for --name in args
// (--name=value or --name value): Go's flag package keeps the last one.
func lastFlag(args []string, name string) (string, bool) {
	v, ok := "", false
	for i, a := range args {
		if w, found := strings.CutPrefix(a, "--"+name+"="); found {
			v, ok = w, true
		} else if a == "--"+name && i+1 < len(args) {
			v, ok = args[i+1], true
		}
	}
	return v, ok
}

func duration(t *testing.T, what, s string) time.Duration {
	t.Helper()
	d, err := time.ParseDuration(s)
	if err != nil {
		t.Fatalf("%s %q: %v", what, s, err)
	}
	return d
}

// TestRuntimeDrains: a pod being deleted sleeps in preStop while KServe's
// Service drops it, then plover drains for --grace; the pod's termination
// grace must hold both and shutdownMargin, or the kubelet kills plover
// mid-drain or while it closes. The runtime alone fits KServe's default
// grace (any InferenceService), and the example InferenceService, which
// raises the pod's grace, raises --grace to cover the longest deadline a
// request may have (--timeout, or up to --max-timeout when the client asks),
// so that a rollout lets a request admitted just before SIGTERM finish.
func TestRuntimeDrains(t *testing.T) {
	rt := one(t, "ClusterServingRuntime")
	isvc := one(t, "InferenceService")
	c := obj(t, rt, "spec", "containers", 0)
	cmd := strs(t, at(t, c, "lifecycle", "preStop", "exec", "command"))
	if len(cmd) != 2 || cmd[0] != "sleep" {
		t.Fatalf("preStop %q: want [sleep N] (the image, debian:bookworm-slim, has sleep)", cmd)
	}
	n, err := strconv.Atoi(cmd[1])
	if err != nil || n < 1 {
		t.Fatalf("preStop sleep %q: want whole seconds, at least 1", cmd[1])
	}
	sleep := time.Duration(n) * time.Second
	rtArgs := strs(t, c["args"])
	g, ok := lastFlag(rtArgs, "grace")
	if !ok {
		t.Fatalf("the runtime passes no --grace: plover's default is 10 s, a third of its request deadline")
	}
	rtGrace := duration(t, "the runtime's --grace", g)
	if sleep+rtGrace+shutdownMargin > kserveDefaultGrace {
		t.Errorf("preStop %v + --grace %v + %v to close is more than the %v KServe gives a pod whose InferenceService sets no terminationGracePeriodSeconds", sleep, rtGrace, shutdownMargin, kserveDefaultGrace)
	}
	// KServe appends the InferenceService's args to the runtime's.
	args := append([]string{}, rtArgs...)
	if a, ok := obj(t, isvc, "spec", "predictor", "model")["args"]; ok {
		args = append(args, strs(t, a)...)
	}
	g, _ = lastFlag(args, "grace")
	grace := duration(t, "--grace", g)
	pod := kserveDefaultGrace
	if v, ok := obj(t, isvc, "spec", "predictor")["terminationGracePeriodSeconds"]; ok {
		s, err := strconv.Atoi(show(v))
		if err != nil {
			t.Fatalf("terminationGracePeriodSeconds %v: %v", v, err)
		}
		pod = time.Duration(s) * time.Second
	}
	if sleep+grace+shutdownMargin > pod {
		t.Errorf("the example's pod grace %v is less than preStop %v + --grace %v + %v to close: plover would be killed mid-drain or while it closes", pod, sleep, grace, shutdownMargin)
	}
	// The longest deadline a request may have: --timeout when it asks none,
	// else what it asks cut to --max-timeout (never below --timeout: the
	// engine takes the larger).
	timeout := serveDefault(t, "defaultTimeout")
	if v, ok := lastFlag(args, "timeout"); ok {
		timeout = duration(t, "--timeout", v)
	}
	longest := max(timeout, serveDefault(t, "defaultMaxTimeout"))
	if v, ok := lastFlag(args, "max-timeout"); ok {
		longest = max(timeout, duration(t, "--max-timeout", v))
	}
	if grace < longest {
		t.Errorf("the example's --grace %v is shorter than the longest deadline a request may have (--timeout %v, a client's up to --max-timeout: %v): a rollout cuts requests within it", grace, timeout, longest)
	}
}

// TestExampleRollsWithoutASpareGPU: with KServe's default strategy for a
// Standard-mode Deployment (maxSurge 25%, maxUnavailable 25%: with one
// replica, one pod more and none fewer), a rollout starts a new pod before
// the old one goes, and that pod waits for a second GPU. The example asks
// for no surge.
func TestExampleRollsWithoutASpareGPU(t *testing.T) {
	isvc := one(t, "InferenceService")
	s := obj(t, isvc, "spec", "predictor", "deploymentStrategy")
	if s["type"] != "RollingUpdate" {
		t.Fatalf("deploymentStrategy.type %v, want RollingUpdate", s["type"])
	}
	ru := obj(t, s, "rollingUpdate")
	if show(ru["maxSurge"]) != "0" || show(ru["maxUnavailable"]) != "1" {
		t.Errorf("rollingUpdate %v: want maxSurge 0 and maxUnavailable 1 (a rollout that needs no spare GPU)", ru)
	}
}

// mebibytes reads a quantity with a binary suffix (Ki, Mi, Gi, Ti).
func mebibytes(t *testing.T, q string) float64 {
	t.Helper()
	m := regexp.MustCompile(`^([0-9]+)(Ki|Mi|Gi|Ti)$`).FindStringSubmatch(q)
	if m == nil {
		t.Fatalf("quantity %q: the test reads N followed by Ki, Mi, Gi or Ti", q)
	}
	n, _ := strconv.ParseFloat(m[1], 64)
	return n * map[string]float64{"Ki": 1.0 / 1024, "Mi": 1, "Gi": 1024, "Ti": 1024 * 1024}[m[2]]
}

// TestDataVolumeHoldsStoreAndCache: the runtime passes no --store, so the
// file store (a packed copy of every model --repository deploys) and the
// bundle cache (unpacked bundles, up to --cache-limit) share the data
// emptyDir; the kubelet evicts a pod whose emptyDir passes its sizeLimit.
// The cache gets at most half of it, the store the rest.
func TestDataVolumeHoldsStoreAndCache(t *testing.T) {
	rt := one(t, "ClusterServingRuntime")
	c := obj(t, rt, "spec", "containers", 0)
	args := strs(t, c["args"])
	if _, ok := lastFlag(args, "store"); ok {
		t.Skip("the runtime names a --store: the data volume holds the cache only")
	}
	data, _ := lastFlag(args, "data")
	var volName string
	for _, m := range at(t, c, "volumeMounts").([]any) {
		if vm := m.(map[string]any); vm["mountPath"] == data {
			volName = vm["name"].(string)
		}
	}
	var size string
	for _, v := range at(t, rt, "spec", "volumes").([]any) {
		if vm := v.(map[string]any); vm["name"] == volName {
			size, _ = obj(t, vm, "emptyDir")["sizeLimit"].(string)
		}
	}
	if size == "" {
		t.Fatalf("--data=%s: no emptyDir with a sizeLimit mounted there", data)
	}
	cl, ok := lastFlag(args, "cache-limit")
	if !ok {
		t.Fatalf("no --cache-limit: plover's default (10 GiB) with the store beside it on a %s volume", size)
	}
	mib, err := strconv.ParseFloat(cl, 64)
	if err != nil || mib <= 0 {
		t.Fatalf("--cache-limit=%s: want MiB, more than 0 (0 is no limit)", cl)
	}
	if vol := mebibytes(t, size); mib > vol/2 {
		t.Errorf("--cache-limit=%s MiB is more than half the data volume (%s): the file store on it needs the rest", cl, size)
	}
}
