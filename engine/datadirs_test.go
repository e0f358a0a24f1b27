package engine_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/plover-run/plover/bundle"
	"github.com/plover-run/plover/call"
	"github.com/plover-run/plover/engine"
	"github.com/plover-run/plover/errdefs"
	"github.com/plover-run/plover/internal/testkit"
	"github.com/plover-run/plover/internal/tmpfs"
	"github.com/plover-run/plover/objectstore"
)

// dataNode is an engine whose bundle cache and spool are under data, as
// plover serve's are, its store elsewhere, its log in log.
type dataNode struct {
	e     *engine.Engine
	data  string
	store objectstore.Store
	log   *testkit.LogBuffer
}

func newDataNode(t *testing.T, data string, store objectstore.Store) *dataNode {
	t.Helper()
	if store == nil {
		s, err := objectstore.NewFS(t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		store = s
	}
	cache, err := bundle.NewCache(filepath.Join(data, "cache"), 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	spool := filepath.Join(data, "spool")
	if err := os.MkdirAll(spool, 0o700); err != nil {
		t.Fatal(err)
	}
	log := &testkit.LogBuffer{}
	e := testkit.Engine(t, engine.Config{Store: store, Cache: cache, SpoolDir: spool, Log: slog.New(slog.NewTextHandler(log, nil))})
	return &dataNode{e: e, data: data, store: store, log: log}
}

// The bundle cache's or the spool's directory removed under a running
// server (a tmp cleaner, an operator's rm -rf) is made again, once, and
// cold starts and deploys go on. Before, every one failed until a restart
// (503 "cannot prepare its bundle on this node", "unpacking the bundle
// failed on this node (no such file or directory)", "spooling the bundle
// failed"), while the server said it was healthy. Where it cannot be made
// again (the data directory gone too), the 503 names the directory, by
// what it is for, and the errno, not its path.
func TestDataDirectoriesRemovedUnderTheServer(t *testing.T) {
	for _, tc := range []struct {
		name   string
		remove string // under the data directory ("." the whole)
		deploy bool   // else a cold start
		want   string // "": it works
	}{
		{"the cache, a cold start", "cache", false, ""},
		{"the cache, a deploy", "cache", true, ""},
		{"the spool, a deploy", "spool", true, ""},
		{"the data directory, a cold start", ".", false, "function dirs: cold start: the node's bundle cache directory was removed and could not be made again (no such file or directory; see the server log)"},
		{"the data directory, a deploy", ".", true, "deploy dirs: spooling the bundle failed on this node: the node's spool directory was removed and could not be made again (no such file or directory; see the server log)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := newDataNode(t, filepath.Join(t.TempDir(), "data"), nil)
			bdir := testkit.BundleDir(t, testkit.Manifest("dirs"), nil)
			testkit.Deploy(t, n.e, bdir) // its bundle in the cache, adopted
			if err := os.RemoveAll(filepath.Join(n.data, tc.remove)); err != nil {
				t.Fatal(err)
			}
			var err error
			if tc.deploy {
				_, err = n.e.Control().Deploy(context.Background(), "dirs", bytes.NewReader(packedAs(t, bdir, "dirs")), false)
			} else {
				err = n.e.Invoke(context.Background(), "dirs", &call.Request{Input: []byte("x")})
			}
			made := strings.Count(n.log.String(), "removed under it: made again")
			var de *errdefs.Error
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("after the %s directory was removed: %v", tc.remove, err)
			case tc.want == "" && made != 1:
				t.Errorf("the log says %d times that a directory was made again, want once:\n%s", made, n.log.String())
			case tc.want != "" && (!errors.As(err, &de) || de.Kind != errdefs.KindUnavailable || de.Msg != tc.want):
				t.Errorf("after the data directory was removed: %v (kind %v), want 503 %q", err, errdefs.KindOf(err), tc.want)
			case tc.want != "" && made != 0:
				t.Errorf("the log says a directory was made again, which none was:\n%s", n.log.String())
			}
			if tc.want == "" {
				invoke(t, n.e, "dirs", []byte("x"))
			}
		})
	}
}

// mountTmpfs mounts a tmpfs of size bytes on a directory of the test's,
// unmounted as the test ends.
func mountTmpfs(t *testing.T, size int) string {
	t.Helper()
	dir := t.TempDir()
	tmpfs.Mount(t, dir, strconv.Itoa(size))
	return dir
}

// fill writes a file into the file system at dir until it is full.
func fill(t *testing.T, dir string) {
	t.Helper()
	f, err := os.Create(filepath.Join(dir, "filler"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for zeros := make([]byte, 64<<10); ; {
		if _, err := f.Write(zeros); errors.Is(err, syscall.ENOSPC) {
			return
		} else if err != nil {
			t.Fatal(err)
		}
	}
}

// A cold start whose bundle cannot be written into this node's cache is
// told which stage failed and the errno, on a real file system: 503 for a
// read-only one, where it said only "cannot prepare its bundle on this
// node" (a deploy in the same state named the errno), 507 for a full one.
// Never the cache's path, which the log has.
func TestColdStartDiskFailureNamesTheStageAndErrno(t *testing.T) {
	store, err := objectstore.NewFS(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	fi := testkit.Deploy(t, testkit.Engine(t, engine.Config{Store: store}), testkit.BundleDir(t, testkit.Manifest("cold"), nil))
	for _, tc := range []struct {
		name string
		harm func(t *testing.T, mnt string)
		mend func(t *testing.T, mnt string)
		kind errdefs.Kind
		want string
	}{
		{"read-only", func(t *testing.T, mnt string) {
			if err := syscall.Mount("", mnt, "", syscall.MS_REMOUNT|syscall.MS_RDONLY, ""); err != nil {
				t.Fatal(err)
			}
		}, func(t *testing.T, mnt string) {
			if err := syscall.Mount("", mnt, "", syscall.MS_REMOUNT, ""); err != nil {
				t.Fatal(err)
			}
		}, errdefs.KindUnavailable, "function cold: cold start: fetching bundle " + fi.SHA256[:12] + " into the node's bundle cache failed (read-only file system; see the server log)"},
		{"full", fill, func(t *testing.T, mnt string) { os.Remove(filepath.Join(mnt, "filler")) },
			errdefs.KindNoSpace, "function cold: cold start: this node's disk is full: fetching bundle " + fi.SHA256[:12] + " into the node's bundle cache failed (no space left on device)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mnt := mountTmpfs(t, 4<<20)
			n := newDataNode(t, mnt, store)
			tc.harm(t, mnt)
			err := n.e.Invoke(context.Background(), "cold", &call.Request{Input: []byte("x")})
			var de *errdefs.Error
			switch {
			case !errors.As(err, &de) || de.Kind != tc.kind || de.Msg != tc.want:
				t.Errorf("%v (kind %v), want %v %q", err, errdefs.KindOf(err), tc.kind, tc.want)
			case !strings.Contains(n.log.String(), filepath.Join(mnt, "cache")):
				t.Errorf("the log does not name the cache's directory: %s", n.log.String())
			}
			tc.mend(t, mnt)
			invoke(t, n.e, "cold", []byte("x"))
		})
	}
}

// A full disk's lines are logged at most once a second per function, each
// saying how many of its function's were held back before it (not_logged):
// every cold start or deploy on a full disk fails, at its clients' rate,
// and 300 requests wrote 300 ERROR lines, past the front door's throttle,
// to a log that may be on that disk. One function's lines do not hold
// back another's.
func TestDiskFullLinesAreThrottledPerFunction(t *testing.T) {
	store, err := objectstore.NewFS(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	bdir := testkit.BundleDir(t, testkit.Manifest("cold"), nil)
	testkit.Deploy(t, testkit.Engine(t, engine.Config{Store: store}), bdir)
	packed := packedAs(t, testkit.BundleDir(t, testkit.Manifest("deploy"), nil), "deploy")
	mnt := mountTmpfs(t, 1<<20)
	n := newDataNode(t, mnt, store)
	fill(t, mnt)
	coldLine := regexp.MustCompile(`level=ERROR msg="cold start: this node's disk is full" function=cold .*`)
	deployLine := regexp.MustCompile(`level=ERROR msg="deploy: this node's files failed" function=deploy .*`)
	held := regexp.MustCompile(`not_logged=(\d+)`)
	coldHeld := regexp.MustCompile(`msg="cold start: this node's disk is full" function=cold .*not_logged=`)
	began := time.Now()
	requests := 0
	// Until a line says how many were held back before it: past a second.
	for !coldHeld.MatchString(n.log.String()) {
		if lines, most := strings.Count(n.log.String(), "level=ERROR"), 2*(int(time.Since(began)/time.Second)+1); lines > most {
			t.Fatalf("%d lines in %v for %d requests, want at most %d:\n%s", lines, time.Since(began), 2*requests, most, n.log.String())
		}
		if time.Since(began) > 15*time.Second {
			t.Fatalf("no cold start's line said what was held back in 15 s (%d requests):\n%s", requests, n.log.String())
		}
		requests++
		if err := n.e.Invoke(context.Background(), "cold", &call.Request{Input: []byte("x")}); errdefs.KindOf(err) != errdefs.KindNoSpace {
			t.Fatalf("a cold start on a full disk: %v, want 507", err)
		}
		if _, err := n.e.Control().Deploy(context.Background(), "deploy", bytes.NewReader(packed), false); errdefs.KindOf(err) != errdefs.KindNoSpace {
			t.Fatalf("a deploy on a full disk: %v, want 507", err)
		}
	}
	elapsed := time.Since(began)
	log := n.log.String()
	cold, deploys := coldLine.FindAllString(log, -1), deployLine.FindAllString(log, -1)
	most := int(elapsed/time.Second) + 1 // a line a second, the first at once
	logged := len(cold)
	for _, l := range cold {
		if m := held.FindStringSubmatch(l); m != nil {
			k, _ := strconv.Atoi(m[1])
			logged += k
		}
	}
	switch {
	case len(cold) > most || len(deploys) > most:
		t.Errorf("%d cold start lines and %d deploy lines in %v for %d requests of each, want at most %d of each", len(cold), len(deploys), elapsed, requests, most)
	case len(deploys) == 0:
		t.Errorf("the deploys' lines were held back by the cold starts' (another function's):\n%s", log)
	case logged != requests:
		t.Errorf("the cold starts' lines and their not_logged count %d requests, want %d:\n%s", logged, requests, log)
	}
}
