package repository

import (
	"context"
	"os"
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

// With status change times read (the server's way): a folder at rest
// deploys once its files have been still for the settle time, and a change
// of a file's mode alone (a chown -R loop, a hard-link backup) holds a scan
// no longer than that and deploys nothing again: the folder's contents are
// what was deployed.
func TestAMetadataChangeDeploysNothingAgain(t *testing.T) {
	const settle = 50 * time.Millisecond
	models, node, r := deployedWithStatusTimes(t, settle)
	changed := time.Now()
	if err := os.Chmod(filepath.Join(models, "cnn", "1", "b.bin"), 0o600); err != nil {
		t.Fatal(err)
	}
	if n := scanFor(r, node, changed, 4*settle); n != 1 {
		t.Errorf("after a mode change alone: %d deploys, want 1", n)
	}
	if got := index(r); !strings.Contains(got, "READY") {
		t.Errorf("index after a mode change alone: %s, want cnn READY", got)
	}
}

// scanFor scans r until d has passed since from, a fifth of its settle
// time apart, and reports the deploys node had.
func scanFor(r *Repository, node *fakeNode, from time.Time, d time.Duration) int {
	for time.Since(from) < d {
		r.Scan(context.Background())
		time.Sleep(r.cfg.Settle / 5)
	}
	r.Scan(context.Background())
	node.mu.Lock()
	defer node.mu.Unlock()
	return node.deploys
}

// New weights written in place with the size and the modification time
// the old had (tar with SOURCE_DATE_EPOCH, cp -p of a reproducible build's
// tree) are deployed: the folder's fingerprint had names, sizes and
// modification times alone, so the running server kept the old bytes
// while a restart, packing afresh, deployed the new.
func TestARewriteKeepingSizeAndTimeIsDeployed(t *testing.T) {
	const settle = 50 * time.Millisecond
	models, node, r := deployedWithStatusTimes(t, settle)
	consts := filepath.Join(models, "cnn", "1", "b.bin")
	fi, err := os.Stat(consts)
	if err != nil {
		t.Fatal(err)
	}
	changed := time.Now()
	if err := os.WriteFile(consts, []byte("CONSTANTS"), 0o644); err != nil { // "constants"' length
		t.Fatal(err)
	}
	if err := os.Chtimes(consts, fi.ModTime(), fi.ModTime()); err != nil {
		t.Fatal(err)
	}
	n := scanFor(r, node, changed, 4*settle)
	node.mu.Lock()
	got := node.consts["cnn"]
	node.mu.Unlock()
	if n != 2 || got != "CONSTANTS" {
		t.Errorf("after a rewrite keeping size and time: %d deploys, constants %q, want 2 and the new bytes (%s)", n, got, index(r))
	}
}

// deployedWithStatusTimes is a repository of one model, cnn/1/, read with
// status change times (the server's way), at rest and deployed by its
// scans: once its files were still for settle.
func deployedWithStatusTimes(t *testing.T, settle time.Duration) (models string, node *fakeNode, r *Repository) {
	t.Helper()
	statusTimes = true
	t.Cleanup(func() { statusTimes = false })
	models = filepath.Join(t.TempDir(), "models")
	writeBundle(t, filepath.Join(models, "cnn", "1"), "cnn", false)
	node = newFakeNode()
	r, err := New(Config{Dir: models, Settle: settle}, node)
	if err != nil {
		t.Fatal(err)
	}
	for end := time.Now().Add(10 * time.Second); node.current("cnn") == "" && time.Now().Before(end); {
		scanFor(r, node, time.Now(), settle)
	}
	if n := scanFor(r, node, time.Now(), 0); n != 1 || node.current("cnn") == "" {
		t.Fatalf("a folder at rest: %d deploys, current %q, want 1 (%s)", n, node.current("cnn"), index(r))
	}
	return models, node, r
}

// An unloaded model stays unloaded through a change of its files' modes
// alone (a chmod, a chown, a hard link: status change times): an unload
// ends with a change of what the folder holds, or a load.
func TestAnUnloadOutlivesAChmod(t *testing.T) {
	const settle = 50 * time.Millisecond
	models, node, r := deployedWithStatusTimes(t, settle)
	if err := r.Unload(context.Background(), "cnn"); err != nil {
		t.Fatal(err)
	}
	changed := time.Now()
	if err := os.Chmod(filepath.Join(models, "cnn", "1", "b.bin"), 0o600); err != nil {
		t.Fatal(err)
	}
	if n := scanFor(r, node, changed, 4*settle); n != 1 || !strings.Contains(index(r), "unloaded") {
		t.Errorf("an unloaded model after a mode change alone: %d deploys, index %s; want 1 and unloaded", n, index(r))
	}
}
