package engine_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/plover-run/plover/api"
	"github.com/plover-run/plover/bundle"
	"github.com/plover-run/plover/call"
	"github.com/plover-run/plover/engine"
	"github.com/plover-run/plover/errdefs"
	"github.com/plover-run/plover/internal/testkit"
	"github.com/plover-run/plover/objectstore"
	"github.com/plover-run/plover/registry"
)

// A record the store returns but that cannot be changed (a change would
// make it larger than a record may be) or read (it does not decode) is no
// store outage: a retry never mends it. The deploy is a 409 and the
// request a 500, each saying what to do, not a 503 a client retries for
// good; the other functions serve and list as before.
func TestARecordTooLargeOrCorruptIsNoOutage(t *testing.T) {
	fs, err := objectstore.NewFS(filepath.Join(t.TempDir(), "store"))
	if err != nil {
		t.Fatal(err)
	}
	e := testkit.Engine(t, engine.Config{Store: fs})
	testkit.Deploy(t, e, testkit.BundleDir(t, testkit.Manifest("good"), nil))
	// big's record: as many versions as take more than a record may.
	big := testkit.BundleDir(t, testkit.Manifest("big"), nil)
	testkit.Deploy(t, e, big)
	rec, err := registry.Registry{Store: fs}.Get(context.Background(), "big")
	if err != nil {
		t.Fatal(err)
	}
	v := rec.Versions[0]
	for i := 0; len(rec.Versions)*200 < registry.MaxRecordBytes+(256<<10); i++ {
		v.ID, v.Created = fmt.Sprintf("%08d-0000-0000-0000-000000000000", i), v.Created.Add(time.Second)
		rec.Versions = append(rec.Versions, v)
	}
	if n := put(t, fs, "functions/big.json", rec); n <= registry.MaxRecordBytes || n >= 8<<20 {
		t.Fatalf("big's record planted at %d bytes; the test wants it past a write's bound, short of a read's", n)
	}
	if err := fs.Put(context.Background(), "functions/torn.json", strings.NewReader(`{"name":"torn","curr`), 20); err != nil {
		t.Fatal(err)
	}
	// A record that decodes but names no current version (a hand edit)
	// failed every listing of the functions (500).
	dangling := `{"name":"dangling","current":"nope","versions":[]}`
	if err := fs.Put(context.Background(), "functions/dangling.json", strings.NewReader(dangling), int64(len(dangling))); err != nil {
		t.Fatal(err)
	}
	b, _, _, err := bundle.PackBytes(big)
	if err != nil {
		t.Fatal(err)
	}
	_, err = e.Control().Deploy(context.Background(), "big", bytes.NewReader(b), true)
	if errdefs.KindOf(err) != errdefs.KindConflict || !strings.Contains(err.Error(), "plover rm big") {
		t.Errorf("a deploy its record cannot take: %v (kind %v); want a conflict saying what to do", err, errdefs.KindOf(err))
	}
	err = e.Invoke(context.Background(), "torn", &call.Request{Input: []byte("x")})
	if errdefs.KindOf(err) != errdefs.KindInternal || !strings.Contains(err.Error(), "plover rm torn") {
		t.Errorf("a request for a function whose record does not decode: %v (kind %v); want an internal error saying what to do", err, errdefs.KindOf(err))
	}
	if err := e.Invoke(context.Background(), "good", &call.Request{Input: []byte("x")}); err != nil {
		t.Errorf("good beside them: %v", err)
	}
	list, err := e.Control().Functions(context.Background())
	if err != nil || !hasFunction(list, "good") {
		t.Errorf("the list beside them: %v, %v; want good in it", list, err)
	}
}

// put writes v as JSON at key, and says how many bytes that took.
func put(t *testing.T, s objectstore.Store, key string, v any) int {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Put(context.Background(), key, bytes.NewReader(b), int64(len(b))); err != nil {
		t.Fatal(err)
	}
	return len(b)
}

func hasFunction(list []api.FunctionInfo, name string) bool {
	for _, f := range list {
		if f.Name == name {
			return true
		}
	}
	return false
}
