package repository

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/plover-run/plover/internal/tmpfs"
)

// scanEmptied scans r as Run does a DIR emptied of its model folders while
// models are deployed: once, which takes nothing for removed (heldBack),
// and again a poll later (Settle without Poll), which removes them. It
// says what the second scan said.
func scanEmptied(ctx context.Context, r *Repository) bool {
	r.Scan(ctx)
	if !r.emptySince.IsZero() {
		r.emptySince = r.emptySince.Add(-max(r.cfg.Poll, r.cfg.Settle)) // the poll passed
	}
	return r.Scan(ctx)
}

// A scan that finds DIR with no model folder while models are deployed
// deletes nothing unless a scan a poll later finds it so too on the
// device the last scan that found a folder saw; a scan that finds DIR on
// another device takes no folder missing for removed. An unmounted
// repository volume left DIR an empty mountpoint, and the next scan
// deleted every model's function record from the store (every node
// sharing it lost them; the remount deployed them anew, history lost).
func TestAnEmptiedRepository(t *testing.T) {
	const poll = time.Hour
	cases := []struct {
		name string
		// take does to DIR (a bind mount of vol, a tmpfs) what the case
		// is about, then scans as Run would.
		take func(t *testing.T, ctx context.Context, r *Repository, dir, vol string)
		want []string // the functions deleted
		log  string   // what the log says
	}{
		{"volume unmounted, scans a poll apart", func(t *testing.T, ctx context.Context, r *Repository, dir, _ string) {
			unmount(t, dir)
			scanEmptied(ctx, r)
			scanEmptied(ctx, r)
		}, nil, "no model folder found while models are deployed"},
		{"volume unmounted and mounted again", func(t *testing.T, ctx context.Context, r *Repository, dir, vol string) {
			unmount(t, dir)
			scanEmptied(ctx, r)
			bind(t, vol, dir)
			scanEmptied(ctx, r)
		}, nil, "on another device than at the last scan"},
		{"emptied, scanned again within a poll", func(t *testing.T, ctx context.Context, r *Repository, dir, _ string) {
			removeFolders(t, dir, "a", "b")
			r.Scan(ctx)
			if !r.Scan(ctx) {
				t.Error("a scan that took nothing for removed does not ask to scan again (Run without Poll would not)")
			}
		}, nil, "no model folder found while models are deployed"},
		{"emptied, scanned again a poll later", func(t *testing.T, ctx context.Context, r *Repository, dir, _ string) {
			removeFolders(t, dir, "a", "b")
			scanEmptied(ctx, r)
		}, []string{"a", "b"}, "no model folder found while models are deployed"},
		{"another volume with one of the folders", func(t *testing.T, ctx context.Context, r *Repository, dir, _ string) {
			other := filepath.Join(t.TempDir(), "other")
			tmpfs.Mount(t, other, "4m")
			writeBundle(t, filepath.Join(other, "b", "1"), "b", false)
			age(t, other)
			unmount(t, dir)
			bind(t, other, dir)
			r.Scan(ctx)
			if d := deleted(r); len(d) != 0 {
				t.Errorf("the scan that found another device deleted %v", d)
			}
			r.Scan(ctx) // the same device again: a is gone
		}, []string{"a"}, "on another device than at the last scan"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ctx := context.Background()
			d := t.TempDir()
			vol, dir := filepath.Join(d, "vol"), filepath.Join(d, "models")
			tmpfs.Mount(t, vol, "4m")
			for _, n := range []string{"a", "b"} {
				writeBundle(t, filepath.Join(vol, n, "1"), n, false)
			}
			age(t, vol)
			bind(t, vol, dir)
			var log bytes.Buffer
			node := newFakeNode()
			r, err := New(Config{Dir: dir, Poll: poll, Settle: time.Millisecond, Log: slog.New(slog.NewTextHandler(&log, nil))}, node)
			if err != nil {
				t.Fatal(err)
			}
			r.Scan(ctx)
			if got := index(r); got != "a/1 READY; b/1 READY; " {
				t.Fatalf("start: %s", got)
			}
			deploys := node.deploys
			c.take(t, ctx, r, dir, vol)
			if c.want == nil && node.deploys != deploys {
				t.Errorf("%d deploys since the start; want none", node.deploys-deploys)
			}
			node.mu.Lock()
			got := slices.Sorted(slices.Values(node.deletes))
			node.mu.Unlock()
			if !slices.Equal(got, c.want) {
				t.Errorf("deleted %v, want %v; index %s\nlog:\n%s", got, c.want, index(r), log.String())
			}
			for _, n := range []string{"a", "b"} {
				if kept := !slices.Contains(c.want, n); kept && node.current(n) != "1" {
					t.Errorf("%s: current %q, want version 1 still", n, node.current(n))
				}
			}
			if !strings.Contains(log.String(), c.log) {
				t.Errorf("the log does not say %q:\n%s", c.log, log.String())
			}
			if n := strings.Count(log.String(), "no model folder found"); n > 1 {
				t.Errorf("said %d times, want once:\n%s", n, log.String())
			}
		})
	}
}

// deleted is what r's node deleted so far.
func deleted(r *Repository) []string {
	n := r.node.(*fakeNode)
	n.mu.Lock()
	defer n.mu.Unlock()
	return slices.Clone(n.deletes)
}

func removeFolders(t *testing.T, dir string, names ...string) {
	t.Helper()
	for _, n := range names {
		if err := os.RemoveAll(filepath.Join(dir, n)); err != nil {
			t.Fatal(err)
		}
	}
}

// bind mounts from at to (made), as a volume mounted there, until the
// test's end.
func bind(t *testing.T, from, to string) {
	t.Helper()
	if err := os.MkdirAll(to, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount(from, to, "", unix.MS_BIND, ""); err != nil {
		t.Skipf("cannot bind %s at %s (the test needs root): %v", from, to, err)
	}
	t.Cleanup(func() { unix.Unmount(to, unix.MNT_DETACH) })
}

// unmount unmounts dir lazily, as umount -l does.
func unmount(t *testing.T, dir string) {
	t.Helper()
	if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil {
		t.Fatal(err)
	}
}
