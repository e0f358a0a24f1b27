package registry

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/bundle"
)

// A labelled version published while an unlabelled one is current (a model
// repository taking over a plover deploy, or a hot-fix over its own)
// records that version (Over); no other does: a record the repository
// began, or one whose labels it took off itself, has none.
func TestOverMarksATakeOverOnly(t *testing.T) {
	for _, tc := range []struct {
		name    string
		labels  []string // published in order ("": a plover deploy)
		over    []int    // each version's Over, as the index of the version it names (-1: none)
		unlabel string   // taken off after the first two, before the rest ("": none)
	}{
		{"a plover deploy taken over", []string{"", "1", "2"}, []int{-1, 0, -1}, ""},
		{"the repository's own", []string{"1", "2"}, []int{-1, -1}, ""},
		{"the repository's own, a label taken off", []string{"1", "2", "3"}, []int{-1, -1, -1}, "1"},
		{"plover deploys only", []string{"", ""}, []int{-1, -1}, ""},
		{"a hot-fix over the repository's", []string{"1", "", "2"}, []int{-1, -1, 1}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := Registry{Store: newFS(t)}
			ctx := context.Background()
			ids := publishLabelled(t, &g, tc.labels[:min(2, len(tc.labels))]...)
			if tc.unlabel != "" {
				if _, _, err := g.Unlabel(ctx, "fn", tc.unlabel); err != nil {
					t.Fatal(err)
				}
			}
			if len(tc.labels) > 2 {
				ids = append(ids, publishLabelled(t, &g, tc.labels[2:]...)...)
			}
			r, err := g.Get(ctx, "fn")
			if err != nil {
				t.Fatal(err)
			}
			for i, v := range r.Versions {
				want := ""
				if tc.over[i] >= 0 {
					want = ids[tc.over[i]]
				}
				if v.Over != want {
					t.Errorf("version %d (label %q): over %q, want %q", i, v.Label, v.Over, want)
				}
			}
		})
	}
}

// bodies numbers publishLabelled's bundles.
var bodies atomic.Int64

// publishLabelled publishes a version of fn under each label in turn
// ("": a plover deploy's), each of other bytes, and returns their ids.
func publishLabelled(t *testing.T, g *Registry, labels ...string) []string {
	t.Helper()
	var ids []string
	for _, l := range labels {
		body := fmt.Sprintf("bundle %d", bodies.Add(1)) // other bytes each time
		p, err := g.PublishWith(context.Background(), &abi.Manifest{Name: "fn", Priority: "default"}, strings.NewReader(body),
			bundle.Digest([]byte(body)), int64(len(body)), PublishOptions{Label: l})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, p.Version.ID)
	}
	return ids
}
