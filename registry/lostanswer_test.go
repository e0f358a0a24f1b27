package registry

import (
	"bytes"
	"context"
	"io"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/bundle"
	"github.com/plover-run/plover/objectstore"
)

// lostAnswer is a store whose next conditional write of a record lands and
// then answers ErrPrecondition: S3's client sending again a PUT the store
// committed, whose answer the connection lost, and getting 412 for it.
type lostAnswer struct {
	objectstore.Store
	armed atomic.Bool
}

func (s *lostAnswer) PutIf(ctx context.Context, key string, r io.Reader, size int64, ifMatch string) error {
	if err := s.Store.PutIf(ctx, key, r, size, ifMatch); err != nil || !s.armed.CompareAndSwap(true, false) {
		return err
	}
	return objectstore.ErrPrecondition
}

// A deploy whose record write landed but whose answer was lost makes one
// version, and says it made it: the round update runs again finds its own
// version in the record, where a fresh id each round made a second version
// (forced), or took the bytes for unchanged and said none was made.
func TestALostAnswerMakesOneVersion(t *testing.T) {
	store := &lostAnswer{Store: newFS(t)}
	g := Registry{Store: store}
	m := &abi.Manifest{Name: "fn", Priority: "default"}
	const body = "bundle bytes"
	sha := bundle.Digest([]byte(body))
	for _, force := range []bool{false, true} {
		store.armed.Store(true)
		before := 0
		if r, err := g.Get(context.Background(), "fn"); err == nil {
			before = len(r.Versions)
		}
		p, err := g.PublishWith(context.Background(), m, strings.NewReader(body), sha, int64(len(body)), PublishOptions{Force: force})
		if err != nil {
			t.Fatalf("force %v: %v", force, err)
		}
		if store.armed.Load() {
			t.Fatalf("force %v: the lost answer was not played", force)
		}
		r, err := g.Get(context.Background(), "fn")
		if err != nil {
			t.Fatal(err)
		}
		if !p.Created || !p.Current || len(r.Versions) != before+1 || r.Current != p.Version.ID || r.Versions[before].ID != p.Version.ID {
			var ids bytes.Buffer
			for _, v := range r.Versions {
				ids.WriteString(" " + v.ID)
			}
			t.Errorf("force %v: created %v, current %v, version %s; the record's versions:%s (current %s), want %d, the last the one made and current", force, p.Created, p.Current, p.Version.ID, ids.String(), r.Current, before+1)
		}
	}
}
