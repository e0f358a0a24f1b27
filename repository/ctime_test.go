package repository

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/plover-run/plover/errdefs"
)

// This package's tests age folders with os.Chtimes to have them at rest,
// which sets their status change times to now: changedAt reads only
// modification times for them, but for the test below.
func init() { statusTimes = false }

// A copy that keeps its source's times (cp -a) writes modification times
// from the past; its status change times say it was just written. Neither
// a load nor the first scan at start takes it for settled (both did: a
// copy in progress deployed what was there so far).
func TestACopyKeepingItsTimesIsNotSettled(t *testing.T) {
	statusTimes = true
	defer func() { statusTimes = false }()
	models := filepath.Join(t.TempDir(), "models")
	writeBundle(t, filepath.Join(models, "cnn", "1"), "cnn", false) // aged: a minute back, as cp -a leaves it
	node := newFakeNode()
	// Settled by its modification times (a minute back), not by its status
	// change times (now).
	r, err := New(Config{Dir: models, Poll: time.Hour, Settle: 10 * time.Second}, node)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if err := r.Load(ctx, "cnn"); errdefs.KindOf(err) != errdefs.KindTimeout || !strings.Contains(err.Error(), "while its folder settled") {
		t.Errorf("load of a copy just made with old times: %v, want 504 while its folder settled", err)
	}
	r.Scan(context.Background())
	if got := index(r); !strings.Contains(got, "cnn/ LOADING") && !strings.Contains(got, "cnn LOADING") {
		t.Errorf("index after the first scan: %s, want cnn LOADING", got)
	}
	if c := node.current("cnn"); c != "" {
		t.Errorf("deployed version %q of a copy in progress", c)
	}
}
