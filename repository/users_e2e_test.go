package repository_test

import (
	"context"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/plover-run/plover/engine"
	"github.com/plover-run/plover/httpapi"
	"github.com/plover-run/plover/internal/testkit"
	"github.com/plover-run/plover/repository"
)

// A pipeline's version folder that would take a pipeline running it past
// a limit (inner/2 from 16 to 17 steps under outer, 16 x inner: 272
// functions a request) is refused (409) naming outer, with advice the
// repository's operator can follow (no --force), and it waits for its
// folder or a load: it was packed, uploaded and refused again at every
// scan, and version 1 was made current meanwhile, under outer's feet. Once
// outer is gone, a load deploys it.
func TestAPipelineBreakingItsUsersWaitsForALoad(t *testing.T) {
	models := cnnModels(t, "1")
	copyFiles(t, testkit.PipelineDir(t, "inner", testkit.Repeat(8, "cnn")...), filepath.Join(models, "inner", "1"), "plover.json")
	copyFiles(t, testkit.PipelineDir(t, "inner", testkit.Repeat(16, "cnn")...), filepath.Join(models, "inner", "2"), "plover.json")
	ageAll(models)
	e := testkit.Engine(t, engine.Config{})
	var log testkit.LogBuffer
	r, err := repository.New(repository.Config{Dir: models, Poll: 0, Settle: 50 * time.Millisecond, Log: slog.New(slog.NewTextHandler(&log, nil))}, e.Control())
	if err != nil {
		t.Fatal(err)
	}
	url := testkit.Serve(t, e, httpapi.Options{Repository: r})
	ctx := context.Background()
	r.Scan(ctx)
	testkit.Deploy(t, e, testkit.PipelineDir(t, "outer", testkit.Repeat(16, "inner")...))

	next := filepath.Join(models, "inner", "2", "plover.json")
	if err := os.Remove(next); err != nil { // a link to the first copy's file
		t.Fatal(err)
	}
	copyFiles(t, testkit.PipelineDir(t, "inner", testkit.Repeat(17, "cnn")...), filepath.Dir(next), "plover.json")
	ageAll(models)
	for range 3 {
		r.Scan(ctx)
	}
	if n := strings.Count(log.String(), "a version is unavailable"); n != 1 {
		t.Errorf("the refused version was tried %d times in 3 scans, want once until its folder changes or a load:\n%s", n, log.String())
	}
	inner := func() (label string, steps int) {
		t.Helper()
		rec, err := e.Control().Versions(ctx, "inner")
		if err != nil {
			t.Fatal(err)
		}
		v, err := rec.CurrentVersion()
		if err != nil {
			t.Fatal(err)
		}
		return v.Label, len(v.Steps)
	}
	if label, steps := inner(); label != "2" || steps != 16 {
		t.Errorf("inner's current version: folder %s with %d steps, want 2 with 16 (what outer runs)", label, steps)
	}
	var st struct{ Reason string }
	for _, m := range postIndex(t, url, "") {
		if m.Name == "inner" && m.Version == "2" {
			st.Reason = m.Reason
		}
	}
	if !strings.Contains(st.Reason, "pipeline outer runs inner") || strings.Contains(st.Reason, "--force") || !strings.Contains(st.Reason, "load inner again") {
		t.Errorf("the index's reason for inner/2: %q, want outer named, a load advised, no --force", st.Reason)
	}
	load := func() (int, string) {
		resp, b := testkit.Post(t, "POST", url+"/v2/repository/models/inner/load", "", nil)
		return resp.StatusCode, string(b)
	}
	if code, b := load(); code != http.StatusConflict || !strings.Contains(b, "pipeline outer runs inner") {
		t.Errorf("load inner under outer: %d %s, want 409 naming outer", code, b)
	}
	if resp, b := testkit.Post(t, "DELETE", url+"/v1/functions/outer", "", nil); resp.StatusCode/100 != 2 {
		t.Fatalf("plover rm outer: %d %s", resp.StatusCode, b)
	}
	if code, b := load(); code != 200 {
		t.Fatalf("load inner once outer is gone: %d %s", code, b)
	}
	if label, steps := inner(); label != "2" || steps != 17 {
		t.Errorf("inner's current version after the load: folder %s with %d steps, want 2 with 17", label, steps)
	}
}
