package charttest

import (
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"sigs.k8s.io/yaml"
)

// syncOn: required values with a repository filled by a sync container.
func syncOn(mode string) values {
	return required().
		set("repository.enabled", true).
		set("repository.sync.enabled", true).
		set("repository.sync.mode", mode).
		set("repository.sync.image", "public.ecr.aws/aws-cli/aws-cli:2.27.0").
		set("repository.sync.command", []any{"/bin/sh", "-c"}).
		set("repository.sync.args", []any{"aws s3 sync --delete s3://models/prod /models"}).
		set("repository.sync.envFromSecret", "models-s3").
		set("repository.sync.env", []any{map[string]any{"name": "HOME", "value": "/tmp"}})
}

// repoWant is what a repository renders; a zero repoWant: no repository.
type repoWant struct {
	path   string // --repository and the mount path; "" for no repository
	poll   string // --repository-poll; "" for no flag
	claim  string // the PersistentVolumeClaim mounted
	nfs    string // the NFS server of a volume given as-is
	sync   string // "init" or "sidecar": the sync container's mode
	syncSC bool   // the sync container has the chart's securityContext
}

// TestRepository: repository.* adds the flags, the volume, plover's read-only
// mount and, for sync, the container that fills an emptyDir; off, it adds
// nothing.
func TestRepository(t *testing.T) {
	cases := []struct {
		name  string
		kind  string
		v     values
		store string // "" for the S3 store of required()
		want  repoWant
	}{
		{"off", "Deployment", required(), "", repoWant{}},
		{"off with sources set", "Deployment", syncOn("sidecar").set("repository.enabled", false).
			set("repository.existingClaim", "models").set("repository.volume", map[string]any{"nfs": map[string]any{"server": "nfs", "path": "/x"}}), "", repoWant{}},
		{"PVC", "Deployment", required().set("repository.enabled", true).set("repository.existingClaim", "models"), "",
			repoWant{path: "/models", poll: "30s", claim: "models"}},
		{"PVC, path and period, DaemonSet", "DaemonSet", required().set("kind", "DaemonSet").set("repository.enabled", true).
			set("repository.existingClaim", "triton-models").set("repository.mountPath", "/srv/model-repo").set("repository.pollPeriod", "2m30s"), "",
			repoWant{path: "/srv/model-repo", poll: "2m30s", claim: "triton-models"}},
		{"PVC, no period: the server's default", "Deployment", required().set("repository.enabled", true).
			set("repository.existingClaim", "models").set("repository.pollPeriod", ""), "",
			repoWant{path: "/models", claim: "models"}},
		{"PVC, a store per pod", "Deployment", values{}.set("store.url", "file:///var/lib/plover/store").set("auth.existingSecret", "plover-auth").
			set("repository.enabled", true).set("repository.existingClaim", "models"), "file:///var/lib/plover/store",
			repoWant{path: "/models", poll: "30s", claim: "models"}},
		{"NFS volume as-is", "Deployment", required().set("repository.enabled", true).
			set("repository.volume", map[string]any{"nfs": map[string]any{"server": "nfs.storage.svc", "path": "/exports/models", "readOnly": true}}), "",
			repoWant{path: "/models", poll: "30s", nfs: "nfs.storage.svc"}},
		{"sync, init container", "Deployment", syncOn("init"), "",
			repoWant{path: "/models", poll: "30s", sync: "init", syncSC: true}},
		{"sync, sidecar", "Deployment", syncOn("sidecar").
			set("repository.sync.startupProbe", map[string]any{"exec": map[string]any{"command": []any{"test", "-e", "/tmp/synced"}}}), "",
			repoWant{path: "/models", poll: "30s", sync: "sidecar", syncSC: true}},
		{"sync, own securityContext", "Deployment", syncOn("init").
			set("repository.sync.securityContext", map[string]any{"runAsNonRoot": true, "readOnlyRootFilesystem": false}), "",
			repoWant{path: "/models", poll: "30s", sync: "init"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			out := render(t, "plover", c.v)
			if c.want.path == "" && strings.Contains(strings.ToLower(out), "repositor") {
				t.Errorf("repository off, yet the manifests mention it:\n%s", out)
			}
			o := decodeAll(t, out)
			var tpl corev1.PodTemplateSpec
			if c.kind == "DaemonSet" {
				d := o.daemonSets["plover"]
				if d == nil {
					t.Fatal("no DaemonSet plover")
				}
				tpl = d.Spec.Template
			} else {
				d := o.deployments["plover"]
				if d == nil {
					t.Fatal("no Deployment plover")
				}
				tpl = d.Spec.Template
			}
			w := podWant{gpu: true, device: "cuda", scheme: corev1.URISchemeHTTP,
				authFile: "/etc/plover/auth/tokens", authSec: "plover-auth", s3Secret: "plover-s3", store: "s3://plover-bundles/prod"}
			if c.store != "" {
				w.s3Secret, w.store = "", c.store
			}
			checkPod(t, tpl, w)
			checkRepository(t, tpl.Spec, c.want)
		})
	}
}

// TestRepositoryOffUnchanged: with repository.enabled false, whatever else
// repository.* says, the chart renders byte for byte what it renders without
// any repository value.
func TestRepositoryOffUnchanged(t *testing.T) {
	for name, base := range map[string]values{
		"defaults":  required(),
		"DaemonSet": required().set("kind", "DaemonSet").set("tls.enabled", true).set("tls.secretName", "plover-tls").set("grpc.enabled", true),
	} {
		t.Run(name, func(t *testing.T) {
			plain := render(t, "plover", base)
			// The same base values with repository settings on top, all but enabled.
			v := syncOn("sidecar")
			for k, x := range base {
				v[k] = x
			}
			v.set("repository.enabled", false).set("repository.existingClaim", "models").set("repository.mountPath", "/srv/x").set("repository.pollPeriod", "1m")
			if got := render(t, "plover", v); got != plain {
				t.Errorf("repository.enabled=false changed the manifests:\n--- without repository values\n%s\n--- with\n%s", plain, got)
			}
		})
	}
}

// checkRepository asserts what repository.* renders in a pod spec (w zero:
// nothing at all).
func checkRepository(t *testing.T, ps corev1.PodSpec, w repoWant) {
	t.Helper()
	c := ps.Containers[0]
	repo, hasRepo := flagValue(c.Args, "repository")
	poll, hasPoll := flagValue(c.Args, "repository-poll")
	if w.path == "" {
		if hasRepo || hasPoll {
			t.Errorf("repository off, yet args %q", c.Args)
		}
		for _, v := range ps.Volumes {
			if strings.HasPrefix(v.Name, "repository") {
				t.Errorf("repository off, yet volume %+v", v)
			}
		}
		for _, m := range c.VolumeMounts {
			if strings.HasPrefix(m.Name, "repository") || m.MountPath == "/models" {
				t.Errorf("repository off, yet mount %+v", m)
			}
		}
		if len(ps.InitContainers) != 0 {
			t.Errorf("repository off, yet init containers %+v", ps.InitContainers)
		}
		return
	}

	// plover serve --repository PATH [--repository-poll D].
	if !hasRepo || repo != w.path {
		t.Errorf("--repository = %q (present %v), want %q; args %q", repo, hasRepo, w.path, c.Args)
	}
	if hasPoll != (w.poll != "") || poll != w.poll {
		t.Errorf("--repository-poll = %q (present %v), want %q; args %q", poll, hasPoll, w.poll, c.Args)
	}

	// plover reads the repository at PATH, read-only, whatever the source.
	vols := map[string]corev1.Volume{}
	for _, v := range ps.Volumes {
		vols[v.Name] = v
	}
	var mount *corev1.VolumeMount
	for i, m := range c.VolumeMounts {
		if m.MountPath == w.path {
			if mount != nil {
				t.Errorf("two mounts at %s", w.path)
			}
			mount = &c.VolumeMounts[i]
		}
	}
	if mount == nil {
		t.Fatalf("nothing mounted at %s: %+v", w.path, c.VolumeMounts)
	}
	if !mount.ReadOnly || mount.SubPath != "" {
		t.Errorf("plover's mount of the repository %+v, want read-only, no subPath", mount)
	}
	v, ok := vols[mount.Name]
	if !ok {
		t.Fatalf("mount %s names volume %q, which the pod lacks", w.path, mount.Name)
	}

	// The source: one of a claim (read-only), a volume as given, an emptyDir.
	src := v.VolumeSource
	switch {
	case w.claim != "":
		if src.PersistentVolumeClaim == nil || src.PersistentVolumeClaim.ClaimName != w.claim || !src.PersistentVolumeClaim.ReadOnly {
			t.Errorf("repository volume %+v, want PVC %s, read-only", src, w.claim)
		}
	case w.nfs != "":
		if src.NFS == nil || src.NFS.Server != w.nfs || src.NFS.Path != "/exports/models" || !src.NFS.ReadOnly {
			t.Errorf("repository volume %+v, want the NFS volume as given (server %s)", src, w.nfs)
		}
	case w.sync != "":
		if src.EmptyDir == nil || src.EmptyDir.SizeLimit == nil || !src.EmptyDir.SizeLimit.Equal(resource.MustParse("20Gi")) {
			t.Errorf("repository volume %+v, want an emptyDir of 20Gi", src)
		}
	}
	if n := countSources(src); n != 1 {
		t.Errorf("repository volume %+v has %d sources, want 1", src, n)
	}
	if w.sync == "" {
		if len(ps.InitContainers) != 0 {
			t.Errorf("no sync configured, yet init containers %+v", ps.InitContainers)
		}
		return
	}

	// The sync container: the user's image, command, args and env, writing
	// the emptyDir plover reads.
	if len(ps.InitContainers) != 1 {
		t.Fatalf("%d init containers, want the sync container", len(ps.InitContainers))
	}
	s := ps.InitContainers[0]
	if s.Name != "repository-sync" || s.Image != "public.ecr.aws/aws-cli/aws-cli:2.27.0" {
		t.Errorf("sync container %s image %s", s.Name, s.Image)
	}
	if !slices.Equal(s.Command, []string{"/bin/sh", "-c"}) || !slices.Equal(s.Args, []string{"aws s3 sync --delete s3://models/prod /models"}) {
		t.Errorf("sync command %q args %q, want the user's", s.Command, s.Args)
	}
	if len(s.EnvFrom) != 1 || s.EnvFrom[0].SecretRef == nil || s.EnvFrom[0].SecretRef.Name != "models-s3" || s.EnvFrom[0].ConfigMapRef != nil {
		t.Errorf("sync envFrom %+v, want Secret models-s3", s.EnvFrom)
	}
	if !reflect.DeepEqual(s.Env, []corev1.EnvVar{{Name: "HOME", Value: "/tmp"}}) {
		t.Errorf("sync env %+v, want the user's HOME=/tmp", s.Env)
	}
	// Its root filesystem is read-only (the chart's securityContext): a
	// writable /tmp of its own, not plover's.
	var wrote, tmp bool
	for _, m := range s.VolumeMounts {
		if m.Name == mount.Name {
			wrote = m.MountPath == w.path && !m.ReadOnly
		}
		if m.MountPath == "/tmp" {
			tv := vols[m.Name]
			tmp = tv.EmptyDir != nil && !m.ReadOnly && m.Name != mount.Name
			for _, pm := range c.VolumeMounts {
				if pm.Name == m.Name {
					tmp = false
				}
			}
		}
	}
	if !wrote {
		t.Errorf("sync container mounts %+v: want volume %s writable at %s", s.VolumeMounts, mount.Name, w.path)
	}
	if !tmp {
		t.Errorf("sync container mounts %+v: want a writable emptyDir of its own at /tmp", s.VolumeMounts)
	}
	for _, pc := range ps.Containers {
		if pc.Name == s.Name {
			t.Errorf("the sync container is also a regular container")
		}
	}
	sidecar := s.RestartPolicy != nil && *s.RestartPolicy == corev1.ContainerRestartPolicyAlways
	if sidecar != (w.sync == "sidecar") {
		t.Errorf("sync restartPolicy %v, want a native sidecar %v", s.RestartPolicy, w.sync == "sidecar")
	}
	if (s.StartupProbe != nil) != (w.sync == "sidecar") {
		t.Errorf("sync startupProbe %+v (mode %s)", s.StartupProbe, w.sync)
	}
	sc := s.SecurityContext
	if sc == nil {
		t.Fatal("sync container without a securityContext")
	}
	if w.syncSC && !reflect.DeepEqual(sc, c.SecurityContext) {
		t.Errorf("sync securityContext %+v, want the chart's, as plover's: %+v", sc, c.SecurityContext)
	}
	if !w.syncSC && (sc.ReadOnlyRootFilesystem == nil || *sc.ReadOnlyRootFilesystem || sc.RunAsUser != nil) {
		t.Errorf("sync securityContext %+v, want the one given, as given", sc)
	}
}

// countSources counts the volume sources set in src.
func countSources(src corev1.VolumeSource) int {
	n := 0
	rv := reflect.ValueOf(src)
	for i := range rv.NumField() {
		if !rv.Field(i).IsNil() {
			n++
		}
	}
	return n
}

// TestRepositoryRefusals: repository settings that cannot work fail the
// render with a message that says what to set.
func TestRepositoryRefusals(t *testing.T) {
	claim := func() values {
		return required().set("repository.enabled", true).set("repository.existingClaim", "models")
	}
	nfs := map[string]any{"nfs": map[string]any{"server": "nfs", "path": "/x"}}
	cases := []struct {
		name string
		v    values
		args []string // more helm template flags
		want string
	}{
		{"no source", required().set("repository.enabled", true), nil, "repository.enabled needs a source"},
		{"a claim and a sync", syncOn("init").set("repository.existingClaim", "models"), nil, "set one source, not existingClaim and sync.enabled"},
		{"a claim and a volume", claim().set("repository.volume", nfs), nil, "set one source, not existingClaim and volume"},
		{"a volume and a sync", syncOn("sidecar").set("repository.volume", nfs), nil, "set one source, not volume and sync.enabled"},
		{"sync without an image", required().set("repository.enabled", true).set("repository.sync.enabled", true), nil, "needs repository.sync.image"},
		{"unknown sync mode", syncOn("cron"), nil, `repository.sync.mode "cron": want init`},
		{"sidecar on Kubernetes 1.28", syncOn("sidecar"), []string{"--kube-version", "1.28.4"}, "needs Kubernetes >= 1.29"},
		{"startup probe on an init container", syncOn("init").set("repository.sync.startupProbe", map[string]any{"exec": map[string]any{"command": []any{"true"}}}), nil, "mode sidecar only"},
		{"relative mount path", claim().set("repository.mountPath", "models"), nil, `repository.mountPath "models": want an absolute path`},
		{"mount path /", claim().set("repository.mountPath", "/"), nil, "want an absolute path"},
		{"mount path with a trailing slash", claim().set("repository.mountPath", "/models/"), nil, "without a trailing slash"},
		{"mount path in the data volume", claim().set("repository.mountPath", "/var/lib/plover/models"), nil, "overlaps /var/lib/plover"},
		{"mount path over the data volume", claim().set("repository.mountPath", "/var"), nil, "overlaps /var/lib/plover"},
		{"mount path /tmp", claim().set("repository.mountPath", "/tmp"), nil, "overlaps /tmp"},
		{"mount path in /etc/plover", claim().set("repository.mountPath", "/etc/plover/models"), nil, "overlaps /etc/plover"},
		{"poll period without a unit", claim().set("repository.pollPeriod", 30), nil, `repository.pollPeriod "30": want a Go duration`},
		{"poll period in words", claim().set("repository.pollPeriod", "thirty seconds"), nil, "want a Go duration"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			args := append([]string{"template", "bad", chartDir, "--namespace", namespace, "-f", writeValues(t, c.v)}, c.args...)
			out, errOut, err := runHelm(t, args...)
			if err == nil {
				t.Fatalf("helm template succeeded; want a refusal. Output:\n%s", out)
			}
			if !strings.Contains(errOut, c.want) {
				t.Errorf("helm template failed without %q:\n%s", c.want, errOut)
			}
		})
	}
	// The refusal of sidecars is by version, not of sidecars.
	t.Run("sidecar on Kubernetes 1.29", func(t *testing.T) {
		out, errOut, err := runHelm(t, "template", "ok", chartDir, "--namespace", namespace, "-f", writeValues(t, syncOn("sidecar")), "--kube-version", "1.29.0")
		if err != nil {
			t.Fatalf("helm template: %v\n%s", err, errOut)
		}
		if !strings.Contains(out, "restartPolicy: Always") {
			t.Errorf("no native sidecar on 1.29:\n%s", out)
		}
	})
}

// TestRepositoryREADMEExamples: the README's repository examples (its yaml
// blocks that set repository:) render, lint, and give what they say.
func TestRepositoryREADMEExamples(t *testing.T) {
	helmBin(t) // here, not only in the subtests: skipped there, they would leave the coverage check below failing
	src, err := os.ReadFile(filepath.Join(chartDir, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	var examples []string
	for i, block := range strings.Split(string(src), "```yaml\n")[1:] {
		body, _, ok := strings.Cut(block, "\n```")
		if !ok {
			t.Fatalf("yaml block %d is not closed", i)
		}
		for _, line := range strings.Split(body, "\n") {
			if strings.HasPrefix(line, "#") || strings.TrimSpace(line) == "" {
				continue
			}
			if line == "repository:" {
				examples = append(examples, body)
			}
			break
		}
	}
	if len(examples) != 3 {
		t.Fatalf("%d repository examples in README.md, want 3 (a PVC, an init sync, a sidecar sync)", len(examples))
	}
	modes := map[string]bool{}
	for i, ex := range examples {
		t.Run(strconv.Itoa(i), func(t *testing.T) {
			var r map[string]any
			if err := yaml.UnmarshalStrict([]byte(ex), &r); err != nil {
				t.Fatalf("example %d: %v\n%s", i, err, ex)
			}
			v := required()
			v["repository"] = r["repository"]
			d := template(t, "plover", v).deployments["plover"]
			if d == nil {
				t.Fatal("no Deployment plover")
			}
			ps := d.Spec.Template.Spec
			if got, _ := flagValue(ps.Containers[0].Args, "repository"); got != "/models" {
				t.Errorf("--repository %q, want /models", got)
			}
			for _, ic := range ps.InitContainers {
				mode := "init"
				if ic.RestartPolicy != nil {
					mode = "sidecar"
				}
				modes[mode] = true
				if ic.Image == "" || len(ic.Args) == 0 {
					t.Errorf("sync container %+v without image or args", ic)
				}
			}
			if len(ps.InitContainers) == 0 {
				modes["volume"] = true
			}
		})
	}
	if !modes["init"] || !modes["sidecar"] || !modes["volume"] {
		t.Errorf("README examples cover %v, want a volume, an init container and a sidecar", modes)
	}
}
