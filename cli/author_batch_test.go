package cli

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/call"
	"github.com/plover-run/plover/engine"
	"github.com/plover-run/plover/internal/testkit"
)

// u32s is little-endian uint32s back to back: the batching test bundle's
// items are two, a value and a sleep in ms in, value+1 and s->items out.
func u32s(vs ...uint32) []byte {
	b := make([]byte, 4*len(vs))
	for i, v := range vs {
		binary.LittleEndian.PutUint32(b[4*i:], v)
	}
	return b
}

// TestRunBatchingBundle: plover run of a batching bundle answers as the
// server does (issue 42, item 5): one item in, that item's
// item_output_bytes out (it wrote the whole batch's out_bytes, and ran
// with s->items 0), the same bytes a server answers; several items back
// to back run as one batch; an input of no whole item, or an entry that
// changes out.len, fails as the server fails it.
func TestRunBatchingBundle(t *testing.T) {
	if _, err := exec.LookPath("g++"); err != nil {
		t.Skip("no g++")
	}
	m := testkit.BatchManifest("batched", 16, "")
	dir := t.TempDir()
	testkit.BuildLib(t, testkit.BatchSource(), dir, m.Library)
	testkit.WriteManifest(t, dir, m)
	shrink := t.TempDir()
	testkit.BuildLib(t, testkit.BatchSource(), shrink, m.Library)
	ms := *m
	ms.Chain = []abi.Launch{{Kernel: "bshrink", Grid: 1, Block: 1}}
	testkit.WriteManifest(t, shrink, &ms)

	// What the server answers one item.
	e := testkit.Engine(t, engine.Config{})
	testkit.Deploy(t, e, dir)
	req := &call.Request{Input: u32s(41, 0)}
	if err := e.Invoke(context.Background(), "batched", req); err != nil {
		t.Fatalf("the server's answer to one item: %v", err)
	}
	served := bytes.Clone(req.Output)

	run := func(t *testing.T, d string, in []byte, args ...string) (out []byte, stdout, stderr string, err error) {
		t.Helper()
		inFile, outFile := filepath.Join(t.TempDir(), "in.bin"), filepath.Join(t.TempDir(), "out.bin")
		if err := os.WriteFile(inFile, in, 0o644); err != nil {
			t.Fatal(err)
		}
		stdout, stderr, err = runCommand(runCmd(), append([]string{d, "--in", inFile, "--out", outFile}, args...)...)
		out, _ = os.ReadFile(outFile)
		return out, stdout, stderr, err
	}
	t.Run("one item", func(t *testing.T) {
		out, _, stderr, err := run(t, dir, u32s(41, 0))
		if err != nil {
			t.Fatalf("run: %v\n%s", err, stderr)
		}
		if want := u32s(42, 1); !bytes.Equal(out, want) || !bytes.Equal(out, served) {
			t.Fatalf("output %x (%d bytes), want %x: item_output_bytes 8, value+1 and s->items 1, as the server answered (%x)", out, len(out), want, served)
		}
		if !strings.Contains(stderr, "8 B in (1 item of a batch), 8 B out") {
			t.Errorf("the report does not say one item in, 8 bytes out:\n%s", stderr)
		}
	})
	t.Run("three items as one batch", func(t *testing.T) {
		out, stdout, stderr, err := run(t, dir, u32s(1, 0, 2, 0, 3, 0), "--json")
		if err != nil {
			t.Fatalf("run: %v\n%s", err, stderr)
		}
		if want := u32s(2, 3, 3, 3, 4, 3); !bytes.Equal(out, want) {
			t.Fatalf("output %x, want %x: each item's value+1 and s->items 3, back to back", out, want)
		}
		var rep runReport
		if err := json.Unmarshal([]byte(stdout), &rep); err != nil || rep.Items != 3 || rep.OutputBytes != 24 {
			t.Errorf("--json: batch_items %d, output_bytes %d (%v), want 3 and 24:\n%s", rep.Items, rep.OutputBytes, err, stdout)
		}
	})
	for _, tt := range []struct {
		name string
		dir  string
		in   []byte
		want string
	}{
		{"no whole item", dir, make([]byte, 12), "the input is 12 bytes; batched batches requests of exactly 8 bytes (batch.item_input_bytes in " + filepath.Join(dir, "plover.json") + ")"},
		{"more than max_items", dir, make([]byte, 17*8), "or up to max_items 16 of them back to back"},
		{"empty", dir, nil, "the input is 0 bytes"},
		{"out.len changed", shrink, u32s(1, 0), abi.OutLenChanged},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, _, stderr, err := run(t, tt.dir, tt.in)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("run: %v\nwant an error containing %q\n%s", err, tt.want, stderr)
			}
		})
	}
}
