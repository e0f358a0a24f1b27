package engine_test

import (
	"bytes"
	"context"
	"io"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/plover-run/plover/device"
	"github.com/plover-run/plover/engine"
	"github.com/plover-run/plover/errdefs"
	"github.com/plover-run/plover/internal/testkit"
	"github.com/plover-run/plover/objectstore"
)

// hookedStore runs its hook, once, right after the next read of key: what
// happens between a read and what its reader does next.
type hookedStore struct {
	objectstore.Store
	key  string
	hook atomic.Pointer[func()]
}

func (s *hookedStore) GetTagged(ctx context.Context, key string) (io.ReadCloser, objectstore.Info, error) {
	rc, info, err := s.Store.GetTagged(ctx, key)
	if err != nil || key != s.key {
		return rc, info, err
	}
	hook := s.hook.Swap(nil)
	if hook == nil {
		return rc, info, err
	}
	b, err := io.ReadAll(rc) // read before the hook changes the store
	rc.Close()
	if err != nil {
		return nil, info, err
	}
	(*hook)()
	return io.NopCloser(bytes.NewReader(b)), info, nil
}

// A function deleted between Logs' read of its record and its follower's
// start: Logs ends that follower and says the function is gone. Before,
// the follower was made after the delete had forgotten the name's output,
// on a fresh ring no Forget would close: the stream waited for ever (or
// carried the output of whatever was deployed next under the name).
func TestFollowOfAFunctionDeletedMeanwhile(t *testing.T) {
	fs, err := objectstore.NewFS(filepath.Join(t.TempDir(), "store"))
	if err != nil {
		t.Fatal(err)
	}
	store := &hookedStore{Store: fs, key: "functions/echo.json"}
	e := testkit.Engine(t, engine.Config{Store: store, Devices: []device.Device{keepsOutput{device.NewHost(0)}}})
	testkit.Deploy(t, e, testkit.BundleDir(t, testkit.Manifest("echo"), nil))
	deleted := make(chan error, 1)
	hook := func() { deleted <- e.Control().Delete(context.Background(), "echo", true) }
	store.hook.Store(&hook)

	_, f, err := e.Control().Logs(context.Background(), "echo", time.Time{}, true)
	select {
	case err := <-deleted:
		if err != nil {
			t.Fatalf("the delete between the read and the follow: %v", err)
		}
	default:
		t.Fatal("the hook did not run: Logs read no record")
	}
	if err == nil {
		defer f.Close()
		select {
		case _, open := <-f.C:
			if !open {
				return // ended: as good as refused
			}
		default:
		}
		t.Fatal("Logs of a function deleted while it started a follower: a follower that nothing will end")
	}
	if errdefs.KindOf(err) != errdefs.KindNotFound {
		t.Fatalf("Logs of a function deleted while it started a follower: %v, want not found", err)
	}
}
