package main_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	miniogo "github.com/minio/minio-go/v7"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/bundle"
	"github.com/plover-run/plover/internal/minio"
	"github.com/plover-run/plover/internal/testkit"
)

func invokeHTTP(url, name string, in []byte) (int, []byte, error) {
	resp, err := http.Post(url+"/v1/functions/"+name+"/invoke", "application/octet-stream", bytes.NewReader(in))
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, b, err
}

// minioStore starts MinIO with a bucket "plover", points this test's
// environment (and so the plover processes it starts) at it, and returns it
// with the store URL of prefix.
func minioStore(t *testing.T, prefix string) (*minio.Server, string) {
	t.Helper()
	srv := minio.Start(t)
	srv.MustCreateBucket(t, "plover")
	t.Setenv("AWS_ACCESS_KEY_ID", srv.AccessKey)
	t.Setenv("AWS_SECRET_ACCESS_KEY", srv.SecretKey)
	t.Setenv("PLOVER_S3_ENDPOINT", srv.Endpoint)
	return srv, "s3://plover/" + prefix
}

// TestS3 runs plover against a real MinIO: deploys straight to the bucket,
// two server processes sharing it, version switch and rollback under load,
// a corrupted object, and an outage.
func TestS3(t *testing.T) {
	if testing.Short() {
		t.Skip("starts MinIO and servers")
	}
	srvMinio, store := minioStore(t, "prod")
	storeArgs := []string{"--store", store, "--poll", "100ms"}
	bin := buildPlover(t)

	m := testkit.Manifest("fn")
	m.Chain = []abi.Launch{{Kernel: "echo", Grid: 1, Block: 8}}
	v1Dir := testkit.BundleDir(t, m, nil)
	m.Chain = append(m.Chain, abi.Launch{Kernel: "add_one", Grid: 1, Block: 1})
	v2Dir := testkit.BundleDir(t, m, nil)
	other := testkit.Manifest("other")
	otherDir := testkit.BundleDir(t, other, nil)

	deploy := func(dir string, flags ...string) string {
		out := run(t, bin, nil, append([]string{"deploy", dir, "--store", store}, flags...)...)
		var name, id string
		fmt.Sscanf(out, "deployed %s version %s", &name, &id)
		return id
	}
	v1 := deploy(v1Dir)
	deploy(otherDir)

	a := startServer(t, bin, storeArgs...)
	b := startServer(t, bin, storeArgs...) // a second node: no deploy of its own
	for _, s := range []*server{a, b} {
		if code, out, err := invokeHTTP(s.url, "fn", []byte{7}); err != nil || code != 200 || out[0] != 7 {
			t.Fatalf("v1 on %s: %d %v %v", s.url, code, out[:1], err)
		}
	}

	t.Run("switch and rollback under load", func(t *testing.T) {
		// No retries: a body landed in a slot of the version before the
		// switch runs on that version (engine.Land holds it), so a switch
		// under load fails no request.
		var failed, ok atomic.Int64
		var firstFail atomic.Value
		var seen sync.Map
		stop := make(chan struct{})
		var wg sync.WaitGroup
		for i := 0; i < 4; i++ {
			wg.Add(1)
			go func(s *server) {
				defer wg.Done()
				for n := 0; n < 5000; n++ { // bounded
					select {
					case <-stop:
						return
					default:
					}
					code, out, err := invokeHTTP(s.url, "fn", []byte{7})
					if err != nil || code != 200 || (out[0] != 7 && out[0] != 8) {
						failed.Add(1)
						firstFail.CompareAndSwap(nil, fmt.Sprintf("%d %q %v", code, out, err))
						continue
					}
					ok.Add(1)
					seen.Store(out[0], true)
				}
			}([]*server{a, b}[i%2])
		}
		time.Sleep(300 * time.Millisecond)
		deploy(v2Dir)
		waitFor(t, 5*time.Second, "the store to show it", func() bool { _, out, _ := invokeHTTP(b.url, "fn", []byte{7}); return out[0] == 8 })
		run(t, bin, nil, "rollback", "fn", v1[:8], "--store", store)
		waitFor(t, 5*time.Second, "the store to show it", func() bool {
			_, oa, _ := invokeHTTP(a.url, "fn", []byte{7})
			_, ob, _ := invokeHTTP(b.url, "fn", []byte{7})
			return oa[0] == 7 && ob[0] == 7
		})
		close(stop)
		wg.Wait()
		_, saw8 := seen.Load(byte(8))
		if failed.Load() != 0 || ok.Load() == 0 || !saw8 {
			t.Fatalf("%d failed (the first: %v), %d ok requests; v2 seen: %v", failed.Load(), firstFail.Load(), ok.Load(), saw8)
		}
		t.Logf("%d requests during the switch and rollback, none failed", ok.Load())
		out := run(t, bin, []string{"PLOVER_SERVER=" + a.url}, "versions", "fn")
		current := ""
		for _, line := range strings.Split(out, "\n") {
			if f := strings.Fields(line); len(f) > 1 && f[0] == "*" {
				current = f[1]
			}
		}
		if current != v1 || strings.Count(out, "\n") != 3 {
			t.Fatalf("versions after rollback (want 2 versions, %s current):\n%s", v1, out)
		}
	})

	t.Run("corrupted object is refused", func(t *testing.T) {
		_, sha, _, err := bundle.PackBytes(otherDir)
		if err != nil {
			t.Fatal(err)
		}
		mc, err := srvMinio.Client()
		if err != nil {
			t.Fatal(err)
		}
		key := "prod/" + bundle.ObjectKey(sha)
		junk := []byte("tampered bundle bytes")
		if _, err := mc.PutObject(context.Background(), "plover", key, bytes.NewReader(junk), int64(len(junk)), miniogo.PutObjectOptions{}); err != nil {
			t.Fatal(err)
		}
		c := startServer(t, bin, storeArgs...) // empty node cache
		code, out, _ := invokeHTTP(c.url, "other", []byte{1})
		if code != 422 || !strings.Contains(string(out), "sha256 mismatch") {
			t.Fatalf("tampered bundle: %d %s", code, out)
		}
		// Deploying the same bundle again repairs the object; with --force
		// it is a new version, which the node follows (it refused the old).
		deploy(otherDir, "--force")
		waitFor(t, 5*time.Second, "the store to show it", func() bool { code, _, _ := invokeHTTP(c.url, "other", []byte{1}); return code == 200 })
	})

	t.Run("outage", func(t *testing.T) {
		// "fn" is hot on a; "other" was never loaded there.
		if err := srvMinio.Stop(); err != nil {
			t.Fatal(err)
		}
		if code, out, _ := invokeHTTP(a.url, "fn", []byte{7}); code != 200 || out[0] != 7 {
			t.Fatalf("hot function during the outage: %d %v", code, out[:1])
		}
		code, out, _ := invokeHTTP(a.url, "other", []byte{1})
		if code != 503 || !strings.Contains(string(out), "store") {
			t.Fatalf("cold function during the outage: %d %s", code, out)
		}
		if err := srvMinio.Restart(context.Background()); err != nil {
			t.Fatal(err)
		}
		waitFor(t, 20*time.Second, "the store to show it", func() bool { code, _, _ := invokeHTTP(a.url, "other", []byte{1}); return code == 200 })
	})
}

// waitFor polls cond until it holds, failing the test after d.
func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
