package repository

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/plover-run/plover/api"
	"github.com/plover-run/plover/bundle"
)

// A model folder a server took before a rule for new manifests came (an
// idle_ttl over 32 bytes), unchanged, its version in the store: after an
// upgrade the repository knows it by its bytes and leaves it serving.
// It packed the folder under today's rules first, before it compared with
// the record, and so refused a version the store holds and nodes run.
func TestUpgradeKeepsAStoredFolder(t *testing.T) {
	ctx := context.Background()
	root := filepath.Join(t.TempDir(), "models")
	v1 := filepath.Join(root, "cnn", "1")
	writeBundle(t, v1, "cnn", false)
	man := `{"name": "cnn", "abi": 2, "target": "host", "library": "vecadd.so", "constants": "b.bin", "idle_ttl": "0.` +
		strings.Repeat("0", 40) + `1s", "max_input_bytes": 4000000, "out_bytes": 4000000, "chain": [{"kernel": "vecadd", "grid": 3907, "block": 256}]}`
	if err := os.WriteFile(filepath.Join(v1, "plover.json"), []byte(man), 0o644); err != nil {
		t.Fatal(err)
	}
	age(t, root)
	var packed bytes.Buffer // what the older server packed: the same bytes, packing is deterministic
	if _, err := bundle.RepackWithin(v1, "", &packed); err != nil {
		t.Fatal(err)
	}
	if _, err := bundle.PackWithin(v1, "", &bytes.Buffer{}); err == nil || !strings.Contains(err.Error(), "idle_ttl") {
		t.Fatalf("today's rules take the folder (%v): the case tests nothing", err)
	}
	node := newFakeNode()
	node.recs["cnn"] = &api.Record{Name: "cnn", Current: "id-old", Versions: []api.Version{{ID: "id-old", SHA256: bundle.Digest(packed.Bytes()), Label: "1"}}}
	r, err := New(Config{Dir: root, Settle: 10 * time.Millisecond}, node)
	if err != nil {
		t.Fatal(err)
	}
	r.Scan(ctx)
	if got := index(r); !strings.Contains(got, "cnn/1 READY") {
		t.Errorf("a stored version, its folder unchanged: index %q, want cnn/1 READY", got)
	}
	if err := r.Load(ctx, "cnn"); err != nil {
		t.Errorf("load of the unchanged folder: %v", err)
	}
}
