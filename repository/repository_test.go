package repository

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/plover-run/plover/api"
	"github.com/plover-run/plover/bundle"
	"github.com/plover-run/plover/errdefs"
)

// fakeNode is the control plane as the repository sees it: records in
// memory, a deploy refused when its manifest names another function (the
// engine's check), and counts of what was asked.
type fakeNode struct {
	mu        sync.Mutex
	recs      map[string]*api.Record
	deploys   int
	rollbacks int // each a moment when another version was current
	deletes   []string
	n         int
	consts    map[string]string // the constants each function's last deploy carried
	// onList, if set, runs in Listed after the names were read: what
	// happens while a listing is on its way back.
	onList func()
}

func newFakeNode() *fakeNode { return &fakeNode{recs: map[string]*api.Record{}} }

func (f *fakeNode) DeployLabeled(ctx context.Context, name, label string, aside bool, body io.Reader) (api.FunctionInfo, error) {
	dir, err := os.MkdirTemp("", "fake-deploy-")
	if err != nil {
		return api.FunctionInfo{}, err
	}
	defer os.RemoveAll(dir)
	b, _ := io.ReadAll(body)
	m, err := bundle.Unpack(strings.NewReader(string(b)), dir, 1<<30)
	if err != nil {
		return api.FunctionInfo{}, errdefs.New(errdefs.KindInvalid, err, "%v", err)
	}
	if m.Name != name {
		return api.FunctionInfo{}, errdefs.New(errdefs.KindInvalid, nil, "name: the manifest names %q but the bundle is deployed as %q", m.Name, name)
	}
	cb, _ := os.ReadFile(filepath.Join(dir, m.Constants))
	f.mu.Lock()
	defer f.mu.Unlock()
	f.deploys++
	f.n++
	if f.consts == nil {
		f.consts = map[string]string{}
	}
	f.consts[name] = string(cb)
	rec := f.recs[name]
	if rec == nil {
		rec = &api.Record{Name: name}
		f.recs[name] = rec
	}
	v := api.Version{ID: fmt.Sprintf("id-%d", f.n), SHA256: bundle.Digest(b), Label: label}
	rec.Versions = append(rec.Versions, v)
	if !aside || rec.Current == "" {
		rec.Current = v.ID
	}
	return api.FunctionInfo{Name: name, Version: v.ID}, nil
}

func (f *fakeNode) Versions(ctx context.Context, name string) (*api.Record, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	rec := f.recs[name]
	if rec == nil {
		return nil, errdefs.New(errdefs.KindNotFound, nil, "function %q not found", name)
	}
	c := *rec
	c.Versions = append([]api.Version(nil), rec.Versions...)
	return &c, nil
}

func (f *fakeNode) Rollback(ctx context.Context, name, version string) (api.FunctionInfo, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.recs[name].Current = version
	f.rollbacks++
	return api.FunctionInfo{Name: name, Version: version}, nil
}

func (f *fakeNode) Delete(ctx context.Context, name string, force bool) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.recs[name] == nil {
		return errdefs.New(errdefs.KindNotFound, nil, "function %q not found", name)
	}
	delete(f.recs, name)
	f.deletes = append(f.deletes, name)
	return nil
}

// DeleteCurrent is the engine's: Delete while name's current version is
// version, else a conflict.
func (f *fakeNode) DeleteCurrent(ctx context.Context, name, version string) error {
	f.mu.Lock()
	rec := f.recs[name]
	f.mu.Unlock()
	if rec != nil && rec.Current != version {
		return errdefs.New(errdefs.KindConflict, nil, "function %s is left alone: its current version is %s now, not %s", name, rec.Current, version)
	}
	return f.Delete(ctx, name, false)
}

func (f *fakeNode) Unlabel(ctx context.Context, name, label string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	rec := f.recs[name]
	if rec == nil {
		return errdefs.New(errdefs.KindNotFound, nil, "function %q not found", name)
	}
	for i := range rec.Versions {
		if v := &rec.Versions[i]; v.Label == label && v.ID != rec.Current {
			v.Label = ""
		}
	}
	return nil
}

// Listed is the functions the fake node has.
func (f *fakeNode) Listed(ctx context.Context) (map[string]bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := map[string]bool{}
	for name := range f.recs {
		out[name] = true
	}
	on := f.onList
	f.mu.Unlock()
	if on != nil {
		on()
	}
	f.mu.Lock() // for the deferred Unlock
	return out, nil
}

// Unready: the fake node runs every version it has.
func (f *fakeNode) Unready(name, version string) error { return nil }

// current is the label of name's current version ("" if none).
func (f *fakeNode) constants(name string) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.consts[name]
}

func (f *fakeNode) current(name string) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	rec := f.recs[name]
	if rec == nil {
		return ""
	}
	for _, v := range rec.Versions {
		if v.ID == rec.Current {
			return v.Label
		}
	}
	return ""
}

// writeBundle writes a bundle directory at dir whose manifest names name
// (the vecadd sample's manifest; the library's bytes are not looked at
// here: the engine's checks are engine.Control's, tested there). The
// files' times are set back past any settle time unless fresh.
func writeBundle(t *testing.T, dir, name string, fresh bool) {
	t.Helper()
	man := fmt.Sprintf(`{"name": %q, "abi": 2, "target": "host", "library": "vecadd.so", "constants": "b.bin",
  "max_input_bytes": 4000000, "out_bytes": 4000000, "chain": [{"kernel": "vecadd", "grid": 3907, "block": 256}]}`, name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for f, b := range map[string]string{"plover.json": man, "vecadd.so": "lib of " + dir, "b.bin": "constants"} {
		if err := os.WriteFile(filepath.Join(dir, f), []byte(b), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if !fresh {
		age(t, dir)
	}
}

// age sets every file's and directory's times under dir a minute back.
func age(t *testing.T, dir string) {
	t.Helper()
	old := time.Now().Add(-time.Minute)
	filepath.Walk(dir, func(p string, _ os.FileInfo, err error) error {
		if err == nil {
			os.Chtimes(p, old, old)
		}
		return err
	})
}

func index(r *Repository) string {
	var b strings.Builder
	for _, e := range r.Index(context.Background(), false) {
		fmt.Fprintf(&b, "%s/%s %s", e.Name, e.Version, e.State)
		if e.Reason != "" {
			fmt.Fprintf(&b, " (%s)", e.Reason)
		}
		b.WriteString("; ")
	}
	return b.String()
}

func TestLayouts(t *testing.T) {
	cases := []struct {
		name    string
		layout  func(t *testing.T, dir string)
		repoDir string // under the temp dir; "" : "models"
		as      string // Config.Name
		want    []string
		current map[string]string // function: label of its current version
	}{
		{name: "bundle directory", layout: func(t *testing.T, d string) { writeBundle(t, filepath.Join(d, "models", "vecadd"), "vecadd", false) },
			want: []string{"vecadd/1 READY"}, current: map[string]string{"vecadd": "1"}},
		{name: "version folders", layout: func(t *testing.T, d string) {
			writeBundle(t, filepath.Join(d, "models", "vecadd", "1"), "vecadd", false)
			writeBundle(t, filepath.Join(d, "models", "vecadd", "10"), "vecadd", false)
			writeBundle(t, filepath.Join(d, "models", "vecadd", "2"), "vecadd", false)
		}, want: []string{"vecadd/1 READY; vecadd/2 READY; vecadd/10 READY"}, current: map[string]string{"vecadd": "10"}},
		{name: "one bundle", repoDir: "mnt", layout: func(t *testing.T, d string) { writeBundle(t, filepath.Join(d, "mnt"), "vecadd", false) },
			want: []string{"vecadd/1 READY"}, current: map[string]string{"vecadd": "1"}},
		{name: "one bundle renamed", repoDir: "mnt", as: "sum", layout: func(t *testing.T, d string) { writeBundle(t, filepath.Join(d, "mnt"), "vecadd", false) },
			want: []string{"sum/1 READY"}, current: map[string]string{"sum": "1"}},
		{name: "manifest names another", layout: func(t *testing.T, d string) { writeBundle(t, filepath.Join(d, "models", "cnn", "2"), "other", false) },
			want: []string{`cnn/2 UNAVAILABLE (models/cnn/2: plover.json names "other")`}},
		{name: "broken beside good", layout: func(t *testing.T, d string) {
			writeBundle(t, filepath.Join(d, "models", "vecadd"), "vecadd", false)
			os.MkdirAll(filepath.Join(d, "models", "broken"), 0o755)
			os.WriteFile(filepath.Join(d, "models", "broken", "plover.json"), []byte("{"), 0o644)
			os.MkdirAll(filepath.Join(d, "models", "empty", "notes"), 0o755)
			age(t, filepath.Join(d, "models"))
		}, want: []string{"broken/1 UNAVAILABLE (models/broken: ", "empty/ UNAVAILABLE (models/empty: no plover.json and no version folders (1/, 2/, ...)); vecadd/1 READY"},
			current: map[string]string{"vecadd": "1"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			d := t.TempDir()
			c.layout(t, d)
			age(t, d) // at rest: the start scan deploys it
			dir := c.repoDir
			if dir == "" {
				dir = "models"
			}
			node := newFakeNode()
			r, err := New(Config{Dir: filepath.Join(d, dir), Name: c.as}, node)
			if err != nil {
				t.Fatal(err)
			}
			runStarted(t, r)
			got := index(r)
			for _, w := range c.want {
				if !strings.Contains(got, w) {
					t.Errorf("index %q lacks %q", got, w)
				}
			}
			for fn, label := range c.current {
				if cur := node.current(fn); cur != label {
					t.Errorf("%s: current version %q, want %q", fn, cur, label)
				}
			}
			// A restart over the same store deploys nothing again.
			before := node.deploys
			r2, _ := New(Config{Dir: filepath.Join(d, dir), Name: c.as}, node)
			runStarted(t, r2)
			if node.deploys != before {
				t.Errorf("a restart deployed %d bundles again", node.deploys-before)
			}
			if got2 := index(r2); got2 != got {
				t.Errorf("after a restart the index is %q, was %q", got2, got)
			}
		})
	}
}

// waitFor scans until cond holds (a poll's work, without its clock), at
// most n scans a settle time apart.
func waitFor(t *testing.T, r *Repository, n int, what string, cond func() bool) {
	t.Helper()
	for i := 0; i < n; i++ {
		r.Scan(context.Background())
		if cond() {
			return
		}
		time.Sleep(r.cfg.Settle)
	}
	t.Fatalf("%s: not after %d scans; index: %s", what, n, index(r))
}

func TestPolling(t *testing.T) {
	d := t.TempDir()
	models := filepath.Join(d, "models")
	writeBundle(t, filepath.Join(models, "vecadd", "1"), "vecadd", false)
	writeBundle(t, filepath.Join(models, "softmax"), "softmax", false)
	age(t, models)
	node := newFakeNode()
	r, err := New(Config{Dir: models, Poll: time.Hour, Settle: 100 * time.Millisecond}, node)
	if err != nil {
		t.Fatal(err)
	}
	r.Scan(context.Background())
	if node.current("vecadd") != "1" || node.current("softmax") != "1" {
		t.Fatalf("start: %s", index(r))
	}

	// A new version folder, copied now: LOADING at the scan that first
	// sees it, current at the next one (two polls).
	writeBundle(t, filepath.Join(models, "vecadd", "2"), "vecadd", true)
	r.Scan(context.Background())
	if node.current("vecadd") != "1" || !strings.Contains(index(r), "vecadd/ LOADING") {
		t.Fatalf("a version folder just copied was not left to settle: current %q; %s", node.current("vecadd"), index(r))
	}
	waitFor(t, r, 3, "version 2 current", func() bool { return node.current("vecadd") == "2" })

	// A lower version folder added later goes beside the current one,
	// which stays current throughout (no switch back).
	rollbacks := node.rollbacks
	writeBundle(t, filepath.Join(models, "vecadd", "0"), "vecadd", true)
	waitFor(t, r, 4, "version 0 deployed", func() bool { return strings.Contains(index(r), "vecadd/0 READY") })
	if cur := node.current("vecadd"); cur != "2" || node.rollbacks != rollbacks {
		t.Fatalf("after a lower version folder, version %q is current (%d switches back)", cur, node.rollbacks-rollbacks)
	}

	// A folder being copied while polls run: a file added at every scan
	// never loads; once still, it does.
	half := filepath.Join(models, "half")
	os.MkdirAll(half, 0o755)
	os.WriteFile(filepath.Join(half, "plover.json"), []byte(`{"name": "half", "abi": 2, "target": "host", "library": "vecadd.so", "constants": "b.bin", "max_input_bytes": 4, "out_bytes": 4, "chain": [{"kernel": "vecadd", "grid": 1, "block": 1}]}`), 0o644)
	for i := range 4 {
		r.Scan(context.Background())
		if _, err := node.Versions(context.Background(), "half"); err == nil {
			t.Fatalf("a folder still being copied was deployed (scan %d): %s", i, index(r))
		}
		if !strings.Contains(index(r), "half/ LOADING") {
			t.Fatalf("a folder being copied is not LOADING: %s", index(r))
		}
		// The next piece of the copy, written between polls.
		os.WriteFile(filepath.Join(half, fmt.Sprintf("part%d", i)), []byte("more"), 0o644)
		time.Sleep(r.cfg.Settle / 2)
	}
	writeBundle(t, half, "half", true)
	waitFor(t, r, 4, "the copied folder READY", func() bool { return strings.Contains(index(r), "half/1 READY") })

	// A changed bundle is deployed again under its label.
	writeBundle(t, filepath.Join(models, "softmax"), "softmax", true)
	os.WriteFile(filepath.Join(models, "softmax", "b.bin"), []byte("new constants"), 0o644)
	rec, _ := node.Versions(context.Background(), "softmax")
	waitFor(t, r, 4, "softmax redeployed", func() bool {
		now, _ := node.Versions(context.Background(), "softmax")
		return len(now.Versions) == len(rec.Versions)+1 && now.Current != rec.Current
	})

	// A removed folder removes its function.
	os.RemoveAll(filepath.Join(models, "softmax"))
	r.Scan(context.Background())
	if _, err := node.Versions(context.Background(), "softmax"); err == nil || strings.Contains(index(r), "softmax") {
		t.Fatalf("softmax's folder is gone but its function is not: %s", index(r))
	}
}

func TestUnloadLoad(t *testing.T) {
	d := t.TempDir()
	models := filepath.Join(d, "models")
	writeBundle(t, filepath.Join(models, "vecadd", "1"), "vecadd", false)
	age(t, models)
	node := newFakeNode()
	r, _ := New(Config{Dir: models, Poll: time.Hour, Settle: 50 * time.Millisecond}, node)
	ctx := context.Background()
	r.Scan(ctx)
	if err := r.Unload(ctx, "vecadd"); err != nil {
		t.Fatal(err)
	}
	r.Scan(ctx) // an unchanged folder stays unloaded
	if got := index(r); got != "vecadd/ UNAVAILABLE (unloaded); " || node.current("vecadd") != "" {
		t.Fatalf("after unload: %q, current %q", got, node.current("vecadd"))
	}
	if err := r.Load(ctx, "vecadd"); err != nil {
		t.Fatal(err)
	}
	if got := index(r); got != "vecadd/1 READY; " || node.current("vecadd") != "1" {
		t.Fatalf("after load: %q", got)
	}
	for _, c := range []struct {
		name string
		op   func(context.Context, string) error
		kind errdefs.Kind
	}{{"nope", r.Load, errdefs.KindNotFound}, {"nope", r.Unload, errdefs.KindNotFound}} {
		if err := c.op(ctx, c.name); errdefs.KindOf(err) != c.kind {
			t.Errorf("%s: %v, want kind %v", c.name, err, c.kind)
		}
	}
	// A broken folder's load is refused with its reason.
	writeBundle(t, filepath.Join(models, "bad"), "other", false)
	if err := r.Load(ctx, "bad"); errdefs.KindOf(err) != errdefs.KindBadRequest || !strings.Contains(err.Error(), `models/bad: plover.json names "other"`) {
		t.Fatalf("load of a broken folder: %v", err)
	}
}

// BenchmarkIndex1000 is the index of a repository of 1,000 models.
func BenchmarkIndex1000(b *testing.B) {
	r := &Repository{models: map[string]*model{}, node: newFakeNode()}
	for i := range 1000 {
		r.models[fmt.Sprintf("model-%04d", i)] = &model{name: fmt.Sprintf("model-%04d", i), versions: []version{{label: "1", state: Ready}}}
	}
	b.ResetTimer()
	for b.Loop() {
		if len(r.Index(context.Background(), false)) != 1000 {
			b.Fatal("short index")
		}
	}
}

// A model folder may be a link, swapped at once to a new copy of the
// function (cnn -> cnn-b): the swap is a change, deployed at the next
// scans; a version folder may be a link too.
func TestLinkedFolders(t *testing.T) {
	d := t.TempDir()
	models := filepath.Join(d, "models")
	os.MkdirAll(models, 0o755)
	a, b := filepath.Join(d, "releases", "a"), filepath.Join(d, "releases", "b")
	writeBundle(t, a, "vecadd", false)
	writeBundle(t, filepath.Join(d, "releases", "v1"), "softmax", false)
	if err := os.Symlink(a, filepath.Join(models, "vecadd")); err != nil {
		t.Fatal(err)
	}
	os.MkdirAll(filepath.Join(models, "softmax"), 0o755)
	if err := os.Symlink(filepath.Join(d, "releases", "v1"), filepath.Join(models, "softmax", "1")); err != nil {
		t.Fatal(err)
	}
	age(t, d)
	node := newFakeNode()
	r, err := New(Config{Dir: models, Poll: time.Hour, Settle: 100 * time.Millisecond}, node)
	if err != nil {
		t.Fatal(err)
	}
	// A link made now is a change now (its own time): it settles first.
	waitFor(t, r, 4, "linked folders served", func() bool { return node.current("vecadd") == "1" && node.current("softmax") == "1" })
	first, _ := node.Versions(context.Background(), "vecadd")
	deployed := len(first.Versions)

	writeBundle(t, b, "vecadd", false)
	os.WriteFile(filepath.Join(b, "b.bin"), []byte{9, 9, 9, 9}, 0o644) // another bundle than a's
	age(t, b)
	tmp := filepath.Join(models, ".vecadd-next")
	if err := os.Symlink(b, tmp); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(models, "vecadd")); err != nil { // the swap, at once
		t.Fatal(err)
	}
	waitFor(t, r, 4, "the swapped folder deployed", func() bool {
		rec, err := node.Versions(context.Background(), "vecadd")
		return err == nil && len(rec.Versions) > deployed
	})
}

// Started closes once Run's scans found nothing settling: not while the
// one folder found at start is still being copied.
func TestStartedAfterSettling(t *testing.T) {
	models := filepath.Join(t.TempDir(), "models")
	writeBundle(t, filepath.Join(models, "vecadd", "1"), "vecadd", true) // just copied
	node := newFakeNode()
	r, err := New(Config{Dir: models, Settle: 300 * time.Millisecond}, node)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan struct{})
	go func() { r.Run(ctx); close(done) }()
	select {
	case <-r.Started():
		if node.current("vecadd") != "1" {
			t.Fatalf("started with the folder found at start not deployed: %s", index(r))
		}
	case <-time.After(20 * time.Second):
		t.Fatalf("not started 20 s on: %s", index(r))
	}
	if !idleWithin(r, 20*time.Second) {
		t.Errorf("without a poll, still scanning 20 s on: %s", index(r))
	}
	cancel()
	<-done
}
