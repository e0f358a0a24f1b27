package engine_test

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/plover-run/plover/api"
	"github.com/plover-run/plover/engine"
	"github.com/plover-run/plover/internal/testkit"
)

// A poll that finds a loaded function's record broken says whose, once:
// the registry's and the record's errors name the function already.
func TestRefreshErrorNamesItsFunctionOnce(t *testing.T) {
	fs := fsStore(t)
	e := testkit.Engine(t, engine.Config{Store: fs})
	testkit.Deploy(t, e, testkit.BundleDir(t, testkit.Manifest("fn"), nil))
	invoke(t, e, "fn", []byte{1}) // loaded: the poll reads its record
	ctx := context.Background()
	rec, _ := json.Marshal(api.Record{Name: "fn", Current: "gone", Versions: []api.Version{{ID: "v1"}}})
	if err := fs.Put(ctx, "functions/fn.json", bytes.NewReader(rec), int64(len(rec))); err != nil {
		t.Fatal(err)
	}
	err := e.Refresh(ctx)
	if err == nil || !strings.Contains(err.Error(), `current version "gone"`) || strings.Count(err.Error(), "function fn") != 1 {
		t.Fatalf("Refresh: %v; want the broken record named once", err)
	}
}
