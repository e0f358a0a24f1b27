package engine_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"path/filepath"
	"testing"
	"time"

	"github.com/plover-run/plover/api"
	"github.com/plover-run/plover/engine"
	"github.com/plover-run/plover/internal/testkit"
	"github.com/plover-run/plover/objectstore"
)

// A node that knows a version but has not loaded it reads its sizes from
// the record's copies; a record written before them has none, and a later
// deploy of the same bundle fills them in. The node takes the filled copies
// at its next refresh. Before, it kept the record as it first read it, and
// a pipeline reckoned that version's outputs at 1 GiB until it loaded.
func TestANodeTakesTheCopiesAnUnchangedDeployFillsIn(t *testing.T) {
	ctx := context.Background()
	fs, err := objectstore.NewFS(filepath.Join(t.TempDir(), "store"))
	if err != nil {
		t.Fatal(err)
	}
	a := testkit.Engine(t, engine.Config{Store: fs})
	b := testkit.Engine(t, engine.Config{Store: fs})
	dir := testkit.BundleDir(t, testkit.Manifest("fn"), nil) // max_input_bytes 65536, out_bytes 256
	testkit.Deploy(t, a, dir)

	copies := func(in, out int64) { // rewrites the record's copies
		t.Helper()
		const key = "functions/fn.json"
		rc, err := fs.Get(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		raw, err := io.ReadAll(rc)
		rc.Close()
		if err != nil {
			t.Fatal(err)
		}
		var rec api.Record
		if err := json.Unmarshal(raw, &rec); err != nil {
			t.Fatal(err)
		}
		rec.Versions[0].MaxInputBytes, rec.Versions[0].OutBytes = in, out
		raw, _ = json.Marshal(&rec)
		if err := fs.Put(ctx, key, bytes.NewReader(raw), int64(len(raw))); err != nil {
			t.Fatal(err)
		}
	}
	copies(0, 0) // as an earlier build wrote it

	sizes := func() (in, out int64) {
		t.Helper()
		p, err := b.Pin(ctx, "fn", time.Time{})
		if err != nil {
			t.Fatal(err)
		}
		defer p.Release()
		return p.MaxInput(), p.OutBytes()
	}
	if in, out := sizes(); in != 0 || out != 0 {
		t.Fatalf("before the fill: max input %d, out %d; want 0, 0 (unknown)", in, out)
	}
	testkit.Deploy(t, a, dir) // unchanged: fills the copies in
	if err := b.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	if in, out := sizes(); in != 1<<16 || out != 256 {
		t.Errorf("after the fill and a refresh: max input %d, out %d; want 65536, 256", in, out)
	}

	// Copies no manifest may hold (a record written by hand) are none: a
	// pipeline adds them up, and 2^62 twice wraps.
	copies(1<<62, 1<<62)
	if err := b.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	if in, out := sizes(); in != 1<<16 || out != 256 {
		t.Errorf("after a record with copies of 2^62: max input %d, out %d; want 65536, 256 still", in, out)
	}
}

// A version recorded before unpacked_bytes was counted at its packed size
// by every pre-warm, and a deploy of the same bytes did not fill it in (a
// review's finding): it does now, as the other copies.
func TestAnUnchangedDeployFillsInTheUnpackedSize(t *testing.T) {
	ctx := context.Background()
	fs, err := objectstore.NewFS(filepath.Join(t.TempDir(), "store"))
	if err != nil {
		t.Fatal(err)
	}
	e := testkit.Engine(t, engine.Config{Store: fs})
	dir := testkit.BundleDir(t, testkit.Manifest("fn"), nil)
	testkit.Deploy(t, e, dir)
	const key = "functions/fn.json"
	record := func() api.Record {
		t.Helper()
		rc, err := fs.Get(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		defer rc.Close()
		var rec api.Record
		if err := json.NewDecoder(rc).Decode(&rec); err != nil {
			t.Fatal(err)
		}
		return rec
	}
	rec := record()
	if rec.Versions[0].Unpacked <= rec.Versions[0].Size {
		t.Fatalf("a deploy recorded %d bytes unpacked of a bundle of %d packed, want more", rec.Versions[0].Unpacked, rec.Versions[0].Size)
	}
	want := rec.Versions[0].Unpacked
	rec.Versions[0].Unpacked = 0 // as an earlier build wrote it
	raw, _ := json.Marshal(&rec)
	if err := fs.Put(ctx, key, bytes.NewReader(raw), int64(len(raw))); err != nil {
		t.Fatal(err)
	}
	testkit.Deploy(t, e, dir)
	if got := record(); len(got.Versions) != 1 || got.Versions[0].Unpacked != want {
		t.Fatalf("after the same bytes deployed again: %d versions, unpacked %d, want one version, %d", len(got.Versions), got.Versions[0].Unpacked, want)
	}
}
