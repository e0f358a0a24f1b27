package main_test

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/api"
	"github.com/plover-run/plover/bundle"
	"github.com/plover-run/plover/fileutil"
	"github.com/plover-run/plover/internal/testkit"
)

// TestKilledDuringDeploys: a real `plover serve` (file store, its own data
// directory) takes deploys from 8 concurrent clients, half of them of one
// shared function and half of each client's own, and is SIGKILLed right
// after the k-th acknowledged one, with others in flight. Restarted on the
// same data it must list every acknowledged version, with the bytes that
// were sent stored under its sha256; keep each function's current version
// at or after every acknowledged one; name no bundle that is missing or
// unreadable (acknowledged or not); have removed the dead process's spool
// and half-unpacked cache entries; and answer invokes with the right bytes.
func TestKilledDuringDeploys(t *testing.T) {
	if testing.Short() {
		t.Skip("builds binaries and starts servers")
	}
	bin := buildPlover(t)
	spin := sampleDir(t, "spin-host")
	// Every bundle of the storm, packed once: deployer g's j-th deploy is of
	// the shared function for even j and of its own for odd j, its bytes
	// made distinct by max_queue (which changes no answer) so that every
	// acknowledged deploy is a new version.
	const deployers, perDeployer = 8, 6
	plan := make([][]packedBundle, deployers)
	for g := range plan {
		for j := range perDeployer {
			name := "crash"
			if j%2 == 1 {
				name = fmt.Sprintf("crash-%d", g)
			}
			plan[g] = append(plan[g], sampleVariant(t, spin, name, func(m *abi.Manifest) { m.MaxQueue = 1 + g*perDeployer + j }))
		}
	}
	for _, tc := range []struct {
		name string
		k    int // acknowledged deploys before the SIGKILL
	}{
		{"after-first-ack", 1},
		{"early", 4},
		{"midway", 13},
		{"late", 29},
	} {
		t.Run(tc.name, func(t *testing.T) { killDuringDeploys(t, bin, plan, tc.k) })
	}
}

// ackedDeploy is a deploy the server answered 201: it promised the version.
type ackedDeploy struct {
	packedBundle
	version string
}

func killDuringDeploys(t *testing.T, bin string, plan [][]packedBundle, k int) {
	start := time.Now()
	data := t.TempDir()
	srv := startIsoServer(t, bin, data, nil)
	waitReady(t, srv.url)

	client := &http.Client{Timeout: 20 * time.Second} // bounds a deploy the kill leaves hanging
	var (
		mu       sync.Mutex
		acks     []ackedDeploy
		nAcked   atomic.Int64
		inFlight atomic.Int64
		stop     atomic.Bool
		killOnce sync.Once
		atKill   int64 // deploys in flight when the kill was sent
		wg       sync.WaitGroup
	)
	kill := func() {
		killOnce.Do(func() {
			atKill = inFlight.Load()
			stop.Store(true) // before the kill: every failure after it is expected
			if err := srv.cmd.Process.Kill(); err != nil {
				t.Errorf("SIGKILL: %v", err)
			}
		})
	}
	for _, mine := range plan {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for _, b := range mine {
				if stop.Load() {
					return
				}
				inFlight.Add(1)
				code, body, err := putBundle(client, srv.url, b.name, b.packed)
				inFlight.Add(-1)
				if err != nil {
					if !stop.Load() {
						t.Errorf("deploy %s before the kill: %v", b.name, err)
					}
					return
				}
				var fi api.FunctionInfo
				if code != http.StatusCreated || json.Unmarshal(body, &fi) != nil || fi.Version == "" {
					t.Errorf("deploy %s: %d %.300s", b.name, code, body)
					return
				}
				mu.Lock()
				acks = append(acks, ackedDeploy{b, fi.Version})
				mu.Unlock()
				if nAcked.Add(1) == int64(k) {
					kill()
				}
			}
		}()
	}
	wg.Wait()
	if !stop.Load() {
		t.Fatalf("the storm ended after %d acknowledged deploys without reaching k=%d", nAcked.Load(), k)
	}
	select {
	case <-srv.exited:
	case <-time.After(10 * time.Second):
		t.Fatalf("the server (pid %d) outlived SIGKILL by 10 s", srv.pid)
	}
	if t.Failed() {
		return
	}

	srv = startIsoServer(t, bin, data, nil)
	waitReady(t, srv.url)
	recs := map[string]*api.Record{}
	for _, mine := range plan {
		for _, b := range mine {
			if _, ok := recs[b.name]; ok {
				continue
			}
			rec, code := getRecord(t, srv.url, b.name)
			switch {
			case code == http.StatusOK:
				recs[b.name] = rec
			case code != http.StatusNotFound:
				t.Fatalf("versions of %s after the restart: %d", b.name, code)
			}
		}
	}

	// Every acknowledged version is listed, as sent.
	for _, a := range acks {
		rec := recs[a.name]
		if rec == nil {
			t.Errorf("%s: acknowledged version %s, but the restarted server has no record", a.name, a.version)
			continue
		}
		v, n := rec.Find(a.version)
		if n != 1 || v.SHA256 != a.sha || v.Size != int64(len(a.packed)) {
			t.Errorf("%s: acknowledged version %s (sha256 %.12s, %d bytes) is listed %d times as %+v", a.name, a.version, a.sha, len(a.packed), n, v)
			continue
		}
		stored, err := os.ReadFile(storedBundle(data, a.sha))
		if err != nil || !bytes.Equal(stored, a.packed) {
			t.Errorf("%s version %s: the stored bundle is not the bytes deployed (%d stored, %d sent): %v", a.name, a.version, len(stored), len(a.packed), err)
		}
	}
	// Every listed version, acknowledged or not, names a readable bundle,
	// and the current version is at or after every acknowledged one.
	listed := 0
	for name, rec := range recs {
		listed += len(rec.Versions)
		current := slices.IndexFunc(rec.Versions, func(v api.Version) bool { return v.ID == rec.Current })
		if current < 0 {
			t.Errorf("%s: current version %s is not among its versions", name, rec.Current)
		}
		for i, v := range rec.Versions {
			if err := checkStoredBundle(data, name, v, t.TempDir()); err != nil {
				t.Errorf("%s version %s: %v", name, v.ID, err)
			}
			acked := slices.ContainsFunc(acks, func(a ackedDeploy) bool { return a.version == v.ID })
			if acked && i > current {
				t.Errorf("%s: current version %s (#%d) is older than acknowledged version %s (#%d)", name, rec.Current, current, v.ID, i)
			}
		}
	}
	// The dead process's half-done work went at the restart.
	if left, _ := os.ReadDir(filepath.Join(data, "spool")); len(left) > 0 {
		t.Errorf("the spool still holds %d uploads of the killed server: %s", len(left), left[0].Name())
	}
	cached, err := os.ReadDir(filepath.Join(data, "cache"))
	if err != nil {
		t.Fatal(err)
	}
	for _, de := range cached {
		if !bundle.ValidDigest(de.Name()) {
			t.Errorf("the cache holds %s, left by the killed server", de.Name())
		}
	}
	// And it serves: every function cold-starts its current version.
	in := bytes.Repeat([]byte("kill"), 8)
	want := spinOut(in, 1024)
	for name := range recs {
		code, out, err := invokeHTTP(srv.url, name, in)
		if err != nil || code != http.StatusOK || !bytes.Equal(out, want) {
			t.Errorf("invoke %s after the restart: %d %v, %d bytes (%.200q)", name, code, err, len(out), out)
		}
	}
	t.Logf("k=%d: %d deploys acknowledged, %d in flight at the SIGKILL; %d versions of %d functions listed after the restart (%v)",
		k, len(acks), atKill, listed, len(recs), time.Since(start).Round(time.Millisecond))
}

// waitReady waits for /readyz to answer 200.
func waitReady(t *testing.T, url string) {
	t.Helper()
	waitFor(t, 10*time.Second, url+"/readyz to answer 200", func() bool {
		resp, err := http.Get(url + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
}

// putBundle deploys packed as function name through the HTTP API. It takes
// no t: deployers call it from their goroutines, where a failed connection
// is expected once the server is killed.
func putBundle(c *http.Client, url, name string, packed []byte) (int, []byte, error) {
	req, err := http.NewRequest(http.MethodPut, url+"/v1/functions/"+name, bytes.NewReader(packed))
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Content-Type", bundle.MediaType)
	resp, err := c.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp.StatusCode, body, err
}

// getRecord reads a function's record (GET /v1/functions/NAME/versions);
// the record is nil unless the status is 200.
func getRecord(t *testing.T, url, name string) (*api.Record, int) {
	t.Helper()
	resp, err := http.Get(url + "/v1/functions/" + name + "/versions")
	if err != nil {
		t.Fatalf("versions of %s: %v", name, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, resp.StatusCode
	}
	var rec api.Record
	if err := json.NewDecoder(resp.Body).Decode(&rec); err != nil {
		t.Fatalf("versions of %s: %v", name, err)
	}
	return &rec, resp.StatusCode
}

// storedBundle is where a file store under data keeps bundle sha (README:
// Bundles, storage and versions).
func storedBundle(data, sha string) string {
	return filepath.Join(data, "store", filepath.FromSlash(bundle.ObjectKey(sha)))
}

// checkStoredBundle checks that version v of function name has its bundle
// in the store under data: there, of the recorded size and sha256, and
// unpacking to name's manifest (into the empty directory scratch).
func checkStoredBundle(data, name string, v api.Version, scratch string) error {
	b, err := os.ReadFile(storedBundle(data, v.SHA256))
	if err != nil {
		return fmt.Errorf("its bundle: %w", err)
	}
	if sum := sha256.Sum256(b); hex.EncodeToString(sum[:]) != v.SHA256 || int64(len(b)) != v.Size {
		return fmt.Errorf("its bundle is %d bytes hashing to %x; the record says %d bytes, sha256 %s", len(b), sum, v.Size, v.SHA256)
	}
	m, err := bundle.Unpack(bytes.NewReader(b), scratch, bundle.DefaultMaxUnpacked)
	if err != nil {
		return fmt.Errorf("its bundle does not unpack: %w", err)
	}
	if m.Name != name {
		return fmt.Errorf("its bundle is of function %q", m.Name)
	}
	return nil
}

// ---- sample bundles ---------------------------------------------------------

// sampleDir is a sample bundle `make samples` left under build/samples.
func sampleDir(t *testing.T, name string) string {
	t.Helper()
	dir := filepath.Join(testkit.Root(), "build", "samples", name)
	if _, err := os.Stat(filepath.Join(dir, abi.ManifestFile)); err != nil {
		t.Skipf("no sample bundle %s (run make samples): %v", name, err)
	}
	return dir
}

// packedBundle is a bundle as deployed: its function, bytes and sha256.
type packedBundle struct {
	name, sha string
	packed    []byte
}

// sampleVariant packs the sample bundle directory sample as function name, its
// manifest changed by edit (nil: only the name).
func sampleVariant(t *testing.T, sample, name string, edit func(*abi.Manifest)) packedBundle {
	t.Helper()
	dir := sampleVariantDir(t, sample, name, edit)
	packed, sha, _, err := bundle.PackBytes(dir)
	if err != nil {
		t.Fatalf("pack %s as %s: %v", sample, name, err)
	}
	return packedBundle{name: name, sha: sha, packed: packed}
}

// sampleVariantDir is sampleVariant's bundle directory, not packed: the
// library and constants linked from the sample's.
func sampleVariantDir(t *testing.T, sample, name string, edit func(*abi.Manifest)) string {
	t.Helper()
	m, err := bundle.ReadManifest(sample)
	if err != nil {
		t.Fatal(err)
	}
	m.Name = name
	if edit != nil {
		edit(m)
	}
	dir := t.TempDir()
	for _, f := range []string{m.Library, m.Constants} {
		if f == "" {
			continue
		}
		if err := fileutil.LinkOrCopy(filepath.Join(sample, f), filepath.Join(dir, f)); err != nil {
			t.Fatal(err)
		}
	}
	testkit.WriteManifest(t, dir, m)
	return dir
}

// spinOut is the spin sample's answer to in (samples/spin/spin.cu): each
// 32-bit word mixed by 5000 rounds of xorshift32, in out zero-padded to
// out bytes.
func spinOut(in []byte, out int) []byte {
	b := make([]byte, out)
	for i := 0; i+4 <= len(in); i += 4 {
		x := binary.LittleEndian.Uint32(in[i:]) | 1
		for range 5000 {
			x ^= x << 13
			x ^= x >> 17
			x ^= x << 5
		}
		binary.LittleEndian.PutUint32(b[i:], x)
	}
	return b
}
