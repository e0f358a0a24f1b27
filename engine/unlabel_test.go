package engine_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"sync/atomic"
	"testing"
	"time"

	"github.com/plover-run/plover/bundle"
	"github.com/plover-run/plover/call"
	"github.com/plover-run/plover/engine"
	"github.com/plover-run/plover/internal/testkit"
	"github.com/plover-run/plover/objectstore"
	"github.com/plover-run/plover/registry"
)

// cutStore is a store whose next conditional write, once armed, lands and
// then fails as a connection cut after the store committed it would.
type cutStore struct {
	objectstore.Store
	armed atomic.Bool
}

func (s *cutStore) PutIf(ctx context.Context, key string, r io.Reader, size int64, ifMatch string) error {
	if err := s.Store.PutIf(ctx, key, r, size, ifMatch); err != nil || !s.armed.CompareAndSwap(true, false) {
		return err
	}
	return errors.New("connection reset by peer")
}

// Unlabel unloads this node's pinned versions that carried the label
// however the store's write went: where its answer was lost after it
// landed (an error, and the repository's next scan finds the label gone
// and does not call again), and where the label was already off (another
// node's call). Before, only a call that took the label off itself did,
// and a removed version folder kept answering by its number here.
func TestUnlabelUnloadsThePinnedVersionWhateverTheStoreSaid(t *testing.T) {
	for _, tc := range []struct {
		name    string
		before  func(t *testing.T, s *cutStore)
		wantErr bool
	}{
		{"the write answered", func(*testing.T, *cutStore) {}, false},
		{"the write landed, its answer lost", func(_ *testing.T, s *cutStore) { s.armed.Store(true) }, true},
		{"another node took it off", func(t *testing.T, s *cutStore) {
			if _, n, err := (registry.Registry{Store: s}).Unlabel(context.Background(), "fn", "1"); err != nil || n != 1 {
				t.Fatalf("the other node's unlabel: n %d, %v", n, err)
			}
		}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fs, err := objectstore.NewFS(t.TempDir())
			if err != nil {
				t.Fatal(err)
			}
			store := &cutStore{Store: fs}
			e := testkit.Engine(t, engine.Config{Store: store})
			ctx := context.Background()
			m := testkit.Manifest("fn")
			deploy := func(label string) string {
				t.Helper()
				b, _, _, err := bundle.PackBytes(testkit.BundleDir(t, m, nil))
				if err != nil {
					t.Fatal(err)
				}
				fi, err := e.Control().DeployLabeled(ctx, "fn", label, false, bytes.NewReader(b))
				if err != nil {
					t.Fatal(err)
				}
				m.Chain = append(m.Chain, m.Chain[0]) // the next is another bundle
				return fi.Version
			}
			v1 := deploy("1")
			deploy("2")
			p, err := e.PinVersion(ctx, "fn", v1, time.Time{})
			if err != nil {
				t.Fatal(err)
			}
			if err := p.Invoke(ctx, &call.Request{Input: []byte("x")}); err != nil {
				t.Fatal(err)
			}
			p.Release()
			if fi, _ := e.Control().Function(ctx, "fn"); fi.Idle != 1 {
				t.Fatalf("v1 pinned: idle %d, want its instance", fi.Idle)
			}
			tc.before(t, store)
			err = e.Control().Unlabel(ctx, "fn", "1")
			if (err != nil) != tc.wantErr {
				t.Fatalf("Unlabel: %v, want an error %v", err, tc.wantErr)
			}
			if fi, _ := e.Control().Function(ctx, "fn"); fi.Idle != 0 {
				t.Errorf("after Unlabel: idle %d, want v1's instance unloaded", fi.Idle)
			}
			if _, err := e.PinVersion(ctx, "fn", "1", time.Time{}); err == nil && !tc.wantErr {
				t.Errorf("label 1 still pins a version")
			}
		})
	}
}
