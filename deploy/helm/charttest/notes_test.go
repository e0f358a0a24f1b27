package charttest

import (
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"
)

// renderNotes renders the chart's NOTES.txt with v. helm template leaves
// NOTES out and helm install --dry-run asks a cluster for its version, so
// the test renders a copy of the chart in which a ConfigMap holds NOTES's
// text run through tpl (same values, same named templates).
func renderNotes(t *testing.T, v values) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "chartnotes")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	err = filepath.WalkDir(chartDir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(chartDir, p)
		if d.IsDir() {
			return os.MkdirAll(filepath.Join(dir, rel), 0o755)
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		if rel == filepath.Join("templates", "NOTES.txt") {
			rel = "notes.txt" // a plain file, for .Files.Get
		}
		return os.WriteFile(filepath.Join(dir, rel), b, 0o644)
	})
	if err != nil {
		t.Fatal(err)
	}
	cm := "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: notes\ndata:\n  notes: {{ tpl (.Files.Get \"notes.txt\") . | quote }}\n"
	if err := os.WriteFile(filepath.Join(dir, "templates", "zz-notes.yaml"), []byte(cm), 0o644); err != nil {
		t.Fatal(err)
	}
	out, errOut, err := runHelm(t, "template", "plover", dir, "--namespace", namespace, "-f", writeValues(t, v), "--show-only", "templates/zz-notes.yaml")
	if err != nil {
		t.Fatalf("helm template (NOTES): %v\n%s", err, errOut)
	}
	var m corev1.ConfigMap
	if err := yaml.UnmarshalStrict([]byte(out), &m); err != nil {
		t.Fatalf("NOTES ConfigMap: %v\n%s", err, out)
	}
	return m.Data["notes"]
}

// TestNotesTLS: with TLS, the commands NOTES gives must pass the client's
// certificate check. A certificate for the Service names the Service, not
// 127.0.0.1, where the port-forward listens, and a client checks the name it
// dialled: plover (PLOVER_SERVER) is told to dial a name mapped to the
// tunnel, grpcurl to check the Service's name (-authority). Without TLS,
// 127.0.0.1 in plain text as before.
func TestNotesTLS(t *testing.T) {
	tls := renderNotes(t, required().set("tls.enabled", true).set("tls.secretName", "plover-tls").set("grpc.enabled", true))
	host := "plover." + namespace + ".svc"
	for _, want := range []string{
		"port-forward svc/plover 8080:443",
		"echo '127.0.0.1 " + host + "' | sudo tee -a /etc/hosts",
		"export PLOVER_SERVER=https://" + host + ":8080 ",
		"export PLOVER_CACERT=ca.pem",
		"grpcurl -cacert ca.pem -authority " + host + " ",
	} {
		if !strings.Contains(tls, want) {
			t.Errorf("NOTES with TLS: no %q in\n%s", want, tls)
		}
	}
	if strings.Contains(tls, "https://127.0.0.1") {
		t.Errorf("NOTES with TLS sends clients to https://127.0.0.1, which a certificate for the Service does not name:\n%s", tls)
	}
	plain := renderNotes(t, required().set("grpc.enabled", true))
	for _, want := range []string{"port-forward svc/plover 8080:80", "export PLOVER_SERVER=http://127.0.0.1:8080 ", "grpcurl -plaintext "} {
		if !strings.Contains(plain, want) {
			t.Errorf("NOTES without TLS: no %q in\n%s", want, plain)
		}
	}
	for _, not := range []string{"PLOVER_CACERT", "/etc/hosts", "-authority"} {
		if strings.Contains(plain, not) {
			t.Errorf("NOTES without TLS mentions %s:\n%s", not, plain)
		}
	}
}

// TestNotesWarnOfCredentialsWithoutLandlock: without Landlock a function
// reads PID 1's (tini's) environment, which holds the store credentials of
// an s3:// store: NOTES says so where there are some, and does not claim it
// for a store that needs none.
func TestNotesWarnOfCredentialsWithoutLandlock(t *testing.T) {
	const warn = "the environment of PID 1 (tini) included, which holds the store\ncredentials"
	if n := renderNotes(t, required()); !strings.Contains(n, warn) {
		t.Errorf("NOTES with an s3:// store: no %q in\n%s", warn, n)
	}
	file := values{}.set("store.url", "file:///var/lib/plover/store").set("replicaCount", 1).set("auth.existingSecret", "plover-auth")
	if n := renderNotes(t, file); strings.Contains(n, "store\ncredentials") || !strings.Contains(n, "the environment of PID 1 (tini) included.") {
		t.Errorf("NOTES with a file store: want the PID 1 warning without store credentials:\n%s", n)
	}
}
