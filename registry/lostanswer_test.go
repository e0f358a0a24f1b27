package registry

import (
	"bytes"
	"context"
	"io"
	"slices"
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

// An unlabel whose record write landed but whose answer was lost still
// says how many versions it took the label off. The round update runs
// again finds the label already gone and, before, counted none: the
// engine unloads this node's versions pinned under the label only when
// some were (Control.Unlabel), so a retired version folder kept answering
// by its number here. Called again afterwards, nothing is left to take
// off: n is 0, and no write is made.
func TestUnlabelAfterALostAnswerCountsWhatItTookOff(t *testing.T) {
	for _, tt := range []struct {
		name   string
		labels []string // deployed in turn, each made current: the last is
		label  string
		lost   bool // the write's answer is lost (412 for a PUT that landed)
		again  bool // Unlabel is called a second time, after the first
		n      int
		wrote  bool     // a record write was made (the armed loss was played)
		left   []string // the labels after, in the record's order
	}{
		{name: "answered", labels: []string{"1", "2", "3"}, label: "1",
			n: 1, wrote: true, left: []string{"", "2", "3"}},
		{name: "answer lost", labels: []string{"1", "2", "3"}, label: "1", lost: true,
			n: 1, wrote: true, left: []string{"", "2", "3"}},
		{name: "answer lost, a folder deployed twice", labels: []string{"2", "1", "2", "3"}, label: "2", lost: true,
			n: 2, wrote: true, left: []string{"", "1", "", "3"}},
		{name: "only the current version has it", labels: []string{"1", "2", "3"}, label: "3", lost: true,
			n: 0, wrote: false, left: []string{"1", "2", "3"}},
		{name: "called again after a lost answer", labels: []string{"1", "2", "3"}, label: "1", lost: true, again: true,
			n: 0, wrote: true, left: []string{"", "2", "3"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			store := &lostAnswer{Store: newFS(t)}
			g := Registry{Store: store}
			ctx := context.Background()
			ids := publishLabelled(t, &g, tt.labels...)
			store.armed.Store(tt.lost)
			current, n, err := g.Unlabel(ctx, "fn", tt.label)
			if tt.again {
				current, n, err = g.Unlabel(ctx, "fn", tt.label)
			}
			if err != nil {
				t.Fatalf("Unlabel: %v", err)
			}
			if tt.lost && store.armed.Load() == tt.wrote {
				t.Fatalf("a write made: %v, want %v", !store.armed.Load(), tt.wrote)
			}
			want := ids[len(ids)-1]
			if current != want || n != tt.n {
				t.Errorf("Unlabel %q: current %s, n %d; want current %s, n %d", tt.label, current, n, want, tt.n)
			}
			r, err := g.Get(ctx, "fn")
			if err != nil {
				t.Fatal(err)
			}
			var left []string
			for _, v := range r.Versions {
				left = append(left, v.Label)
			}
			if !slices.Equal(left, tt.left) || r.Current != want {
				t.Errorf("the record's labels %q (current %s), want %q (current %s)", left, r.Current, tt.left, want)
			}
		})
	}
}
