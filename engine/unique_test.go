package engine_test

import (
	"context"
	"encoding/binary"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/plover-run/plover/call"
	"github.com/plover-run/plover/engine"
	"github.com/plover-run/plover/errdefs"
	"github.com/plover-run/plover/internal/testkit"
)

// In the server's process (--isolation none), a function's next version
// whose library defines the GNU unique symbol its last one did is refused,
// saying why and what to do: it ran on the last one's object instead
// (value 1's state: 103 after 101, 102), the libraries never unmapped.
func TestInProcessNextVersionOfAUniqueSymbolIsRefused(t *testing.T) {
	e := testkit.Engine(t, engine.Config{})
	ctx := context.Background()
	invoke := func() (int32, error) {
		req := &call.Request{Input: []byte("x")}
		if err := e.Invoke(ctx, "uq", req); err != nil {
			return 0, err
		}
		return int32(binary.LittleEndian.Uint32(req.Output)), nil
	}
	// A name of this run's own: the loader's record of unique symbols
	// is the process's, kept across runs (-count).
	tag := strconv.FormatInt(time.Now().UnixNano(), 36)
	testkit.Deploy(t, e, uniqueBundle(t, tag, 1))
	for want := int32(101); want <= 102; want++ {
		if got, err := invoke(); err != nil || got != want {
			t.Fatalf("version 1: %d, %v; want %d", got, err, want)
		}
	}
	testkit.Deploy(t, e, uniqueBundle(t, tag, 2))
	got, err := invoke()
	if err == nil || !strings.Contains(err.Error(), "GNU unique symbol") || !strings.Contains(err.Error(), "-fno-gnu-unique") {
		t.Fatalf("version 2 answered %d, %v; want its load refused naming the symbol and -fno-gnu-unique", got, err)
	}
	if errdefs.KindOf(err) != errdefs.KindInvalid || strings.Contains(err.Error(), os.TempDir()) {
		t.Errorf("version 2: %v (kind %v); want a 422 that names no path of the node's", err, errdefs.KindOf(err))
	}
}

// uniqueBundle is function uq's bundle of testkit.UniqueSource.
func uniqueBundle(t *testing.T, tag string, value int) string {
	t.Helper()
	dir := t.TempDir()
	m := testkit.Manifest("uq")
	testkit.BuildLib(t, testkit.UniqueSource(t, tag, value), dir, m.Library)
	testkit.WriteManifest(t, dir, m)
	return dir
}
