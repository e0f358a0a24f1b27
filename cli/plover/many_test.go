package main_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/plover-run/plover/api"
	"github.com/plover-run/plover/bundle"
	"github.com/plover-run/plover/internal/testkit"
)

// A node with a thousand functions, on a real server with real workers:
// every deploy is listed; a burst of distinct functions invoked at once
// all answer, each from a worker of its own that reports its memory (PSS);
// and idle_ttl reaps those workers (their processes gone) once they are
// idle. Bounded: 1,000 deploys and 24 invokes, every request with a
// timeout.
func TestManyFunctions(t *testing.T) {
	if testing.Short() {
		t.Skip("builds binaries and starts servers")
	}
	const deployed, burst = 1000, 24
	bin := buildPlover(t)
	s := startIsoServer(t, bin, t.TempDir(), nil)
	client := &http.Client{Timeout: 30 * time.Second}
	m := testkit.Manifest("many")
	dir := testkit.BundleDir(t, m, nil)
	name := func(i int) string { return fmt.Sprintf("many-%04d", i) }
	for i := range deployed {
		m.Name, m.IdleTTL = name(i), ""
		if i < burst {
			m.IdleTTL = "1s"
		}
		testkit.WriteManifest(t, dir, m)
		packed, _, _, err := bundle.PackBytes(dir)
		if err != nil {
			t.Fatal(err)
		}
		req, _ := http.NewRequest(http.MethodPut, s.url+"/v1/functions/"+m.Name, bytes.NewReader(packed))
		req.Header.Set("Content-Type", bundle.MediaType)
		resp, err := client.Do(req)
		if err != nil {
			t.Fatalf("deploy %s: %v", m.Name, err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusCreated {
			t.Fatalf("deploy %s: %d %s", m.Name, resp.StatusCode, body)
		}
	}
	var list struct{ Functions []api.FunctionInfo }
	getJSON(t, client, s.url+"/v1/functions", &list)
	if len(list.Functions) != deployed {
		t.Fatalf("%d functions listed, want %d", len(list.Functions), deployed)
	}
	for i, fi := range list.Functions {
		if fi.Name != name(i) || fi.Loaded {
			t.Fatalf("listed #%d: %s (loaded %v), want %s not loaded", i, fi.Name, fi.Loaded, name(i))
		}
	}

	// The burst: distinct functions, cold, at once.
	var wg sync.WaitGroup
	for i := range burst {
		wg.Add(1)
		go func() {
			defer wg.Done()
			in := []byte(name(i))
			resp, err := client.Post(s.url+"/v1/functions/"+name(i)+"/invoke", "application/octet-stream", bytes.NewReader(in))
			if err != nil {
				t.Errorf("%s: %v", name(i), err)
				return
			}
			out, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 || !bytes.HasPrefix(out, in) {
				t.Errorf("%s: %d %.100q, want the input echoed", name(i), resp.StatusCode, out)
			}
		}()
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	pids := map[int]string{}
	for i := range burst {
		var fi api.FunctionInfo
		getJSON(t, client, s.url+"/v1/functions/"+name(i), &fi)
		if len(fi.Workers) != 1 || fi.Workers[0].PSSBytes <= 0 || fi.Workers[0].PSSBytes > fi.Workers[0].RSSBytes {
			t.Fatalf("%s: workers %+v, want one with 0 < PSS <= RSS", name(i), fi.Workers)
		}
		if other, dup := pids[fi.Workers[0].PID]; dup {
			t.Fatalf("%s and %s share worker %d", name(i), other, fi.Workers[0].PID)
		}
		pids[fi.Workers[0].PID] = name(i)
	}

	// idle_ttl 1s: each function's instance, then the function, is released
	// and its worker ends.
	deadline := time.Now().Add(30 * time.Second)
	for pid, fn := range pids {
		for {
			var fi api.FunctionInfo
			getJSON(t, client, s.url+"/v1/functions/"+fn, &fi)
			_, err := os.Stat(fmt.Sprintf("/proc/%d", pid))
			if !fi.Loaded && len(fi.Workers) == 0 && os.IsNotExist(err) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: still loaded %v, workers %+v, process %d there: %v, 30 s after the burst with idle_ttl 1s", fn, fi.Loaded, fi.Workers, pid, err == nil)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
}

func getJSON(t *testing.T, c *http.Client, url string, v any) {
	t.Helper()
	resp, err := c.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("GET %s: %d %s", url, resp.StatusCode, b)
	}
	if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
}
