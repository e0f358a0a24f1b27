package main_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	miniogo "github.com/minio/minio-go/v7"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/bundle"
	"github.com/plover-run/plover/internal/minio"
	"github.com/plover-run/plover/internal/testkit"
)

// distinctBundles builds n bundles of function name that differ in their
// bytes (out_bytes), so that every deploy makes a new version.
func distinctBundles(t *testing.T, name string, n int) []string {
	t.Helper()
	dirs := make([]string, n)
	lib := testkit.BuildLib(t, testkit.KernelsSource(), t.TempDir(), "kernels.so")
	libBytes, err := os.ReadFile(lib)
	if err != nil {
		t.Fatal(err)
	}
	for i := range dirs {
		m := testkit.Manifest(name)
		m.OutBytes = int64(64 + i)
		dir := t.TempDir()
		os.WriteFile(filepath.Join(dir, m.Library), libBytes, 0o755)
		testkit.WriteManifest(t, dir, m)
		dirs[i] = dir
	}
	return dirs
}

// TestManyNodesStore: concurrent deploys through two server processes and
// two `plover deploy --store` clients all land in the record; deploys racing
// deletes never leave a record naming a missing bundle. Real MinIO.
func TestManyNodesStore(t *testing.T) {
	if testing.Short() {
		t.Skip("starts MinIO and servers")
	}
	srvMinio, store := minioStore(t, "nodes")
	bin := buildPlover(t)
	a := startServer(t, bin, "--store", store, "--poll", "200ms")
	b := startServer(t, bin, "--store", store, "--poll", "200ms")

	t.Run("concurrent-deploys", func(t *testing.T) {
		const per = 10 // 4 deployers × 10 = 40 deploys of one function
		dirs := distinctBundles(t, "hot", 4*per)
		type ack struct{ who, version string }
		var mu sync.Mutex
		var acks []ack
		var wg sync.WaitGroup
		deployers := []struct {
			name string
			args []string
		}{
			{"server-a", []string{"--server", a.url}},
			{"server-b", []string{"--server", b.url}},
			{"store-1", []string{"--store", store}},
			{"store-2", []string{"--store", store}},
		}
		for d, dep := range deployers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; i < per; i++ {
					cmd := exec.Command(bin, append([]string{"deploy", dirs[d*per+i]}, dep.args...)...)
					out, err := cmd.CombinedOutput()
					if err != nil {
						t.Errorf("%s deploy %d: %v\n%s", dep.name, i, err, out)
						continue
					}
					var name, id string
					fmt.Sscanf(string(out), "deployed %s version %s", &name, &id)
					if id == "" {
						t.Errorf("%s deploy %d: no version in %q", dep.name, i, out)
						continue
					}
					mu.Lock()
					acks = append(acks, ack{dep.name, id})
					mu.Unlock()
				}
			}()
		}
		wg.Wait()
		var rec struct {
			Versions []struct{ ID string } `json:"versions"`
		}
		resp, err := http.Get(a.url + "/v1/functions/hot/versions")
		if err != nil {
			t.Fatal(err)
		}
		json.NewDecoder(resp.Body).Decode(&rec)
		resp.Body.Close()
		listed := map[string]bool{}
		for _, v := range rec.Versions {
			listed[v.ID] = true
		}
		var lost []string
		for _, a := range acks {
			if !listed[strings.TrimSuffix(a.version, ",")] && !listed[a.version] {
				lost = append(lost, a.who+":"+a.version)
			}
		}
		t.Logf("%d deploys acknowledged, %d versions in the record", len(acks), len(rec.Versions))
		if len(acks) != 4*per || len(rec.Versions) != 4*per || len(lost) > 0 {
			t.Fatalf("%d acknowledged, %d listed; acknowledged but missing: %v", len(acks), len(rec.Versions), lost)
		}
	})

	t.Run("deploy-vs-delete", func(t *testing.T) {
		dirs := distinctBundles(t, "racy", 20)
		for round := 0; round < 20; round++ {
			var wg sync.WaitGroup
			wg.Add(2)
			go func() { // a deploy through one node...
				defer wg.Done()
				exec.Command(bin, "deploy", dirs[round], "--server", a.url).Run()
			}()
			go func() { // ...and a delete through the other
				defer wg.Done()
				exec.Command(bin, "rm", "racy", "--server", b.url).Run()
			}()
			wg.Wait()
			// Whatever the order, a record that exists names bundles that
			// exist: every node can fetch the current version.
			resp, err := http.Get(a.url + "/v1/functions/racy/versions")
			if err != nil {
				t.Fatal(err)
			}
			var rec struct {
				Current  string `json:"current"`
				Versions []struct {
					ID     string `json:"id"`
					SHA256 string `json:"sha256"`
				} `json:"versions"`
			}
			json.NewDecoder(resp.Body).Decode(&rec)
			resp.Body.Close()
			if resp.StatusCode == 404 {
				continue
			}
			for _, v := range rec.Versions {
				if code := statObject(t, srvMinio, "plover", "nodes/"+bundle.ObjectKey(v.SHA256)); code != 200 {
					t.Fatalf("round %d: the record names version %s, whose bundle is gone (%d)", round, v.ID, code)
				}
			}
			// And the other node serves it (a fresh fetch from the store).
			if code, _, err := invokeHTTP(b.url, "racy", []byte{1}); err != nil || (code != 200 && code != 404) {
				t.Fatalf("round %d: node b invoking racy: %d %v", round, code, err)
			}
		}
	})
}

// statObject HEADs an object in MinIO through the S3 API, returning the
// status code.
func statObject(t *testing.T, m *minio.Server, bucket, key string) int {
	t.Helper()
	c, err := m.Client()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.StatObject(t.Context(), bucket, key, miniogo.StatObjectOptions{}); err != nil {
		return 404
	}
	return 200
}

// TestCacheRepairAndCrashLeftovers: a cached bundle damaged on disk (bytes
// flipped in the constants, a truncated library) is detected at load and
// fetched again from the store; temporary files a crash left are removed
// at start.
func TestCacheRepairAndCrashLeftovers(t *testing.T) {
	if testing.Short() {
		t.Skip("builds binaries and starts servers")
	}
	bin := buildPlover(t)
	data := t.TempDir()
	m := testkit.Manifest("addc")
	m.Constants = "c.bin"
	m.Chain = []abi.Launch{{Kernel: "add_constants", Grid: 1, Block: 1}}
	consts := bytes.Repeat([]byte{1, 2, 3, 4}, 16)
	dir := testkit.BundleDir(t, m, consts)
	in := bytes.Repeat([]byte{10}, 64)
	want := func(out []byte) bool {
		for i := range consts {
			if out[i] != in[i]+consts[i] {
				return false
			}
		}
		return true
	}
	s := startIsoServer(t, bin, data, nil)
	run(t, bin, []string{"PLOVER_SERVER=" + s.url}, "deploy", dir)
	if code, out, _ := invokeHTTP(s.url, "addc", in); code != 200 || !want(out) {
		t.Fatalf("first invoke: %d %v", code, out)
	}
	s.stop(t)
	cached, _ := filepath.Glob(filepath.Join(data, "cache", "*", "c.bin"))
	if len(cached) != 1 {
		t.Fatalf("cached constants: %v", cached)
	}
	entry := filepath.Dir(cached[0])

	damage := []struct {
		name string
		do   func()
	}{
		{"flipped bytes in the constants", func() {
			b, _ := os.ReadFile(cached[0])
			for i := 0; i < 4; i++ {
				b[i] ^= 0xff
			}
			os.WriteFile(cached[0], b, 0o644)
		}},
		{"a truncated library", func() {
			os.Truncate(filepath.Join(entry, m.Library), 100)
		}},
	}
	for _, d := range damage {
		t.Run(d.name, func(t *testing.T) {
			d.do()
			// Leftovers of a crash: a half-written store object, an upload
			// in the spool.
			leftover := filepath.Join(data, "store", "bundles", ".put-123456")
			os.WriteFile(leftover, []byte("half"), 0o644)
			old := time.Now().Add(-2 * time.Hour)
			os.Chtimes(leftover, old, old)
			spooled := filepath.Join(data, "spool", "plover-deploy-99")
			os.WriteFile(spooled, []byte("upload"), 0o644)

			s := startIsoServer(t, bin, data, nil)
			defer s.stop(t)
			if code, out, _ := invokeHTTP(s.url, "addc", in); code != 200 || !want(out) {
				t.Fatalf("invoke after damage: %d %v", code, out)
			}
			// The log is read from the server's stderr as it comes: the
			// line may land a moment after the answer.
			s.waitLog(t, "cached bundle damaged on disk")
			for _, p := range []string{leftover, spooled} {
				if _, err := os.Stat(p); !os.IsNotExist(err) {
					t.Errorf("crash leftover %s still there after start", p)
				}
			}
		})
	}
}
