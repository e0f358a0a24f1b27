package minio

import (
	"context"
	"fmt"
	"os"
	"sync"
	"testing"
)

var (
	installOnce sync.Once
	installBin  string
	installErr  error
)

// Start runs a MinIO server for the test and stops it when the test and its
// subtests end, pass or fail. If MinIO cannot be installed the test is
// skipped with a loud message, unless PLOVER_REQUIRE_MINIO=1, as CI sets
// after installing it up front, turns that into a failure.
func Start(t testing.TB) *Server {
	t.Helper()
	bin := InstallForTest(t)
	s, err := Launch(context.Background(), bin, t.TempDir())
	if err != nil {
		t.Fatalf("start MinIO: %v", err)
	}
	// Registered after TempDir, so it runs before the directory is removed.
	t.Cleanup(func() {
		s.Stop()
		if t.Failed() {
			t.Logf("MinIO log (%s):\n%s", s.Endpoint, tail(s.Log(), 8000))
		}
	})
	return s
}

// InstallForTest returns the MinIO binary, installing it once per process,
// or skips (or fails, see Start) the test.
func InstallForTest(t testing.TB) string {
	t.Helper()
	installOnce.Do(func() {
		// Stderr shows the one-line notice of a first build, which would
		// otherwise look like a hung test for minutes.
		installBin, installErr = Install(context.Background(), os.Stderr)
	})
	if installErr != nil {
		msg := fmt.Sprintf("\n\n*** SKIPPING S3 TESTS: cannot install MinIO %s: %v ***\n\n", Release, installErr)
		if os.Getenv("PLOVER_REQUIRE_MINIO") == "1" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	return installBin
}

// MustCreateBucket creates a bucket or fails the test.
func (s *Server) MustCreateBucket(t testing.TB, name string) {
	t.Helper()
	if err := s.CreateBucket(context.Background(), name); err != nil {
		t.Fatal(err)
	}
}
