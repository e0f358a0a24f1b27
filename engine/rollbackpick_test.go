package engine_test

import (
	"bytes"
	"context"
	"io"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/plover-run/plover/bundle"
	"github.com/plover-run/plover/engine"
	"github.com/plover-run/plover/internal/testkit"
	"github.com/plover-run/plover/objectstore"
)

// readHook runs hook once, armed, after a read of key: a write landing
// between two reads of the same record.
type readHook struct {
	objectstore.Store
	key   string
	armed atomic.Bool
	hook  func()
}

func (s *readHook) GetTagged(ctx context.Context, key string) (io.ReadCloser, objectstore.Info, error) {
	rc, info, err := s.Store.GetTagged(ctx, key)
	if key == s.key && s.armed.CompareAndSwap(true, false) {
		s.hook()
	}
	return rc, info, err
}

// A rollback makes current the version it checked: a version deployed
// under the same label between the check's read of the record and the
// store's update was made current unchecked (the update resolved the
// label again; a review found it). Pipelines are checked so
// (checkRollback); a plain function shows which version the update took.
func TestARollbackMakesCurrentTheVersionItChecked(t *testing.T) {
	fs, err := objectstore.NewFS(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	store := &readHook{Store: fs, key: "functions/p.json"}
	e := testkit.Engine(t, engine.Config{Store: store})
	ctx := context.Background()
	testkit.Deploy(t, e, testkit.BundleDir(t, testkit.Manifest("f"), nil))
	deploy := func(label string, steps ...any) string {
		t.Helper()
		b, _, _, err := bundle.PackBytes(testkit.PipelineDir(t, "p", steps...))
		if err != nil {
			t.Fatal(err)
		}
		fi, err := e.Control().DeployLabeled(ctx, "p", label, label == "1", bytes.NewReader(b))
		if err != nil {
			t.Fatalf("deploy p as %s: %v", label, err)
		}
		return fi.Version
	}
	checked := deploy("1", "f")
	deploy("2", "f", "f")
	store.hook = func() { deploy("1", "f", "f", "f") }
	store.armed.Store(true)
	fi, err := e.Control().Rollback(ctx, "p", "1")
	if err != nil {
		t.Fatal(err)
	}
	if store.armed.Load() {
		t.Fatal("the rollback read p's record no time: the test's window is not there")
	}
	if fi.Version != checked {
		t.Errorf("rollback to label 1 made %s current, want %s, the version its check read", fi.Version, checked)
	}
}

// A rollback is checked against the pipelines running its function, as a
// deploy is, but never refused for them: an older version may nest
// deeper or run more functions than the one current, and what it breaks
// comes back as a warning (a review found rollbacks unchecked so; the
// README keeps them unblocked).
func TestARollbackPastItsUsersWarns(t *testing.T) {
	e := testkit.Engine(t, engine.Config{})
	testkit.Deploy(t, e, testkit.BundleDir(t, testkit.Manifest("f"), nil))
	wide := testkit.Deploy(t, e, testkit.PipelineDir(t, "inner", testkit.Repeat(17, "f")...))
	narrow := testkit.Deploy(t, e, testkit.PipelineDir(t, "inner", "f"))
	testkit.Deploy(t, e, testkit.PipelineDir(t, "outer", testkit.Repeat(16, "inner")...)) // 16 functions; 272 with wide
	fi, err := e.Control().Rollback(context.Background(), "inner", wide.Version)
	if err != nil {
		t.Fatalf("rollback of inner to its 17-step version: %v", err)
	}
	if fi.Version != wide.Version || len(fi.Warnings) != 1 || !strings.HasPrefix(fi.Warnings[0], "rolled back: ") || !strings.Contains(fi.Warnings[0], "outer") {
		t.Errorf("rollback: version %s, warnings %q; want %s and one warning naming outer", fi.Version, fi.Warnings, wide.Version)
	}
	// Back within the limit: nothing to say.
	fi, err = e.Control().Rollback(context.Background(), "inner", narrow.Version)
	if err != nil || len(fi.Warnings) != 0 {
		t.Errorf("rollback of inner to its 1-step version: %v, warnings %q", err, fi.Warnings)
	}
}
