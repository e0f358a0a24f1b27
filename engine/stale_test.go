package engine_test

import (
	"bytes"
	"context"
	"testing"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/call"
	"github.com/plover-run/plover/engine"
	"github.com/plover-run/plover/internal/testkit"
)

// No response byte comes from an earlier request: a chain that writes only
// as many bytes of out as its input has (add_constants) answers a short
// request after a long one on the same instance with zeros past its input,
// unless the manifest opts out with zero_out: false (then the long request's
// bytes show through: what the default prevents).
func TestNoStaleBytes(t *testing.T) {
	no := false
	for _, tc := range []struct {
		name    string
		zeroOut *bool
		stale   bool
	}{{"default", nil, false}, {"zero_out false", &no, true}} {
		t.Run(tc.name, func(t *testing.T) {
			e := testkit.Engine(t, engine.Config{MaxInstances: 1})
			m := testkit.Manifest("partial")
			m.Constants = "zeros.bin"
			m.OutBytes = 64
			m.ZeroOut = tc.zeroOut
			m.Chain = []abi.Launch{{Kernel: "add_constants", Grid: 1, Block: 1}}
			testkit.Deploy(t, e, testkit.BundleDir(t, m, make([]byte, 64)))
			long := bytes.Repeat([]byte{0xAA}, 64)
			req := &call.Request{Input: long}
			if err := e.Invoke(context.Background(), "partial", req); err != nil || !bytes.Equal(req.Output, long) {
				t.Fatalf("long request: %v %x", err, req.Output)
			}
			req = &call.Request{Input: []byte{1, 2, 3}}
			if err := e.Invoke(context.Background(), "partial", req); err != nil {
				t.Fatal(err)
			}
			want := make([]byte, 64)
			copy(want, []byte{1, 2, 3})
			if tc.stale {
				copy(want[3:], long[3:])
			}
			if !bytes.Equal(req.Output, want) {
				t.Errorf("short request after a long one: %x, want %x", req.Output, want)
			}
		})
	}
}
