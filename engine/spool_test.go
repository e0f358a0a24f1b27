package engine_test

import (
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/plover-run/plover/bundle"
	"github.com/plover-run/plover/device"
	"github.com/plover-run/plover/engine"
	"github.com/plover-run/plover/errdefs"
	"github.com/plover-run/plover/internal/testkit"
)

// stalledUpload is an upload that sends its first bytes and then stalls
// until cont is closed, when it ends (a cut upload).
type stalledUpload struct {
	first []byte
	cont  chan struct{}
}

func (u *stalledUpload) Read(p []byte) (int, error) {
	if len(u.first) > 0 {
		n := copy(p, u.first)
		u.first = u.first[n:]
		return n, nil
	}
	<-u.cont
	return 0, io.ErrUnexpectedEOF
}

// Deploys' uploads hold what they have spooled of the node's spool
// budget (--max-spool) until their deploys end, a tenant at most the
// budget less one bundle: a tenant's stalled upload holds its tenant's
// other uploads back (503 after the engine's timeout, naming the
// tenant), never another tenant's bundle; the node's whole budget held,
// an upload waits up to its deadline (504) or the timeout (503 naming
// the flag, with a Retry-After); nothing is left held once the deploys
// have ended. Before, nothing bounded the uploads spooled at once: a
// deploy token sending many of --max-body filled the node's disk (a
// review's trace); and a first budget shared by all let one tenant's
// trickling uploads refuse every other tenant's deploys (the next
// review's probe).
func TestUploadsHoldTheSpoolBudget(t *testing.T) {
	const bound = 256 << 10 // --max-body: a tenant may hold 1 MiB less it
	e := testkit.Engine(t, engine.Config{SpoolBytes: 1 << 20, MaxBundleBytes: bound, Timeout: 300 * time.Millisecond})
	b, _, m, err := bundle.PackBytes(testkit.BundleDir(t, testkit.Manifest("echo"), nil))
	if err != nil {
		t.Fatal(err)
	}
	if len(b) > 100<<10 {
		t.Fatalf("the test bundle is %d bytes", len(b))
	}
	stalled := func(tenant string, n int) (func(), <-chan error) {
		u := &stalledUpload{first: make([]byte, n), cont: make(chan struct{})}
		done := make(chan error, 1)
		go func() {
			_, err := e.Control().DeployAs(context.Background(), "hog", tenant, u, false)
			done <- err
		}()
		var once bool
		cont := func() {
			if !once {
				once = true
				close(u.cont)
			}
		}
		t.Cleanup(cont)
		return cont, done
	}
	garbage := func(n int) io.Reader { return bytes.NewReader(bytes.Repeat([]byte{1}, n)) }

	// Tenant a holds 750 KiB of its 768 (three uploads under the bound):
	// its next 100 KiB wait, tenant b's bundle does not.
	var conts []func()
	var dones []<-chan error
	for range 3 {
		cont, done := stalled("a", 250<<10)
		conts, dones = append(conts, cont), append(dones, done)
	}
	waitHeld(t, e, 750<<10)
	_, err = e.Control().DeployAs(context.Background(), "more", "a", garbage(100<<10), false)
	if _, part := e.SpoolHeld("a"); part != 750<<10 {
		t.Errorf("tenant a's part holds %d bytes after its refused upload, want its stalled uploads' %d", part, 750<<10)
	}
	if errdefs.KindOf(err) != errdefs.KindUnavailable || !strings.Contains(err.Error(), "tenant a") || errdefs.RetryAt(err).IsZero() {
		t.Errorf("tenant a's upload past its part: %v (%v), want 503 naming the tenant, with a retry time", err, errdefs.KindOf(err))
	}
	if _, err := e.Control().DeployAs(context.Background(), m.Name, "b", bytes.NewReader(b), false); err != nil {
		t.Errorf("tenant b's deploy while tenant a holds its part: %v", err)
	}
	// The node's budget held (750 KiB of a, 250 of no tenant's): an
	// upload without a tenant waits for the node's room, and so does one
	// of tenant b's that has room in its part, giving its part back.
	cont, done := stalled("", 250<<10)
	conts, dones = append(conts, cont), append(dones, done)
	waitHeld(t, e, 1000<<10)
	for _, tc := range []struct {
		name, tenant string
		deadline     time.Duration
		kind         errdefs.Kind
	}{
		{"its deadline passes while it waits", "", 100 * time.Millisecond, errdefs.KindTimeout},
		{"the engine's timeout", "", 0, errdefs.KindUnavailable},
		{"a tenant's, with room in its part", "b", 0, errdefs.KindUnavailable},
	} {
		ctx := context.Background()
		if tc.deadline > 0 {
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(ctx, tc.deadline)
			defer cancel()
		}
		_, err := e.Control().DeployAs(ctx, "more", tc.tenant, garbage(100<<10), false)
		if errdefs.KindOf(err) != tc.kind || !strings.Contains(err.Error(), "--max-spool") {
			t.Errorf("%s: an upload past the node's room: %v (%v), want %v naming --max-spool", tc.name, err, errdefs.KindOf(err), tc.kind)
		}
	}
	if _, part := e.SpoolHeld("b"); part != 0 {
		t.Errorf("tenant b's part holds %d bytes after its upload found no room in the node's", part)
	}
	for _, cont := range conts {
		cont()
	}
	for _, done := range dones {
		if err := <-done; err == nil {
			t.Error("a cut upload deployed")
		}
	}
	waitHeld(t, e, 0)
	if _, part := e.SpoolHeld("a"); part != 0 {
		t.Errorf("tenant a's part holds %d bytes once its deploys ended", part)
	}
	if _, err := e.Control().DeployAs(context.Background(), m.Name, "a", bytes.NewReader(b), true); err != nil {
		t.Fatalf("tenant a's deploy with room: %v", err)
	}
	// A tenant's part lives as long as its uploads: kept, a node whose
	// tokens come and go kept one for every tenant it ever spooled for.
	if n := e.SpoolTenants(); n != 0 {
		t.Errorf("%d tenants' parts of the spool kept once every upload ended, want none", n)
	}
}

// A bundle over the node's bound is refused 413 as soon as it passes it,
// also where the spool budget is the bound: the byte past the bound is
// not charged (charged, it waited for room it could never have, and got
// 503 after the timeout: a review's probe).
func TestAnUploadOverTheBoundIsRefusedAtOnce(t *testing.T) {
	const bound = 256 << 10
	e := testkit.Engine(t, engine.Config{SpoolBytes: bound, MaxBundleBytes: bound, Timeout: 5 * time.Second})
	t0 := time.Now()
	_, err := e.Control().DeployAs(context.Background(), "big", "a", bytes.NewReader(make([]byte, bound+10)), false)
	if errdefs.KindOf(err) != errdefs.KindTooLarge || time.Since(t0) > 4*time.Second {
		t.Fatalf("an upload of the bound and 10 bytes: %v (%v) after %v, want 413 at once", err, errdefs.KindOf(err), time.Since(t0))
	}
}

// waitHeld waits until the engine's spool budget holds n bytes or more
// (0: none at all).
func waitHeld(t *testing.T, e *engine.Engine, n int64) {
	t.Helper()
	end := time.Now().Add(10 * time.Second)
	for held, _ := e.SpoolHeld(""); n == 0 && held != 0 || n > 0 && held < n; held, _ = e.SpoolHeld("") {
		if time.Now().After(end) {
			t.Fatalf("the spool budget holds %d bytes, want %d", held, n)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// A deploy's spool file and its part of --max-spool are given back once
// the store has its bundle, not when the deploy returns: landing a
// version with min_instances makes its instances first, running their
// constructors and hooks for up to the request's timeout, while other
// uploads waited for that room (a review's probe: a spool file held 7 s
// by a plover_instance_init of 8 s).
func TestADeploysSpoolIsFreeWhileItWarms(t *testing.T) {
	d := &gatedDevice{Device: device.NewHost(0)}
	spool := t.TempDir()
	e := testkit.Engine(t, engine.Config{Devices: []device.Device{d}, SpoolDir: spool})
	m := testkit.Manifest("warm")
	m.MinInstances = 1
	b, _, _, err := bundle.PackBytes(testkit.BundleDir(t, m, nil))
	if err != nil {
		t.Fatal(err)
	}
	release := make(chan struct{})
	making := d.arm(&d.newEntered, &d.newRelease, release)
	done := make(chan error, 1)
	go func() {
		_, err := e.Control().DeployAs(context.Background(), m.Name, "a", bytes.NewReader(b), false)
		done <- err
	}()
	select {
	case <-making: // the deploy's warm makes its instance
	case err := <-done:
		t.Fatalf("the deploy ended before it warmed its version: %v", err)
	}
	node, part := e.SpoolHeld("a")
	left, err := os.ReadDir(spool)
	close(release)
	if err != nil {
		t.Fatal(err)
	}
	if node != 0 || part != 0 || len(left) != 0 {
		t.Errorf("while the deploy warms its version: %d bytes of the node's spool budget held, %d of its tenant's, %d files in the spool; want none", node, part, len(left))
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// Deploy refuses a bundle exporting a hook's typo, which the runtime would
// never call (loader.Info.CheckHooks): a program's load does not check it,
// so the refusal is deploy's own.
func TestDeployRefusesAHooksTypo(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "typo.cu")
	def := "#include \"" + testkit.KernelsSource() + "\"\nPLOVER_EXPORT void plover_instance_int(plover_state_t *s) { (void)s; }\n"
	if err := os.WriteFile(src, []byte(def), 0o644); err != nil {
		t.Fatal(err)
	}
	m := testkit.Manifest("typo")
	testkit.BuildLib(t, src, dir, m.Library)
	testkit.WriteManifest(t, dir, m)
	b, _, _, err := bundle.PackBytes(dir)
	if err != nil {
		t.Fatal(err)
	}
	e := testkit.Engine(t, engine.Config{})
	_, err = e.Control().DeployAs(context.Background(), m.Name, "", bytes.NewReader(b), false)
	if errdefs.KindOf(err) != errdefs.KindInvalid || !strings.Contains(err.Error(), `exports the function plover_instance_int, which the runtime never calls`) {
		t.Errorf("deploying a hook's typo: %v (%v), want it refused naming the function", err, errdefs.KindOf(err))
	}
}
