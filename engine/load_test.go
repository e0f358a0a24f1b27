package engine_test

import (
	"context"
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/plover-run/plover/call"
	"github.com/plover-run/plover/engine"
	"github.com/plover-run/plover/errdefs"
	"github.com/plover-run/plover/internal/testkit"
	"github.com/plover-run/plover/objectstore"
)

// A library that passes the static checks but cannot be loaded on this node
// (a dependency missing here) is refused with the loader's reason, naming
// the library by its name in the bundle, not by its path in the node cache.
func TestUnloadableLibraryIsNamedByBundleFile(t *testing.T) {
	m := testkit.Manifest("fn")
	e := testkit.Engine(t, engine.Config{})
	testkit.Deploy(t, e, testkit.UnloadableBundleDir(t, m))
	err := e.Invoke(context.Background(), "fn", &call.Request{Input: []byte("x")})
	var re *errdefs.Error
	if !errors.As(err, &re) || re.Kind != errdefs.KindInvalid {
		t.Fatalf("invoke: %v, want KindInvalid", err)
	}
	for _, want := range []string{"library kernels.so:", "dlopen failed", "libploverdep.so"} {
		if !strings.Contains(re.Msg, want) {
			t.Errorf("message %q lacks %q", re.Msg, want)
		}
	}
	if strings.Contains(re.Msg, "cache") {
		t.Errorf("message %q shows the node's cache path", re.Msg)
	}
}

// downStore fails every read with a cause the client should see.
type downStore struct {
	objectstore.Store
	down bool
}

var errDown = errors.New("endpoint unreachable (http://127.0.0.1:9): connection refused")

func (s *downStore) Get(ctx context.Context, key string) (io.ReadCloser, error) {
	if s.down {
		return nil, errDown
	}
	return s.Store.Get(ctx, key)
}

func (s *downStore) List(ctx context.Context, prefix string) ([]objectstore.Info, error) {
	if s.down {
		return nil, errDown
	}
	return s.Store.List(ctx, prefix)
}

// A store outage is a 503 that says what failed, for a cold start and for
// a listing alike.
func TestStoreOutageMessagesCarryTheCause(t *testing.T) {
	fs, err := objectstore.NewFS(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	store := &downStore{Store: fs}
	deployer := testkit.Engine(t, engine.Config{Store: store})
	testkit.Deploy(t, deployer, testkit.BundleDir(t, testkit.Manifest("fn"), nil))
	node := testkit.Engine(t, engine.Config{Store: store}) // has never loaded fn
	store.down = true
	ctx := context.Background()
	_, listErr := node.Control().Functions(ctx)
	for what, err := range map[string]error{
		"cold invoke": node.Invoke(ctx, "fn", &call.Request{Input: []byte("x")}),
		"list":        listErr,
	} {
		var re *errdefs.Error
		if !errors.As(err, &re) || re.Kind != errdefs.KindUnavailable || !strings.Contains(re.Msg, "endpoint unreachable") {
			t.Errorf("%s: %v, want a 503 whose message names the cause", what, err)
		}
	}
}
