package registry

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"regexp"
	"strings"
	"testing"
	"testing/iotest"
	"time"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/api"
	"github.com/plover-run/plover/bundle"
	"github.com/plover-run/plover/objectstore"
)

// tensorsOf declares n inputs and n outputs (one output at least) of the
// given rank, each a one-byte BOOL named by nameLen bytes.
func tensorsOf(in, out, nameLen, rank int) *abi.Tensors {
	side := func(prefix string, n int) []abi.Tensor {
		ts := make([]abi.Tensor, n)
		for i := range ts {
			name := fmt.Sprintf("%s%d", prefix, i)
			ts[i] = abi.Tensor{Name: name + strings.Repeat("_", max(0, nameLen-len(name))), Datatype: "BOOL", Shape: make([]int64, rank)}
			for d := range ts[i].Shape {
				ts[i].Shape[d] = 1
			}
		}
		return ts
	}
	return &abi.Tensors{Inputs: side("x", in), Outputs: side("y", out)}
}

// newFS is a file store in a directory of the test's.
func newFS(t *testing.T) *objectstore.FS {
	t.Helper()
	fs, err := objectstore.NewFS(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return fs
}

// publishBody publishes body as the current version of name.
func publishBody(t *testing.T, g Registry, m *abi.Manifest, body string, force bool) (api.Version, error) {
	t.Helper()
	v, _, err := g.Publish(context.Background(), m, strings.NewReader(body), bundle.Digest([]byte(body)), int64(len(body)), force)
	return v, err
}

// listed is the names List returns, failing the test on its error.
func listed(t *testing.T, g Registry) []string {
	t.Helper()
	recs, err := g.List(context.Background())
	if err != nil {
		t.Fatalf("list: %v", err)
	}
	var names []string
	for _, r := range recs {
		names = append(names, r.Name)
	}
	return names
}

// A record is never written larger than it reads back: the deploy that
// would pass MaxRecordBytes is refused, naming the function, the size and
// what to do, and the record stays as it was. Before, each forced deploy
// of a manifest of many tensors grew the record until it passed the 8 MiB
// a record is read to: then every listing of the store failed (GET
// /v1/functions for every tenant, every delete, gc, a start's pre-warm)
// and the function could not be deleted.
func TestRecordSizeIsBounded(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name       string
		tensors    *abi.Tensors
		wantLanded int // the forced deploys that land before one is refused
	}{
		// The review's manifest: about 830 KB a version compact, 2.4 MB
		// indented (the fourth deploy's record did not read back).
		{"17,500 one-byte inputs", tensorsOf(17500, 1, 0, 1), 5},
		// The most a manifest may declare now (abi.MaxTensors a side):
		// about 250 KB a version compact, 650 KB indented (the
		// thirteenth deploy's did not read back).
		{"the most tensors admitted", tensorsOf(abi.MaxTensors, abi.MaxTensors, 64, 8), 17},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fs := newFS(t)
			g := Registry{Store: &agedStore{Store: fs}}
			if _, err := publishBody(t, g, &abi.Manifest{Name: "victim", Priority: "default"}, "victim's bundle", false); err != nil {
				t.Fatal(err)
			}
			evil := &abi.Manifest{Name: "evil", Priority: "default", Tensors: tc.tensors}
			var err error
			landed := 0
			for ; landed <= tc.wantLanded; landed++ {
				_, err = publishBody(t, g, evil, "evil's bundle", true)
				if err != nil {
					break
				}
				if got := listed(t, g); len(got) != 2 {
					t.Fatalf("after deploy %d: listed %q, want evil and victim", landed+1, got)
				}
			}
			if landed != tc.wantLanded || !errors.Is(err, ErrRecordTooLarge) {
				t.Fatalf("%d deploys landed, then %v; want %d, then ErrRecordTooLarge", landed, err, tc.wantLanded)
			}
			for _, w := range []string{"function evil:", fmt.Sprintf("%d versions would take", landed+1), fmt.Sprintf("over the %d a record may hold", MaxRecordBytes), "plover rm evil"} {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("refusal %q does not say %q", err, w)
				}
			}
			in, err := fs.Stat(ctx, recordKey("evil"))
			if err != nil || in.Size > MaxRecordBytes {
				t.Errorf("evil's record: %d bytes (%v), want at most %d", in.Size, err, MaxRecordBytes)
			}
			if rec, err := g.Get(ctx, "evil"); err != nil || len(rec.Versions) != landed {
				t.Fatalf("evil after the refusal: %v, want its %d versions", err, landed)
			}
			if got := listed(t, g); strings.Join(got, ",") != "evil,victim" {
				t.Errorf("listed %q, want evil and victim", got)
			}
			if removed, err := g.Delete(ctx, "evil"); err != nil || len(removed) != 1 {
				t.Errorf("delete evil: removed %q, %v; want its bundle", removed, err)
			}
			if got := listed(t, g); strings.Join(got, ",") != "victim" {
				t.Errorf("listed %q after evil's delete, want victim", got)
			}
			if removed, err := g.Delete(ctx, "victim"); err != nil || len(removed) != 1 {
				t.Errorf("delete victim: removed %q, %v; want its bundle", removed, err)
			}
		})
	}
}

// A record written larger than MaxRecordBytes before the limit (or
// indented, as records were written) still reads, still rolls back and
// is written compact again; only a change that grows it past the limit
// is refused.
func TestEarlierRecordsStillChange(t *testing.T) {
	ctx := context.Background()
	version := func(i int) api.Version {
		return api.Version{ID: fmt.Sprintf("%08d-0000-4000-8000-000000000000", i), SHA256: strings.Repeat("ab", 32), Size: 1, Created: time.Unix(1700000000, 0).UTC()}
	}
	record := func(n int) api.Record {
		rec := api.Record{Name: "fn"}
		for i := range n {
			rec.Versions = append(rec.Versions, version(i))
		}
		rec.Current = rec.Versions[n-1].ID
		return rec
	}
	size := func(n int) int {
		b, _ := json.Marshal(record(n))
		return len(b)
	}
	// The most versions whose compact record reads: one more does not.
	readable := 1 + (maxRecordRead-size(1))/(size(2)-size(1))
	padded := func(v any) ([]byte, error) {
		b, err := json.Marshal(v)
		return append(b, bytes.Repeat([]byte("\n"), 1<<20)...), err
	}
	for _, tc := range []struct {
		name     string
		versions int
		encode   func(any) ([]byte, error)
		wantGrow error // what a deploy of one more version gets
	}{
		{"indented", 3, func(v any) ([]byte, error) { return json.MarshalIndent(v, "", "  ") }, nil},
		{"compact, over the write limit", MaxRecordBytes/150 + 1, json.Marshal, ErrRecordTooLarge},
		// Past the read limit only by the white space after it: one
		// more version would not read back, though smaller than that.
		{"padded past the read limit", readable, padded, ErrRecordTooLarge},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fs := newFS(t)
			g := Registry{Store: fs}
			rec := record(tc.versions)
			b, err := tc.encode(rec)
			if err != nil {
				t.Fatal(err)
			}
			if err := fs.Put(ctx, recordKey("fn"), bytes.NewReader(b), int64(len(b))); err != nil {
				t.Fatal(err)
			}
			if _, err := publishBody(t, g, &abi.Manifest{Name: "fn", Priority: "default"}, "a new bundle", false); !errors.Is(err, tc.wantGrow) {
				t.Errorf("deploy to a %d-byte record: %v, want %v", len(b), err, tc.wantGrow)
			}
			if _, _, err := g.SetCurrent(ctx, "fn", rec.Versions[0].ID); err != nil {
				t.Fatalf("rollback of a %d-byte record: %v", len(b), err)
			}
			rc, err := fs.Get(ctx, recordKey("fn"))
			if err != nil {
				t.Fatal(err)
			}
			written, _ := io.ReadAll(rc)
			rc.Close()
			if bytes.ContainsRune(written, '\n') || len(written) > max(MaxRecordBytes, min(len(b), maxRecordRead)) {
				t.Errorf("rewritten as %d bytes with newlines %v, want compact, within the limits", len(written), bytes.ContainsRune(written, '\n'))
			}
		})
	}
}

// An unchanged deploy of a version whose record was written before the
// manifest's out_bytes and max_input_bytes were copied into it fills them
// in (a pipeline reckoned such a step at 1 GiB until it was loaded, and
// deploying the same bundle again changed nothing); it still makes no new
// version, and a record that has them is not written again.
func TestAnUnchangedDeployFillsInTheCopies(t *testing.T) {
	ctx := context.Background()
	fs := newFS(t)
	g := Registry{Store: fs}
	m := &abi.Manifest{Name: "fn", Priority: "default", MaxInputBytes: 64, OutBytes: 256}
	v, err := publishBody(t, g, m, "a bundle", false)
	if err != nil {
		t.Fatal(err)
	}
	if v.OutBytes != 256 || v.MaxInputBytes != 64 {
		t.Fatalf("deployed with out_bytes %d, max_input_bytes %d; want 256, 64", v.OutBytes, v.MaxInputBytes)
	}
	// As an earlier build wrote it.
	rec, err := g.Get(ctx, "fn")
	if err != nil {
		t.Fatal(err)
	}
	rec.Versions[0].OutBytes, rec.Versions[0].MaxInputBytes = 0, 0
	b, _ := json.Marshal(rec)
	if err := fs.Put(ctx, recordKey("fn"), bytes.NewReader(b), int64(len(b))); err != nil {
		t.Fatal(err)
	}
	again, err := publishBody(t, g, m, "a bundle", false)
	if err != nil {
		t.Fatal(err)
	}
	rec, err = g.Get(ctx, "fn")
	if err != nil {
		t.Fatal(err)
	}
	if again.ID != v.ID || len(rec.Versions) != 1 {
		t.Fatalf("the same bundle again made version %s (%d versions), want %s alone", again.ID, len(rec.Versions), v.ID)
	}
	if got := rec.Versions[0]; got.OutBytes != 256 || got.MaxInputBytes != 64 || again.OutBytes != 256 {
		t.Errorf("after the same bundle again: record out_bytes %d, max_input_bytes %d, answer's out_bytes %d; want 256, 64, 256", got.OutBytes, got.MaxInputBytes, again.OutBytes)
	}
	st, err := fs.Stat(ctx, recordKey("fn"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := publishBody(t, g, m, "a bundle", false); err != nil {
		t.Fatal(err)
	}
	if st2, err := fs.Stat(ctx, recordKey("fn")); err != nil || st2.ETag != st.ETag {
		t.Errorf("a record with its copies was written again by an unchanged deploy (%v)", err)
	}

	// A record the copies would take past MaxRecordBytes is left as it is:
	// the deploy changes nothing and does not fail.
	rec.Versions[0].OutBytes, rec.Versions[0].MaxInputBytes = 0, 0
	pad := api.Version{ID: "00000000-0000-4000-8000-000000000000", SHA256: strings.Repeat("ab", 32), Size: 1, Created: time.Unix(1700000000, 0).UTC(), Label: "x"}
	rec.Versions = append([]api.Version{pad}, rec.Versions...)
	b, _ = json.Marshal(rec)
	rec.Versions[0].Label = strings.Repeat("x", MaxRecordBytes-10-len(b)+1)
	b, _ = json.Marshal(rec)
	if len(b) != MaxRecordBytes-10 {
		t.Fatalf("padded record of %d bytes, want %d", len(b), MaxRecordBytes-10)
	}
	if err := fs.Put(ctx, recordKey("fn"), bytes.NewReader(b), int64(len(b))); err != nil {
		t.Fatal(err)
	}
	st, _ = fs.Stat(ctx, recordKey("fn"))
	if _, err := publishBody(t, g, m, "a bundle", false); err != nil {
		t.Fatalf("the same bundle again, its record 10 bytes short of the bound: %v", err)
	}
	if st2, err := fs.Stat(ctx, recordKey("fn")); err != nil || st2.ETag != st.ETag {
		t.Errorf("a record at its bound was written again by an unchanged deploy (%v)", err)
	}
}

// A record that does not decode fails no other function's listing,
// delete or rollback, and is itself deleted; gc deletes no bundle while
// it is there (it may name any). Before, every List failed on it (GET
// /v1/functions for every tenant, every delete's bundle check, gc, a
// start's pre-warm), and it could not be deleted: Delete read it first.
func TestCorruptRecordSpoilsNoOtherFunction(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name    string
		corrupt func(whole []byte) []byte
		why     string // what Get says of it
	}{
		{"cut short", func(b []byte) []byte { return b[:len(b)/2] }, "unexpected EOF"},
		{"not JSON", func([]byte) []byte { return []byte("\x00\x01 not a record") }, "invalid character"},
		{"another function's", func(b []byte) []byte { return bytes.Replace(b, []byte(`"name":"evil"`), []byte(`"name":"victim"`), 1) }, `it is for "victim"`},
		{"no current version", func(b []byte) []byte {
			return regexp.MustCompile(`"current":"[^"]*"`).ReplaceAll(b, []byte(`"current":"nope"`))
		}, `it names current version "nope", which it does not list`},
		{"past the read limit", func(b []byte) []byte {
			pad := bytes.Repeat([]byte(" "), maxRecordRead)
			return append(append(b[:len(b)-1:len(b)-1], pad...), '}')
		}, "larger than the 8388608 bytes a record is read to"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fs := newFS(t)
			var logged bytes.Buffer
			g := Registry{Store: &agedStore{Store: fs}, Cache: NewCache(), Log: slog.New(slog.NewTextHandler(&logged, nil))}
			for _, name := range []string{"victim", "evil", "bystander"} {
				if _, err := publishBody(t, g, &abi.Manifest{Name: name, Priority: "default"}, name+"'s bundle", false); err != nil {
					t.Fatal(err)
				}
			}
			rc, err := fs.Get(ctx, recordKey("evil"))
			if err != nil {
				t.Fatal(err)
			}
			whole, _ := io.ReadAll(rc)
			rc.Close()
			bad := tc.corrupt(whole)
			if err := fs.Put(ctx, recordKey("evil"), bytes.NewReader(bad), int64(len(bad))); err != nil {
				t.Fatal(err)
			}

			if _, err := g.Get(ctx, "evil"); !errors.Is(err, ErrCorruptRecord) || !strings.Contains(err.Error(), "plover rm evil") || !strings.Contains(err.Error(), tc.why) {
				t.Errorf("get evil: %v, want ErrCorruptRecord saying %q and to delete it", err, tc.why)
			}
			for range 2 {
				if got := listed(t, g); strings.Join(got, ",") != "bystander,victim" {
					t.Errorf("listed %q, want bystander and victim", got)
				}
			}
			if n := strings.Count(logged.String(), "function record passed over"); n != 1 || !strings.Contains(logged.String(), "function=evil") {
				t.Errorf("two listings logged %d lines for evil's record, want 1:\n%s", n, logged.String())
			}
			if rec, err := g.Get(ctx, "victim"); err != nil {
				t.Errorf("get victim: %v", err)
			} else if _, _, err := g.SetCurrent(ctx, "victim", rec.Current); err != nil {
				t.Errorf("rollback victim: %v", err)
			}
			// Deleting another function keeps its bundle, which the
			// record that does not decode may name.
			removed, err := g.Delete(ctx, "bystander")
			if !errors.Is(err, ErrBundlesKept) || !errors.Is(err, ErrCorruptRecord) || !strings.Contains(err.Error(), "function evil") || len(removed) != 0 {
				t.Errorf("delete bystander: removed %q, %v; want it deleted, its bundle kept for evil's record", removed, err)
			}
			if removed, err := g.GC(ctx, 0); err == nil || !strings.Contains(err.Error(), "function evil") || len(removed) != 0 {
				t.Errorf("gc: removed %q, %v; want nothing, naming evil's record", removed, err)
			}

			removed, err = g.Delete(ctx, "evil")
			if !errors.Is(err, ErrBundlesKept) || len(removed) != 0 {
				t.Errorf("delete evil: removed %q, %v; want it deleted, its bundles left to gc", removed, err)
			}
			if _, err := g.Get(ctx, "evil"); !errors.Is(err, ErrNoFunction) {
				t.Errorf("evil after its delete: %v", err)
			}
			removed, err = g.GC(ctx, 0)
			if err != nil || len(removed) != 2 {
				t.Errorf("gc after evil's delete: removed %q, %v; want evil's and bystander's bundles", removed, err)
			}
			if _, err := fs.Stat(ctx, bundle.ObjectKey(bundle.Digest([]byte("victim's bundle")))); err != nil {
				t.Errorf("victim's bundle: %v", err)
			}
			if got := listed(t, g); strings.Join(got, ",") != "victim" {
				t.Errorf("listed %q, want victim", got)
			}
		})
	}
}

// cutStore fails the read of one record (key) after its first bytes, as
// a connection the store drops mid-read.
type cutStore struct {
	objectstore.Store
	key string
	err error
}

func (s *cutStore) GetTagged(ctx context.Context, key string) (io.ReadCloser, objectstore.Info, error) {
	rc, in, err := s.Store.GetTagged(ctx, key)
	if err != nil || key != s.key {
		return rc, in, err
	}
	return struct {
		io.Reader
		io.Closer
	}{io.MultiReader(io.LimitReader(rc, 10), iotest.ErrReader(s.err)), rc}, in, nil
}

// A record whose read the store cuts short is no corrupt record: the
// listing fails (a store failing is every reader's failure) rather than
// passing over a record that is whole, and a delete does not take it for
// one to delete blind.
func TestCutReadIsNoCorruptRecord(t *testing.T) {
	ctx := context.Background()
	fs := newFS(t)
	cut := &cutStore{Store: fs}
	g := Registry{Store: cut}
	for _, name := range []string{"victim", "fn"} {
		if _, err := publishBody(t, g, &abi.Manifest{Name: name, Priority: "default"}, name+"'s bundle", false); err != nil {
			t.Fatal(err)
		}
	}
	down := errors.New("connection reset by peer")
	cut.key, cut.err = recordKey("fn"), down
	if _, err := g.List(ctx); !errors.Is(err, down) || errors.Is(err, ErrCorruptRecord) {
		t.Errorf("list: %v, want the store's error", err)
	}
	if _, err := g.Get(ctx, "fn"); !errors.Is(err, down) || errors.Is(err, ErrCorruptRecord) {
		t.Errorf("get: %v, want the store's error", err)
	}
	if _, err := g.Delete(ctx, "fn"); !errors.Is(err, down) {
		t.Errorf("delete: %v, want the store's error", err)
	}
	cut.key = ""
	if got := listed(t, g); strings.Join(got, ",") != "fn,victim" {
		t.Errorf("listed %q once the store reads again, want fn and victim", got)
	}
}

// A record deleted between the store's answer and its body (S3 finds it
// at the HEAD, not at the GET) is a function gone, as one deleted before
// the read: a listing passes over it rather than failing for every
// function.
func TestARecordDeletedWhileReadIsGone(t *testing.T) {
	ctx := context.Background()
	cut := &cutStore{Store: newFS(t)}
	g := Registry{Store: cut}
	for _, name := range []string{"victim", "fn"} {
		if _, err := publishBody(t, g, &abi.Manifest{Name: name, Priority: "default"}, name+"'s bundle", false); err != nil {
			t.Fatal(err)
		}
	}
	cut.key, cut.err = recordKey("fn"), fmt.Errorf("get %s: deleted while read: %w", recordKey("fn"), objectstore.ErrNotFound)
	if _, err := g.Get(ctx, "fn"); !errors.Is(err, ErrNoFunction) {
		t.Errorf("get: %v, want ErrNoFunction", err)
	}
	if got := listed(t, g); strings.Join(got, ",") != "victim" {
		t.Errorf("listed %q, want victim alone", got)
	}
}

// A stored bundle damaged without changing its size (which a node's
// sha256 check finds, its refusal saying so) is stored anew by a forced
// deploy of the same bytes; a plain one reuses the object, as it reuses
// any of the right size. Before, neither mended it.
func TestForcedDeployStoresADamagedBundleAnew(t *testing.T) {
	ctx := context.Background()
	fs, err := objectstore.NewFS(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	g := Registry{Store: fs}
	body := []byte("the bundle's true bytes")
	sha := bundle.Digest(body)
	m := &abi.Manifest{Name: "fn", Priority: "default"}
	if _, _, err := g.Publish(ctx, m, bytes.NewReader(body), sha, int64(len(body)), false); err != nil {
		t.Fatal(err)
	}
	if err := fs.Put(ctx, bundle.ObjectKey(sha), bytes.NewReader(bytes.Repeat([]byte("x"), len(body))), int64(len(body))); err != nil {
		t.Fatal(err)
	}
	stored := func() string {
		rc, err := fs.Get(ctx, bundle.ObjectKey(sha))
		if err != nil {
			t.Fatal(err)
		}
		defer rc.Close()
		b, _ := io.ReadAll(rc)
		return bundle.Digest(b)
	}
	for _, tc := range []struct {
		force, mended bool
	}{{false, false}, {true, true}} {
		if _, _, err := g.Publish(ctx, m, bytes.NewReader(body), sha, int64(len(body)), tc.force); err != nil {
			t.Fatal(err)
		}
		if got := stored() == sha; got != tc.mended {
			t.Errorf("deploy again, force %v: the stored object mended %v, want %v", tc.force, got, tc.mended)
		}
	}
}
